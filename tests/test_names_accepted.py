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
