"""Quota and placement advice on a small cluster whose right answers can be worked out by hand, and the
ledger that keeps advice stable: stored, cooled down, bounded, decided."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pandas as pd
import pytest

from gpuledger.analytics.config import Config, QuotaConfig, WasteConfig
from gpuledger.policies.recommendation import ACCEPTED, APPLIED, INSUFFICIENT_DATA, PROPOSED, SUPERSEDED, stored
from gpuledger.policies.recommender import DecisionError, decide, evaluate, refresh
from tests.helpers import T0, gpu_rows, table

END = T0 + timedelta(hours=3)
WINDOW = Config(quota=QuotaConfig(window_days=3 / 24))  # the policy window is exactly the 3 hours of samples


@pytest.fixture
def cluster(store):
    """8 H100s over 3 hours. a: 4 GPUs at 90% and one at 20% (5 busy). b: one GPU at 90%, a notebook idle
    for the last 2 hours, an old job idle in the first hour. Shares equal."""
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


def quotas(store, config=WINDOW, at=END):
    return {(a.team, a.gpu_model): a for a in evaluate(store, config, at).quota}


def state(cluster, a: float, b: float):
    cluster.set_team_quotas(pd.DataFrame({"team": ["a", "b"], "gpu_model": ["H100", "H100"],
                                          "guarantee_gpus": [a, b], "limit_gpus": [8.0, 8.0]}))


def test_without_stated_guarantees_each_team_gets_busy_demand_bounded_by_its_fair_part(cluster):
    got = quotas(cluster)
    a, b = got[("a", "H100")], got[("b", "H100")]
    # a: 5 busy -> 5.5 with headroom, but a used 5/7 of the GPU-hours at an equal share: over-served, so held to
    # its fair part, 8 x 1/2 = 4. b: 1 busy GPU (its idle notebook is not demand) -> 1.1 -> 1.
    assert (a.status, a.guarantee, a.limit) == ("change", 4, 8.0)
    assert a.evidence["p95_busy_gpus"] == pytest.approx(5.0) and a.evidence["over_served"]
    assert a.evidence["fairshare_factor"] < 0.5 and "over-served" in a.reason
    assert (b.guarantee, b.evidence["idle_allocated_gpu_hours"]) == (1, pytest.approx(3.0))
    assert a.evidence["effect_gpu_hours_per_week"] == 4 * 168
    # a guarantee moves a promise, not money: shown at the rate card, never as a saving
    assert a.evidence["guarantee_usd_per_week"] == pytest.approx(4 * 168 * 6.88)
    assert "effect_usd_per_week" not in a.evidence and "freed" not in a.reason
    assert a.evidence["coverage"] <= 1.0


def test_lowering_a_guarantee_saves_nothing_and_coverage_stays_at_most_one(cluster):
    """Before: a lowered guarantee read "$576/week freed" though the GPUs stay borrowable, and a window starting
    mid-hour showed coverage 1.003 (337 of 336 hours)."""
    state(cluster, a=8, b=0)
    lowered = [q for q in quotas(cluster).values() if q.current is not None and q.guarantee < q.current]
    assert lowered
    for q in lowered:
        assert "no cost is saved" in q.reason and "freed" not in q.reason
        assert q.evidence["guarantee_usd_per_week"] < 0 and q.evidence["coverage"] <= 1.0


def test_changes_are_step_bounded_and_guarantees_fit_the_model(cluster):
    state(cluster, a=1, b=8)
    got = quotas(cluster)
    a, b = got[("a", "H100")], got[("b", "H100")]
    assert (a.current, a.guarantee) == (1, 2)  # wants 4, but one change moves at most max(1, 25% of 1)
    assert (b.current, b.guarantee) == (8, 6)  # wants 1, lowered by at most 25% of 8
    assert any("step bounded" in why for why in a.evidence["bounded_by"])
    assert "lower b's H100 guarantee from 8 to 6" in b.reason and "336 GPU-h/week" in b.reason and "no cost is saved" in b.reason
    assert a.guarantee + b.guarantee <= 8


def test_queued_jobs_raise_demand_but_never_past_the_model(cluster):
    cluster.upsert_jobs(pd.DataFrame([{"job_id": "b/queued", "team": "b", "gpus": 8, "state": "pending",
                                       "submit_ts": END - timedelta(hours=1)}]))
    got = quotas(cluster)
    b = got[("b", "H100")]
    assert b.evidence["queued_gpus"] == 8 and b.evidence["longest_wait_minutes"] == pytest.approx(60)
    assert b.guarantee == 4 and got[("a", "H100")].guarantee == 4  # both at their fair part: 8 in all


def test_a_window_without_samples_gives_no_numbers(cluster):
    state(cluster, a=1, b=8)
    later = evaluate(cluster, Config(), END + timedelta(days=300))
    assert later.proposals() == []
    notes = later.insufficient()
    assert {(n.team, n.gpu_model, n.status) for n in notes} == {("a", "H100", INSUFFICIENT_DATA),
                                                              ("b", "H100", INSUFFICIENT_DATA)}
    # 300 days on, no node has reported for long: no GPU is present (capacity is each node's recent samples)
    assert all(n.action == {} and ("cover 0%" in n.reason or "no H100 GPU is present" in n.reason) for n in notes)


def test_too_little_history_for_the_policy_window_gives_no_numbers(cluster):
    short = evaluate(cluster, Config(quota=QuotaConfig(window_days=1)), END)  # 3 hours of 24: 12% coverage
    assert not [a for a in short.quota if a.status != INSUFFICIENT_DATA]
    assert "cover 12%" in short.insufficient()[0].reason


def test_an_over_served_team_with_idle_gpus_is_not_raised(store):
    """a holds 4 GPUs, 2 of them idle, and used far more than its share: no raise, whatever its demand."""
    store.upsert_teams(pd.DataFrame({"team": ["a", "b"], "share": [1.0, 3.0], "quota_gpus": [2, 2]}))
    rows = [gpu_rows("n", g, "H100", 180, util=95.0, job=f"a/{g}", team="a") for g in range(2)]
    rows += [gpu_rows("n", g, "H100", 180, util=0.0, job=f"a/{g}", team="a") for g in (2, 3)]
    rows += [gpu_rows("n", 4, "H100", 180, util=95.0, job="b/1", team="b"), gpu_rows("n", 5, "H100", 180)]
    store.append_samples(table(*rows))
    store.set_team_quotas(pd.DataFrame({"team": ["a", "b"], "gpu_model": ["H100", "H100"],
                                        "guarantee_gpus": [1.0, 1.0], "limit_gpus": [6.0, 6.0]}))
    a = quotas(store)[("a", "H100")]
    assert a.evidence["over_served"] and a.guarantee <= a.current + 0  # fair part 6 x 1/4 = 1.5 -> no real raise
    assert a.evidence["idle_allocated_gpu_hours"] == pytest.approx(6.0)


def test_idle_jobs_get_reclaim_and_running_oversized_jobs_get_resize_per_gpu_and_in_total(cluster):
    config = Config(quota=QuotaConfig(window_days=3 / 24), waste=WasteConfig(idle_minutes=30))
    recs = evaluate(cluster, config, END).placement
    reclaim = [r for r in recs if r.kind == "reclaim"]
    assert [(r.job_id, r.action["reclaim_gpus"]) for r in reclaim] == [("b/notebook", ["GPU-n-5"])]
    assert reclaim[0].evidence["idle_minutes"] == pytest.approx(120)
    assert reclaim[0].evidence["effect_usd_per_week"] == pytest.approx(6.88 * 168)
    resize = [r for r in recs if r.kind == "resize"]
    assert [(r.job_id, r.action["move_to"]) for r in resize] == [("a/small", "H100 MIG 2g.20gb")]
    assert resize[0].action["per_gpu"] and resize[0].action["gpus"] == 1
    assert resize[0].action["gpus_freed"] == pytest.approx(5 / 7)
    assert resize[0].evidence["effect_usd_per_week"] == pytest.approx(5 / 7 * 6.88 * 168)
    assert "each of its 1 GPU(s) fits H100 MIG 2g.20gb" in resize[0].reason


def test_an_idle_memory_light_job_is_never_told_to_move_to_a_slice(store):
    store.upsert_teams(pd.DataFrame({"team": ["a"], "share": [1.0], "quota_gpus": [8]}))
    store.append_samples(table(*[gpu_rows("n", g, "H100", 180, util=0.0, job="a/idle8", team="a", mem_used=2000)
                                 for g in range(8)]))
    recs = evaluate(store, Config(quota=QuotaConfig(window_days=3 / 24)), END).placement
    assert {r.kind for r in recs} == {"reclaim"} and recs[0].action["gpus"] == 8


def test_previews_are_json_with_stable_ids(cluster):
    first = [r.to_dict() for r in evaluate(cluster, WINDOW, END).proposals()]
    second = [r.to_dict() for r in evaluate(cluster, WINDOW, END).proposals()]
    assert json.loads(json.dumps(first)) == first
    assert [r["id"] for r in first] == [r["id"] for r in second] and len({r["id"] for r in first}) == len(first)
    assert {"id", "kind", "team", "gpu_model", "job_id", "status", "action", "evidence", "reason"} <= set(first[0])


LEDGER = Config(quota=QuotaConfig(window_days=0.25, min_coverage=0.3))  # 6-hour window: 3 hours of samples are 50%


def test_advice_is_stored_once_and_not_repeated_while_it_stands(cluster):
    state(cluster, a=1, b=8)
    made = refresh(cluster, LEDGER, END)
    quota = {r.team: r for r in made if r.kind == "quota"}
    assert set(quota) == {"a", "b"} and all(r.status == PROPOSED and r.created for r in made)
    again = refresh(cluster, LEDGER, END + timedelta(hours=1))
    assert {r.id for r in again} == {r.id for r in made}  # same evidence, same advice: nothing new
    assert len(stored(cluster)) == len(made)


def test_cool_down_and_decisions(cluster):
    state(cluster, a=1, b=8)
    first = {r.team: r for r in refresh(cluster, LEDGER, END) if r.kind == "quota"}
    assert first["a"].action["guarantee_gpus"] == 2
    decide(cluster, first["a"].id, "accept", by="alice", note="looks right", now=END)
    applied = decide(cluster, first["a"].id, "applied", by="alice", now=END + timedelta(minutes=5))
    assert (applied.status, applied.decided_by) == (APPLIED, "alice") and applied.note == "looks right"
    with pytest.raises(DecisionError):
        decide(cluster, first["a"].id, "reject", by="bob")  # applied is final
    # the applied guarantee (2) is current now; the evidence still wants a raise, but the last advice for a is
    # under an hour old: nothing new within the cool-down
    assert quotas(cluster, LEDGER)[("a", "H100")].current == 2
    assert "a" not in {r.team for r in refresh(cluster, LEDGER, END + timedelta(minutes=30)) if r.kind == "quota"}
    shorter = replace(LEDGER, quota=replace(LEDGER.quota, cooldown_hours=0.5))
    later = {r.team: r for r in refresh(cluster, shorter, END + timedelta(hours=1)) if r.kind == "quota"}
    assert later["a"].action == {"guarantee_gpus": 3, "limit_gpus": 8.0, "current_guarantee_gpus": 2.0}
    history = stored(cluster, team="a")
    assert [r.status for r in history if r.kind == "quota"] == [PROPOSED, APPLIED]


def test_advice_no_longer_needed_is_superseded(cluster):
    state(cluster, a=4, b=8)
    b = next(r for r in refresh(cluster, LEDGER, END) if r.team == "b" and r.kind == "quota")
    decide(cluster, b.id, "accept", by="alice")
    assert stored(cluster, ids=[b.id])[0].status == ACCEPTED
    state(cluster, a=4, b=1)  # the site changed b's guarantee by hand to what the evidence wants
    refresh(cluster, LEDGER, END + timedelta(hours=1))
    assert stored(cluster, ids=[b.id])[0].status == SUPERSEDED


def test_rounding_never_lifts_an_over_served_team_past_its_fair_part(store):
    """a's fair part of 8 GPUs at a share of 1 in 10 is 0.8; it used far more, so it is not handed a whole GPU."""
    store.upsert_teams(pd.DataFrame({"team": ["a", "b"], "share": [1.0, 9.0], "quota_gpus": [0, 0]}))
    store.append_samples(table(*[gpu_rows("n", g, "H100", 180, util=90.0, job=f"a/{g}", team="a") for g in range(3)],
                               gpu_rows("n", 3, "H100", 180, util=90.0, job="b/1", team="b"),
                               *[gpu_rows("n", g, "H100", 180) for g in range(4, 8)]))
    a = quotas(store)[("a", "H100")]
    assert a.evidence["over_served"] and a.evidence["fair_share_gpus"] == pytest.approx(0.8)
    assert (a.status, a.guarantee) == ("hold", 0)


def test_a_team_starved_in_the_queue_is_not_cut_for_its_low_use(store):
    """starved holds one busy GPU because its jobs wait: a 4-GPU job waited 170 minutes and was given up, a 2-GPU
    job waited 140 before it started. Its use is low, but the waits are demand: its guarantee (its fair part) is
    kept, with the waits as evidence. Without the job records it would have been cut towards its one GPU."""
    store.upsert_teams(pd.DataFrame({"team": ["a", "starved"], "share": [1.0, 1.0], "quota_gpus": [4, 4]}))
    rows = [gpu_rows("n", g, "H100", 180, util=90.0, job=f"a/{g}", team="a") for g in range(6)]
    rows += [gpu_rows("n", 6, "H100", 180, util=90.0, job="starved/small", team="starved"),
             gpu_rows("n", 7, "H100", 180)]
    store.append_samples(table(*rows))
    store.set_team_quotas(pd.DataFrame({"team": ["a", "starved"], "gpu_model": ["H100", "H100"],
                                        "guarantee_gpus": [4.0, 4.0], "limit_gpus": [8.0, 8.0]}))
    blind = quotas(store)[("starved", "H100")]
    assert blind.guarantee < 4  # low use alone: cut
    store.upsert_jobs(pd.DataFrame([
        {"job_id": "slurm:1", "team": "starved", "gpu_model": "H100", "gpus": 4, "state": "cancelled",
         "submit_ts": T0, "end_ts": T0 + timedelta(minutes=170), "source": "slurm"},
        {"job_id": "slurm:2", "team": "starved", "gpu_model": "H100", "gpus": 2, "state": "running",
         "submit_ts": T0 + timedelta(minutes=30), "start_ts": T0 + timedelta(minutes=170), "source": "slurm"}]))
    seen = quotas(store)[("starved", "H100")]
    assert seen.guarantee >= 4, seen.reason
    assert seen.evidence["waiting_gpu_hours"] == pytest.approx((4 * 170 + 2 * 140) / 60)
    assert seen.evidence["mean_waiting_gpus"] == pytest.approx((4 * 170 + 2 * 140) / 60 / 3)
    assert seen.evidence["jobs_waited"] == 2 and seen.evidence["waits_from"] == ["slurm"]
    assert "waiting on average" in seen.reason
    assert quotas(store)[("a", "H100")].guarantee <= 4  # the over-served team is not raised past its fair part


def test_a_starved_team_under_its_fair_part_is_raised_towards_it(store):
    """The same starved team with a guarantee of 1, under its fair part of 4: its waits are demand, so the advice
    raises its guarantee (never past the fair part), with the waits named as evidence."""
    store.upsert_teams(pd.DataFrame({"team": ["a", "starved"], "share": [1.0, 1.0], "quota_gpus": [7, 1]}))
    rows = [gpu_rows("n", g, "H100", 180, util=90.0, job=f"a/{g}", team="a") for g in range(6)]
    rows += [gpu_rows("n", 6, "H100", 180, util=90.0, job="starved/small", team="starved"),
             gpu_rows("n", 7, "H100", 180)]
    store.append_samples(table(*rows))
    store.set_team_quotas(pd.DataFrame({"team": ["a", "starved"], "gpu_model": ["H100", "H100"],
                                        "guarantee_gpus": [7.0, 1.0], "limit_gpus": [8.0, 8.0]}))
    store.upsert_jobs(pd.DataFrame([
        {"job_id": "slurm:1", "team": "starved", "gpu_model": "H100", "gpus": 4, "state": "cancelled",
         "submit_ts": T0, "end_ts": T0 + timedelta(minutes=170), "source": "slurm"},
        {"job_id": "slurm:2", "team": "starved", "gpu_model": "H100", "gpus": 2, "state": "running",
         "submit_ts": T0 + timedelta(minutes=30), "start_ts": T0 + timedelta(minutes=170), "source": "slurm"}]))
    seen = quotas(store)[("starved", "H100")]
    assert 1 < seen.guarantee <= 4, seen.reason
    assert seen.evidence["jobs_waited"] == 2 and seen.evidence["waits_from"] == ["slurm"]


def test_while_advice_is_being_refreshed_a_request_gets_the_last_refresh_at_once(cluster):
    """The server refreshes the open advice in the background (deploy/server.py refresh_advice); a request made
    meanwhile is answered from the last refresh instead of waiting seconds for the new one."""
    import threading

    from gpuledger.policies.recommender import RecommendationService

    service = RecommendationService(cluster, WINDOW)
    first, recs = service.current()
    answered = []
    with service._lock:  # a refresh under way
        asker = threading.Thread(target=lambda: answered.append(service.current()))
        asker.start()
        asker.join(timeout=10)
        assert answered, "the request waited for the refresh"
    evaluation, again = answered[0]
    assert evaluation is first and [r.key for r in again] == [r.key for r in recs]


def test_the_servers_scheduled_refresh_evaluates_when_due(cluster):
    from gpuledger.deploy.server import refresh_advice
    from gpuledger.policies.recommender import RecommendationService

    service = RecommendationService(cluster, WINDOW)
    refresh_advice(service, cluster)
    assert service._evaluation is not None and not service.due(service._evaluation.at)
