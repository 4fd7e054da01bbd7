"""The schedulers' real CRDs (../shared/schemas, and tests/data/schemas for those it lacks) and the check that an
emitted object is valid against its CRD's openAPIV3Schema, for every test that emits scheduler objects."""
from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

SCHEMAS = Path(__file__).resolve().parents[2] / "shared" / "schemas"
CRDS = ["kai-queue-crd.yaml", "kueue-clusterqueues.yaml", "kueue-cohorts.yaml", "kueue-localqueues.yaml", "kueue-resourceflavors.yaml",
        "volcano-queue-crd.yaml"]
# the CRDs shared/schemas lacks, copied into the repo (tests/data/schemas/README.md says from where)
OWN_SCHEMAS = Path(__file__).resolve().parent / "data" / "schemas"
OWN_CRDS = ["kueue-topologies.yaml", "kai-topology-crd.yaml"]


def crd_schemas() -> dict[tuple[str, str, str], dict]:
    """(group, version, kind) -> openAPIV3Schema, from every CRD in shared/schemas and tests/data/schemas; the
    schema's `x-scope` is the CRD's scope (Cluster or Namespaced)."""
    if not SCHEMAS.is_dir():
        pytest.skip(f"the schedulers' CRDs are not at {SCHEMAS} (shared/ sits beside the checkout in CI)")
    out = {}
    for path in [SCHEMAS / name for name in CRDS] + [OWN_SCHEMAS / name for name in OWN_CRDS]:
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            out[(crd["spec"]["group"], version["name"], crd["spec"]["names"]["kind"])] = \
                {**version["schema"]["openAPIV3Schema"], "x-scope": crd["spec"]["scope"]}
    return out


def assert_valid(objects: list[dict]) -> None:
    schemas = crd_schemas()
    for obj in objects:
        group, version = obj["apiVersion"].split("/")
        schema = schemas.get((group, version, obj["kind"]))
        assert schema is not None, f"no CRD for {obj['apiVersion']} {obj['kind']}"
        jsonschema.Draft7Validator(schema).validate(obj)
        # a namespaced kind (Kueue's LocalQueue) names its namespace; a cluster-scoped one none
        assert ("namespace" in obj["metadata"]) == (schema["x-scope"] == "Namespaced"), obj["metadata"]
