"""A gang of pods is placed on one GPU model, and a gang that does not fit says why (issue 39 item 7).

Before: `POST /v1/placement {"gpus": 1, "pods": 2}` on a cluster with one free GPU on an A100 node and one on an H100
node placed one pod on each (a data-parallel job whose ranks then run at the slower card's pace, with mismatched
kernels and memory), and a gang that did not fit answered `"gang": null` when no node could take even one pod,
instead of the documented object with its reasons.
"""
from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.gpu_catalog import MODELS
from tests.helpers import api_client, gpu_rows, table

MEM = {name: float(model.mem_mib) for name, model in MODELS.items()}


def cluster(store: Store, nodes: dict[str, tuple[str, int, int]], minutes: int = 10) -> None:
    """Per node: (GPU model, GPUs, GPUs held by a running job: the first ones). Any GPU held makes the window's
    workload (placement scores against it)."""
    start = utc_now().replace(second=0, microsecond=0) - timedelta(minutes=minutes)
    rows = []
    for node, (model, gpus, held) in nodes.items():
        rows += [gpu_rows(node, g, model, minutes, start=start, util=50.0 if g < held else 0.0,
                          job=f"{node}-job" if g < held else None, team="nlp" if g < held else None,
                          mem_total=MEM[model]) for g in range(gpus)]
    store.append_samples(table(*rows))


def place(store: Store, body: dict) -> dict:
    with api_client(store, Config(), open_reads=True) as client:
        answer = client.post("/v1/placement", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_two_pod_gang_is_not_split_over_an_a100_and_an_h100(file_store):
    """One GPU free on an A100 node, one on an H100 node: no single model takes both pods, so nothing is placed,
    and the answer says per model how many pods each could take and that mixing would place it."""
    cluster(file_store, {"a100": ("A100-80GB", 2, 1), "h100": ("H100", 2, 1)})
    gang = place(file_store, {"gpus": 1, "pods": 2})["gang"]
    assert gang is not None and gang["placed"] == [] and gang["group"] is None and gang["gpu_model"] is None
    assert gang["mix_models"] is False and gang["groups_fitting"] == 0 and gang["groups_considered"] == 2
    assert gang["reason"] and "mix_models" in gang["reason"]
    tried = {t["gpu_model"]: t for t in gang["tried"]}
    assert set(tried) == {"A100-80GB", "H100"}
    for t in tried.values():
        assert t["group"] == "cluster" and t["nodes"] == 1 and t["gpus_free"] == 1 and t["pods_fit"] == 1
        assert t["fits"] is False and "1 of 2" in t["reason"] and t["fragmentation_added_gpus"] is None


def test_mixing_models_is_allowed_when_asked(file_store):
    cluster(file_store, {"a100": ("A100-80GB", 2, 1), "h100": ("H100", 2, 1)})
    gang = place(file_store, {"gpus": 1, "pods": 2, "mix_models": True})["gang"]
    assert gang["mix_models"] is True and gang["group"] == "cluster" and gang["reason"] is None
    assert sorted((p["node"], p["gpu_model"]) for p in gang["placed"]) == [("a100", "A100-80GB"), ("h100", "H100")]
    assert sorted(g for p in gang["placed"] for g in p["gpus"]) == ["GPU-a100-1", "GPU-h100-1"]
    assert gang["gpu_model"] is None  # the pods are on two models
    assert [t["gpu_model"] for t in gang["tried"]] == [None] and gang["tried"][0]["fits"] is True


def test_a_gang_goes_whole_onto_the_one_model_that_takes_it(file_store):
    """Three GPUs free on H100s (over two nodes), one on the A100: two pods go to the H100s only."""
    cluster(file_store, {"a100": ("A100-80GB", 2, 1), "h100-1": ("H100", 2, 1), "h100-2": ("H100", 4, 2)})
    gang = place(file_store, {"gpus": 1, "pods": 2})["gang"]
    assert gang["gpu_model"] == "H100" and len(gang["placed"]) == 2
    assert {p["gpu_model"] for p in gang["placed"]} == {"H100"} and gang["groups_fitting"] == 1
    tried = {t["gpu_model"]: t for t in gang["tried"]}
    assert tried["H100"]["fits"] is True and tried["H100"]["pods_fit"] == 3 and tried["H100"]["gpus_free"] == 3
    assert tried["A100-80GB"]["fits"] is False and tried["A100-80GB"]["pods_fit"] == 1


def test_gpu_model_takes_rate_card_or_kueue_flavor_names_in_any_case(file_store):
    cluster(file_store, {"a100": ("A100-80GB", 4, 1), "h100": ("H100", 4, 1)})
    for asked, model in ((["h100"], "H100"), (["H100"], "H100"), (["a100-80gb"], "A100-80GB"),
                         (["A100-80gb"], "A100-80GB")):
        answer = place(file_store, {"gpus": 1, "pods": 2, "gpu_model": asked})
        gang = answer["gang"]
        assert gang["gpu_model"] == model and {p["gpu_model"] for p in gang["placed"]} == {model}, asked
        assert [t["gpu_model"] for t in gang["tried"]] == [model], asked  # only the asked model is tried
        assert {c["gpu_model"] for c in answer["candidates"]} == {model}, asked


def test_an_unknown_gpu_model_is_a_422_naming_the_models_present(file_store):
    cluster(file_store, {"a100": ("A100-80GB", 2, 1), "h100": ("H100", 2, 1)})
    with api_client(file_store, Config(), open_reads=True) as client:
        answer = client.post("/v1/placement", json={"gpus": 1, "pods": 2, "gpu_model": ["h100", "x999"]})
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert "x999" in detail and "A100-80GB" in detail and "H100" in detail


def test_a_gang_no_node_can_start_still_answers_the_gang_object(file_store):
    """Pods of 4 GPUs where no node has 4 free: the answer has no candidate, and the gang says why per model."""
    cluster(file_store, {"a100": ("A100-80GB", 4, 1), "h100": ("H100", 4, 2)})
    answer = place(file_store, {"gpus": 4, "pods": 2})
    assert answer["candidates"] == [] and answer["reason"]
    gang = answer["gang"]
    assert gang is not None and gang["placed"] == [] and gang["pods"] == 2 and gang["reason"]
    tried = {t["gpu_model"]: t for t in gang["tried"]}
    assert (tried["A100-80GB"]["gpus_free"], tried["H100"]["gpus_free"]) == (3, 2)
    assert all(t["pods_fit"] == 0 and t["fits"] is False and "4" in t["reason"] for t in tried.values())


def test_a_gang_without_a_workload_answers_the_gang_object(file_store):
    cluster(file_store, {"a100": ("A100-80GB", 2, 0), "h100": ("H100", 2, 0)})  # no job: nothing to score against
    answer = place(file_store, {"gpus": 1, "pods": 2})
    assert answer["reason"] and answer["gang"]["placed"] == [] and answer["gang"]["reason"] == answer["reason"]
    assert answer["gang"]["tried"] == []


NODE = st.tuples(st.sampled_from(["H100", "A100-80GB", "L4"]), st.integers(1, 8), st.integers(0, 4))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(NODE, min_size=1, max_size=6), gpus=st.integers(1, 3), pods=st.integers(2, 4),
       mix=st.booleans(), only=st.sets(st.sampled_from(["h100", "a100-80gb", "L4"]), max_size=2))
def test_no_placed_gang_spans_two_models_unless_mixing_is_asked(nodes, gpus, pods, mix, only):
    """For any cluster and gang: a placed gang is whole (every pod, on distinct free GPUs of allowed models) and on
    one model unless mix_models; a gang left unplaced has no allowed model (or, mixing, the cluster) with room for
    every pod, counted here apart from the placer."""
    spec = {f"n{i}": (model, count, min(held, count)) for i, (model, count, held) in enumerate(nodes)}
    spec["n0"] = (spec["n0"][0], spec["n0"][1], max(spec["n0"][2], 1))  # a job somewhere: a workload to score by
    allowed = {m for m in MODELS if m.lower() in {o.lower() for o in only}} or {m for m, _, _ in spec.values()}
    body = {"gpus": gpus, "pods": pods, "mix_models": mix, **({"gpu_model": sorted(only)} if only else {})}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "s.duckdb")
        try:
            store.set_rates(Config().rates)
            cluster(store, spec, minutes=3)
            gang = place(store, body)["gang"]
        finally:
            store.close()
    assert gang is not None and gang["pods"] == pods and gang["mix_models"] is mix
    room: dict[str, int] = {}
    for model, count, held in spec.values():
        if model in allowed:
            room[model] = room.get(model, 0) + (count - held) // gpus
    fits = sum(room.values()) >= pods if mix else any(r >= pods for r in room.values())
    placed = gang["placed"]
    event(f"placed={bool(placed)} mix_models={mix}")
    if not placed:
        assert not fits, (spec, body, gang)
        assert gang["reason"]
        return
    assert fits and len(placed) == pods and gang["reason"] is None
    models = {spec[p["node"]][0] for p in placed}
    assert models <= allowed and {p["gpu_model"] for p in placed} == models
    if not mix:
        assert len(models) == 1 and gang["gpu_model"] == models.pop(), (spec, body, gang)
    taken = [g for p in placed for g in p["gpus"]]
    assert len(taken) == len(set(taken)) == pods * gpus
    for p in placed:  # only free GPUs: the first `held` of each node are held
        assert all(int(g.rsplit("-", 1)[1]) >= spec[p["node"]][2] for g in p["gpus"])
