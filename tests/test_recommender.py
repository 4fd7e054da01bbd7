"""Quota and placement recommendations on a small cluster whose right answers are known."""
from __future__ import annotations

import json
from datetime import timedelta

import pandas as pd
import pytest

from gpuledger.analytics.config import Config
from gpuledger.policies.recommender import placement_recommendations, quota_recommendations, recommend
from tests.helpers import T0, gpu_rows, table

END = T0 + timedelta(hours=3)


@pytest.fixture
def cluster(store):
    store.upsert_teams(pd.DataFrame({"team": ["a", "b"], "share": [1.0, 1.0], "quota_gpus": [1, 8]}))
    rows = [gpu_rows("n", g, "H100", 180, util=90.0, job=f"a/{g}", team="a") for g in range(4)]
    rows.append(gpu_rows("n", 4, "H100", 180, util=90.0, job="b/1", team="b"))
    rows.append(gpu_rows("n", 5, "H100", 60) + gpu_rows("n", 5, "H100", 120, start=T0 + timedelta(hours=1),
                                                       util=0.0, job="b/notebook", team="b"))
    rows.append(gpu_rows("n", 6, "H100", 60, util=0.0, job="b/old", team="b")
                + gpu_rows("n", 6, "H100", 120, start=T0 + timedelta(hours=1)))
    rows.append(gpu_rows("n", 7, "H100", 180, util=20.0, job="a/small", team="a", mem_used=6000))
    store.append_samples(table(*rows))
    return store


def test_quota_follows_busy_demand_with_headroom(cluster):
    recs = {r.team: r for r in quota_recommendations(cluster, Config(), T0, END)}
    a, b = recs["a"], recs["b"]
    # a: 4 busy GPUs + the 20%-busy one (not idle) = 5 -> 5.5 with 10% headroom -> 6
    assert a.action == {"quota_gpus": 6, "current_quota_gpus": 1}
    assert a.evidence["p95_busy_gpus"] == pytest.approx(5.0) and a.evidence["cluster_gpus"] == 8
    # b: 1 busy GPU; its idle notebook does not count as demand -> 1.1 -> 2
    assert b.action == {"quota_gpus": 2, "current_quota_gpus": 8}
    assert b.evidence["idle_allocated_gpu_hours"] == pytest.approx(3.0)
    assert "lower b GPU quota from 8 to 2" in b.reason


def test_pending_jobs_raise_demand_and_total_is_capped_by_the_cluster(cluster):
    cluster.upsert_jobs(pd.DataFrame([{"job_id": "a/queued", "team": "a", "gpus": 8, "state": "pending",
                                       "submit_ts": END}]))
    recs = {r.team: r for r in quota_recommendations(cluster, Config(), T0, END)}
    assert recs["a"].evidence["pending_gpus"] == 8
    proposed = {t: r.action["quota_gpus"] for t, r in recs.items()}
    assert sum(proposed.values()) <= 8 and proposed["a"] > proposed["b"]
    assert "scaled" in recs["a"].reason


def test_small_changes_are_not_emitted(cluster):
    cluster.upsert_teams(pd.DataFrame({"team": ["a", "b"], "share": [1.0, 1.0], "quota_gpus": [6, 2]}))
    assert quota_recommendations(cluster, Config(), T0, END) == []


def test_reclaim_only_gpus_idle_now_and_resize_running_oversized_jobs(cluster):
    recs = placement_recommendations(cluster, Config(idle_minutes=30), T0, END)
    reclaim = [r for r in recs if r.kind == "reclaim"]
    assert [(r.job_id, r.action["reclaim_gpus"]) for r in reclaim] == [("b/notebook", ["GPU-n-5"])]
    assert reclaim[0].evidence["idle_minutes"] == pytest.approx(120)
    assert reclaim[0].evidence["cost_per_hour_usd"] == pytest.approx(6.88)
    resize = [r for r in recs if r.kind == "resize"]
    assert [(r.job_id, r.action["move_to"]) for r in resize] == [("a/small", "H100 MIG 2g.20gb")]
    assert resize[0].evidence["peak_mem_mib"] == 6000


def test_recommendations_are_json_with_stable_ids(cluster):
    first = [r.to_dict() for r in recommend(cluster, Config(), T0, END)]
    second = [r.to_dict() for r in recommend(cluster, Config(), T0, END)]
    assert json.loads(json.dumps(first)) == first
    assert [r["id"] for r in first] == [r["id"] for r in second] and len({r["id"] for r in first}) == len(first)
    assert {"id", "kind", "team", "job_id", "action", "evidence", "reason"} <= set(first[0])
