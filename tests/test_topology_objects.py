"""Topology objects for Kueue's Topology Aware Scheduling and KAI's topology support: valid against the real CRDs
(tests/data/schemas), only with `[topology] scheduler_objects`, the annotations under the schedulers' own keys,
and a bad label refused rather than written into an object a scheduler applies."""
from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest
import yaml

from gpuledger.analytics.config import Config, TopologyConfig
from gpuledger.collector.errors import InputError
from gpuledger.policies.emitters import emitter_for
from gpuledger.policies.emitters.topology import API_VERSIONS, podset_annotations, topology_objects
from gpuledger.policies.exporting import export
from tests.crds import OWN_CRDS, OWN_SCHEMAS, assert_valid
from tests.test_emitters import PLAN, by_name

ON = TopologyConfig(scheduler_objects=True)
RACKED = TopologyConfig(levels=("example.com/rack", "nvidia.com/gpu.clique", "kubernetes.io/hostname"),
                        name="dc1.gpus", scheduler_objects=True, rack_label="example.com/rack", keep_within="rack")


def test_the_versions_emitted_are_served_by_the_copied_crds():
    served = {}
    for name in OWN_CRDS:
        crd = yaml.safe_load((OWN_SCHEMAS / name).read_text())
        assert crd["spec"]["names"]["kind"] == "Topology" and crd["spec"]["scope"] == "Cluster"
        served.update({f"{crd['spec']['group']}/{v['name']}": v["served"] for v in crd["spec"]["versions"]})
    assert all(served[version] for version in API_VERSIONS.values()), served
    assert API_VERSIONS == {"kueue": "kueue.x-k8s.io/v1beta2", "kai": "kai.scheduler/v1alpha1"}


@pytest.mark.parametrize("target", ["kueue", "kai"])
@pytest.mark.parametrize("topology", [ON, RACKED], ids=["default", "racked"])
def test_every_object_with_a_topology_is_valid_against_the_real_crds(target, topology):
    emitted = emitter_for(target, topology).emit(PLAN)
    assert_valid(emitted.objects)
    first = emitted.objects[0]  # the Topology leads, so what names it is applied after it
    assert first["kind"] == "Topology" and first["apiVersion"] == API_VERSIONS[target]
    assert first["metadata"]["name"] == topology.name
    assert [level["nodeLabel"] for level in first["spec"]["levels"]] == list(topology.levels)
    assert [o for o in emitted.objects if o["kind"] == "Topology"] == [first]
    assert next(yaml.safe_load_all(emitted.text)) == first


def test_kueue_flavors_name_the_topology_only_where_the_crd_allows_it():
    plan = replace(PLAN, capacity={**PLAN.capacity, "Homebrew X1": 2.0})
    flavors = by_name(emitter_for("kueue", ON).emit(plan).objects, "ResourceFlavor")
    assert flavors["h100"]["spec"]["topologyName"] == flavors["l4"]["spec"]["topologyName"] == "gpu-topology"
    # a flavor without nodeLabels may not name a topology (the CRD's rule); an uncatalogued model has none
    assert flavors["homebrew-x1"]["spec"] == {}
    assert_valid(list(flavors.values()))


@pytest.mark.parametrize("target", ["kai", "kueue", "volcano", "slurm"])
def test_nothing_changes_without_scheduler_objects(target):
    plain = emitter_for(target).emit(PLAN)
    off = emitter_for(target, TopologyConfig()).emit(PLAN)  # the default: scheduler_objects = false
    assert off.text == plain.text and off.objects == plain.objects
    assert "topologyName" not in plain.text and "kind: Topology" not in plain.text


@pytest.mark.parametrize("target", ["volcano", "slurm"])
def test_schedulers_without_a_topology_object_get_none(target):
    assert topology_objects(target, ON) == []
    assert emitter_for(target, ON).emit(PLAN).text == emitter_for(target).emit(PLAN).text


def test_annotations_use_the_schedulers_own_keys():
    clique = ON.level_label("clique")
    assert clique == "nvidia.com/gpu.clique"
    assert podset_annotations("kueue", ON, clique) == {"kueue.x-k8s.io/podset-required-topology": clique}
    assert podset_annotations("kueue", ON, clique, required=False) == {
        "kueue.x-k8s.io/podset-preferred-topology": clique}
    assert podset_annotations("kai", RACKED, RACKED.level_label()) == {
        "kai.scheduler/topology": "dc1.gpus", "kai.scheduler/topology-required-placement": "example.com/rack"}
    assert podset_annotations("kai", RACKED, "kubernetes.io/hostname", required=False) == {
        "kai.scheduler/topology": "dc1.gpus", "kai.scheduler/topology-preferred-placement": "kubernetes.io/hostname"}
    with pytest.raises(InputError, match="kueue or kai"):
        podset_annotations("volcano", ON, clique)


def test_an_island_is_kept_on_one_node_the_narrowest_level_a_topology_has():
    assert ON.keep_within == "island" and ON.level_label() == ON.level_label("node") == "kubernetes.io/hostname"
    assert podset_annotations("kai", ON, ON.level_label()) == {
        "kai.scheduler/topology": "gpu-topology", "kai.scheduler/topology-required-placement": "kubernetes.io/hostname"}
    nodes_only = TopologyConfig(levels=("example.com/block", "kubernetes.io/hostname"))
    assert nodes_only.level_label("clique") is None and nodes_only.level_label("rack") is None


@pytest.mark.parametrize("bad", [
    TopologyConfig(levels=("nvidia.com/gpu clique", "kubernetes.io/hostname")),
    TopologyConfig(levels=("nvidia.com/gpu.clique\n", "kubernetes.io/hostname")),
    TopologyConfig(levels=("Example.COM/rack", "kubernetes.io/hostname")),
    TopologyConfig(levels=("a/b/c",)),
    TopologyConfig(levels=("$(reboot)",)),
    TopologyConfig(levels=("rack-" + "x" * 64,)),
    TopologyConfig(levels=("kubernetes.io/hostname", "nvidia.com/gpu.clique")),
    TopologyConfig(levels=("nvidia.com/gpu.clique", "nvidia.com/gpu.clique")),
    TopologyConfig(levels=()),
    TopologyConfig(name="GPU Topology"),
    TopologyConfig(name="gpu-topology\n"),
    TopologyConfig(rack_label="example.com/rack"),  # not one of levels
    TopologyConfig(keep_within="rack"),  # no rack level
    TopologyConfig(keep_within="galaxy"),
], ids=lambda t: ascii(t)[:60])
def test_a_bad_topology_is_refused_not_emitted(bad):
    bad = replace(bad, scheduler_objects=True)
    for target in ("kueue", "kai"):
        with pytest.raises(InputError, match=r"\[topology\]"):
            topology_objects(target, bad)
        with pytest.raises(InputError, match=r"\[topology\]"):
            emitter_for(target, bad).emit(PLAN)


@pytest.mark.parametrize("label", ["example.com/rack", "nvidia.com/gpu clique", "x\"; rm -rf /", ""])
def test_an_annotation_for_a_level_the_topology_lacks_is_refused(label):
    with pytest.raises(InputError, match="not one of \\[topology\\] levels"):
        podset_annotations("kueue", ON, label)


def _dump(*objects: dict) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(objects)})


def _existing_topology(target: str, levels: list[str], name: str = "gpu-topology") -> dict:
    return {"apiVersion": API_VERSIONS[target], "kind": "Topology",
            "metadata": {"name": name, "resourceVersion": "7", "labels": {"owner": "platform"}},
            "spec": {"levels": [{"nodeLabel": label} for label in levels]}}


@pytest.mark.parametrize("target", ["kueue", "kai"])
def test_an_unchanged_topology_is_not_output_again(target):
    current = _dump(_existing_topology(target, list(ON.levels)))
    assert not [o for o in emitter_for(target, ON).emit(PLAN, current).objects if o["kind"] == "Topology"]


def test_kai_topology_levels_cannot_change_so_the_emitter_says_what_to_do():
    current = _dump(_existing_topology("kai", ["example.com/rack", "kubernetes.io/hostname"]))
    with pytest.raises(InputError, match="set \\[topology\\] name to a new name"):
        emitter_for("kai", ON).emit(PLAN, current)


def test_kueue_topology_levels_change_while_the_node_is_the_last_level():
    current = _dump(_existing_topology("kueue", ["example.com/rack", "kubernetes.io/hostname"]))
    topology = by_name(emitter_for("kueue", ON).emit(PLAN, current).objects, "Topology")["gpu-topology"]
    assert topology["metadata"]["labels"] == {"owner": "platform"} and "resourceVersion" not in topology["metadata"]
    assert [level["nodeLabel"] for level in topology["spec"]["levels"]] == list(ON.levels)
    assert_valid([topology])
    before_without_node = _dump(_existing_topology("kueue", ["example.com/rack", "example.com/host"]))
    with pytest.raises(InputError, match="does not let them change"):
        emitter_for("kueue", ON).emit(PLAN, before_without_node)


def test_an_existing_flavor_gets_the_topology_but_never_another_one():
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "h100"},
              "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "a"},
                       "tolerations": [{"key": "gpu", "operator": "Exists"}]}}
    h100 = by_name(emitter_for("kueue", ON).emit(PLAN, _dump(flavor)).objects, "ResourceFlavor")["h100"]
    assert h100["spec"]["topologyName"] == "gpu-topology" and h100["spec"]["nodeLabels"]["pool"] == "a"
    assert h100["spec"]["tolerations"] == flavor["spec"]["tolerations"]
    assert_valid([h100])
    flavor["spec"]["topologyName"] = "other"
    with pytest.raises(InputError, match="already uses the Topology 'other'"):
        emitter_for("kueue", ON).emit(PLAN, _dump(flavor))


def test_emit_takes_the_topology_from_the_config(store):
    store.upsert_teams(pd.DataFrame({"team": ["a"], "share": [1.0], "quota_gpus": [4]}))
    store.set_team_quotas(pd.DataFrame({"team": ["a"], "gpu_model": ["H100"], "guarantee_gpus": [2.0],
                                        "limit_gpus": [4.0]}))
    for target in ("kueue", "kai"):
        plain = export(store, Config(), target)
        assert "kind: Topology" not in plain.native
        objects = json.loads(export(store, Config(topology=ON), target).json)
        assert objects[0]["kind"] == "Topology" and objects[0]["metadata"]["name"] == "gpu-topology"
        assert_valid(objects)
        if target == "kueue":  # the flavors name the Topology; nothing else changes
            named = [{**o, "spec": {k: v for k, v in o["spec"].items() if k != "topologyName"}} for o in objects[1:]]
            assert named == json.loads(plain.json)
            assert all(o["spec"]["topologyName"] == "gpu-topology" for o in objects if o["kind"] == "ResourceFlavor")
        else:
            assert objects[1:] == json.loads(plain.json)
