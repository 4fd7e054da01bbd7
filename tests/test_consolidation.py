"""Consolidation and separation advice on a hand-built cluster whose right answer can be worked out by hand."""
from __future__ import annotations

from datetime import timedelta

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.analytics.config import Config
from gpuledger.policies.consolidation import consolidate_advice
from gpuledger.policies.recommender import evaluate
from tests.helpers import T0, gpu_rows, table

MINUTES = 20
AT = T0 + timedelta(minutes=MINUTES)


def cluster(layout: dict[str, list[str | None]], model: str = "H100") -> list[dict]:
    """`layout`: node -> the job holding each of its GPUs (None: free)."""
    rows = []
    for node, holders in layout.items():
        for gpu, job in enumerate(holders):
            rows += gpu_rows(node, gpu, model, MINUTES, 60.0, util=80.0 if job else 0.0, job=job,
                             team="vision" if job else None)
    return rows


def test_moving_the_fewest_gpus_frees_a_node_for_a_waiting_gang_job(open_store):
    """A waiting 6-GPU job; most free on any node is 5 (c). Freeing c takes one 1-GPU job moved (to a, which has
    the most room), a would take two, b one 5-GPU job: c it is."""
    layout = {"a": [None] * 4 + ["a1", "a2", "a3", "a4"],
              "b": [None] * 3 + ["big"] * 5,
              "c": [None] * 5 + ["c1", "c2", "c3"]}
    with open_store("cons") as s:
        s.append_samples(table(cluster(layout)))
        s.upsert_jobs(pd.DataFrame([{"job_id": "gang", "team": "nlp", "user": None, "namespace": "nlp", "pod": None,
                                     "node": None, "gpu_model": "H100", "gpus": 6, "submit_ts": T0,
                                     "start_ts": None, "end_ts": None, "state": "pending"}]))
        latest = s.latest_ts()
        (advice,) = consolidate_advice(s, Config(), AT, latest)
        assert (advice.kind, advice.job_id, advice.team) == ("consolidate", "gang", "nlp")
        assert advice.action == {"node": "c", "frees_gpus": 6, "move": [{"job_id": "c1", "gpus": 1, "to_node": "a"}]}
        assert advice.evidence["most_free_gpus_on_any_node"] == 5 and advice.evidence["gpus_moved"] == 1
        assert advice.evidence["waited_minutes"] >= 19
        assert "gang" in advice.reason and "frees 6" in advice.reason
        kinds = {r.kind for r in evaluate(s, Config(), AT).placement}
        assert "consolidate" in kinds  # it joins the recommendation stream


def test_no_advice_when_the_job_fits_or_nothing_can_move(open_store):
    with open_store("none") as s:
        s.append_samples(table(cluster({"a": [None] * 6 + ["x", "y"], "b": ["z"] * 8})))
        pending = {"job_id": "gang", "team": "nlp", "user": None, "namespace": "nlp", "pod": None, "node": None,
                   "gpu_model": "H100", "gpus": 6, "submit_ts": T0, "start_ts": None, "end_ts": None,
                   "state": "pending"}
        s.upsert_jobs(pd.DataFrame([pending]))
        assert consolidate_advice(s, Config(), AT, s.latest_ts()) == []  # a has 6 free: it fits now
        s.upsert_jobs(pd.DataFrame([dict(pending, gpus=8)]))  # 8: a's two jobs have nowhere to go (b is full)
        assert consolidate_advice(s, Config(), AT, s.latest_ts()) == []


def test_a_latency_sensitive_job_sharing_a_gpu_is_advised_a_gpu_of_its_own(open_store, tmp_path):
    """GPU 0 of f holds an inference pod (team serving) and a training job at half each; g has a free GPU."""
    from gpuledger.analytics.config import load_config
    from gpuledger.policies.consolidation import separate_advice
    rows = []
    for job, team in (("serving/chat", "serving"), ("train-1", "research")):
        rows += [dict(r, gpu_fraction=0.5, pod=job) for r in
                 gpu_rows("f", 0, "H100", MINUTES, 60.0, util=60.0, job=job, team=team)]
    rows += cluster({"g": [None, "x"]})
    with open_store("sep") as s:
        s.append_samples(table(rows))
        (advice,) = separate_advice(s, Config(), AT, s.latest_ts())
        assert (advice.kind, advice.job_id, advice.action) == (
            "separate", "serving/chat", {"from_gpu": "GPU-f-0", "node": "f", "to_node": "g"})
        assert advice.evidence["shares_gpu_with"] == ["train-1"] and advice.evidence["share_held"] == 0.5
        (tmp_path / "c.toml").write_text("[placement]\nlatency_sensitive = [\"nobody\"]\n")
        assert separate_advice(s, load_config(tmp_path / "c.toml"), AT, s.latest_ts()) == []


def _fits_by_scan(moves: list[tuple[str, int]], free: dict[str, set[str]], model: dict[str, str], node: str,
                  gpu_model: str) -> dict[str, str] | None:
    """Where moved jobs go by the rule's plain statement: for each job, largest first, the node of the model (not
    `node`) with the most room that still has enough, the lowest name among equals. The index must agree."""
    room = {n: len(g) for n, g in free.items() if n != node and model.get(n) == gpu_model}
    placed = {}
    for job, gpus in sorted(moves, key=lambda m: -m[1]):
        target = max((n for n in sorted(room) if room[n] >= gpus), key=lambda n: room[n], default=None)
        if target is None:
            return None
        room[target] -= gpus
        placed[job] = target
    return placed


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["H100", "A100"]), st.integers(0, 8)), min_size=1, max_size=12),
       st.lists(st.integers(1, 8), min_size=1, max_size=6), st.integers(0, 11), st.sampled_from(["H100", "A100"]))
def test_the_room_index_places_moves_as_the_scan_would(nodes, sizes, leave, gpu_model):
    from gpuledger.policies.consolidation import Room
    free = {f"n{i:02d}": {f"g{k}" for k in range(n)} for i, (_, n) in enumerate(nodes)}
    model = {f"n{i:02d}": m for i, (m, _) in enumerate(nodes)}
    moves = [(f"j{k}", gpus) for k, gpus in enumerate(sizes)]
    node = f"n{leave % len(nodes):02d}"
    assert Room(free, model).fits(moves, node, gpu_model) == _fits_by_scan(moves, free, model, node, gpu_model)
