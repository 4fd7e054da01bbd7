"""Inputs take the names the product itself emits (issue 45 item 2): the placement API reads the Kueue flavor
names gpuledger writes (`h100`) and the catalogue's names in any case, and a scheduler asked for whose annotations
cannot be given says why instead of answering `{}` silently."""
from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

from gpuledger.analytics.config import Config, TopologyConfig
from gpuledger.analytics.windows import utc_now
from tests.helpers import api_client, gpu_rows, table


@contextmanager
def _cluster(file_store, config: Config):
    start = utc_now().replace(second=0, microsecond=0) - timedelta(minutes=30)
    rows = [gpu_rows("h", g, "H100", 30, start=start, util=80.0, job="nlp/a", team="nlp") for g in range(2)]
    rows += [gpu_rows("h", g, "H100", 30, start=start) for g in range(2, 8)]
    rows += [gpu_rows("l", g, "L4", 30, start=start, mem_total=23034.0) for g in range(4)]
    file_store.append_samples(table(*rows))
    with api_client(file_store, config, open_reads=True) as client:
        yield client


def test_placement_takes_the_flavor_names_gpuledger_emits_and_says_why_no_annotations(file_store):
    with _cluster(file_store, Config()) as client:
        for name in ("h100", "H100"):
            got = client.post("/v1/placement", json={"gpus": 2, "gpu_model": [name]}).json()
            assert got["feasible"] and {c["gpu_model"] for c in got["candidates"]} == {"H100"}, got
        got = client.post("/v1/placement", json={"gpus": 1, "scheduler": "kueue"}).json()
        assert got["annotations"] == {} and "scheduler_objects is off" in got["annotations_note"]
        plain = client.post("/v1/placement", json={"gpus": 1}).json()
        assert plain["annotations_note"] is None


def test_with_scheduler_objects_the_annotations_come_and_no_note(file_store):
    config = Config(topology=TopologyConfig(scheduler_objects=True))
    with _cluster(file_store, config) as client:
        got = client.post("/v1/placement", json={"gpus": 1, "scheduler": "kueue"}).json()
        assert got["annotations"] and got["annotations_note"] is None, got


def test_the_whatif_reads_flavor_names_in_edits_and_capacity():
    from gpuledger.policies.model_names import ModelNames
    names = ModelNames(["H100", "A100-80GB", "Site-Card-X"])
    assert names.resolve("h100") == "H100" and names.resolve("a100-80gb") == "A100-80GB"
    assert names.resolve("h200") == "H200"  # in the catalogue, not present: a model to buy
    assert names.resolve("site-card-x") == "Site-Card-X"  # a model present outside the catalogue
    assert names.resolve("nosuch") == "nosuch"  # left for the caller to refuse with its own reason
    import pytest

    from gpuledger.collector.errors import InputError
    with pytest.raises(InputError, match="the models present are A100-80GB, H100, Site-Card-X"):
        names.require(["h100", "nosuch"])


def test_whatif_set_takes_the_flavor_name_it_prints(tmp_path):
    """`whatif --set nlp:h100=N` (the flavor name `emit` writes) replays as H100, not 'no h100 GPU is present'."""
    import subprocess

    import pandas as pd

    from gpuledger.analytics.store import Store
    from tests.procs import GPULEDGER
    db = tmp_path / "w.duckdb"
    start = utc_now().replace(second=0, microsecond=0) - timedelta(hours=3)
    with Store(db) as store:
        store.upsert_teams(pd.DataFrame({"team": ["nlp", "cv"], "share": [1.0, 1.0], "quota_gpus": [2, 2]}))
        store.append_samples(table(*[gpu_rows("h", g, "H100", 180, start=start, util=70.0, job=f"nlp/j{g}",
                                              team="nlp") for g in range(4)]))
        store.upsert_jobs(pd.DataFrame([{"job_id": f"nlp/j{g}", "team": "nlp", "gpu_model": "H100", "gpus": 1,
                                         "state": "running", "submit_ts": start, "start_ts": start,
                                         "source": "test"} for g in range(4)]))
    out = subprocess.run([GPULEDGER, "whatif", "--db", str(db), "--set", "nlp:h100=2", "--no-recommendations",
                          "--days", "0.1"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "proposal: nlp H100 guarantee" in out.stdout, out.stdout


def test_the_product_name_the_kueue_plan_selects_on_reads_as_its_model_and_a_typo_is_refused():
    """`--capacity NVIDIA-H100-80GB-HBM3=0` (the nvidia.com/gpu.product value the Kueue flavors select on) was added
    as a new model and changed nothing; `--capacity H1OO=8` added 8 GPUs no job could use, without a word."""
    import pytest

    from gpuledger.collector.errors import InputError
    from gpuledger.policies.model_names import ModelNames
    names = ModelNames(["H100", "A100-80GB"])
    assert names.find("NVIDIA-H100-80GB-HBM3") == "H100" and names.find("NVIDIA A100-SXM4-80GB") == "A100-80GB"
    assert names.find("h100") == "H100" and names.find("H1OO") is None
    with pytest.raises(InputError, match="H1OO.*product name"):
        names.require(["H1OO"])
    assert names.require(["H200"]) == {"H200"}  # a catalogue model not present yet: "buy 16 H200s"
