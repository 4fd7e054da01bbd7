"""Advice an admin would apply (issue 39): the what-if first proves it reproduces the record (the backtest), the demo's
history is one its own quotas produced, and quota advice stands only with a calibrated net gain."""
from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from gpuledger.analytics.config import Config, WhatIfConfig
from gpuledger.analytics.report import _recommendations
from gpuledger.analytics.store import Store
from gpuledger.collector.simulator import default_simulator
from gpuledger.deploy.demo import DEMO_MARK, build_demo_store
from gpuledger.policies.quota import QuotaAdvice
from gpuledger.collector.samples import UNATTRIBUTED
from gpuledger.policies.recommendation import HELD_BACK, INSUFFICIENT_DATA
from gpuledger.policies.recommender import evaluate
from gpuledger.policies.whatif import SCHEDULER_RECLAIM, run_whatif
from gpuledger.policies.whatif.backtest import backtest
from gpuledger.policies.whatif.effects import _judge
from gpuledger.policies.whatif.workload import SimJob
from tests.helpers import api_client


@pytest.fixture(scope="module", params=[7, 3])
def demo(request, tmp_path_factory):
    """The demo's store as `gpuledger demo` builds it (14 days; samples every 30 minutes keep it quick)."""
    path = tmp_path_factory.mktemp(f"demo{request.param}") / "demo.duckdb"
    seeded = Store(path)
    seeded.set_meta(DEMO_MARK, "true")
    seeded.close()
    store, sim = build_demo_store(path, Config(), 14.0, request.param, 1800.0, echo=lambda *_: None)
    yield store, sim
    store.close()


def _end(sim) -> object:
    return sim.showcase


def test_the_demo_sites_quotas_cover_every_gpu_and_its_jobs_ran_under_them():
    sim = default_simulator(seed=5)
    quotas = sim.quota_frame()
    capacity = sim.capacity()
    unquoted = dict(sim.unquoted_gpus)
    assert unquoted  # the demo's story: a model whose quotas were not raised when it grew
    assert quotas.groupby("gpu_model")["guarantee_gpus"].sum().to_dict() == {
        m: float(n - unquoted.get(m, 0)) for m, n in capacity.items()}
    totals = quotas.groupby("team")["guarantee_gpus"].sum().to_dict()
    assert {r.team: r.quota_gpus for r in sim.team_frame().itertuples()} == {t: int(v) for t, v in totals.items()}
    # at every job start no team holds more of a model than its limit, and the cohort no more than its GPUs
    limit = {(r.team, r.gpu_model): r.limit_gpus for r in quotas.itertuples()}
    started = [j for j in sim.jobs if np.isfinite(j.start) and j.want_model]
    for job in started[::7]:
        held = sum(o.gpus for o in started if o.want_model == job.want_model and o.team == job.team
                   and o.start <= job.start < o.end)
        total = sum(o.gpus for o in started if o.want_model == job.want_model and o.start <= job.start < o.end)
        assert held <= limit.get((job.team, job.want_model), capacity[job.want_model])
        assert total <= capacity[job.want_model]
    # every job runs on GPUs of the model it asked for
    models = [n.model for n in sim.nodes]
    assert all(models[j.node] == j.want_model and all(models[n] == j.want_model for n, _ in j.also_on)
               for j in started)


def test_the_replay_of_the_demos_quotas_reproduces_its_measured_waits(demo):
    store, sim = demo
    end = _end(sim)
    answer = run_whatif(store, Config(), end - timedelta(days=14), end, use_recommendations=False).to_dict()
    tested = answer["backtest"]
    assert answer["calibrated"] and tested["calibrated"] and tested["teams_judged"] >= 4
    for row in tested["teams"]:
        if row["jobs"]["measured"] >= 20:
            measured, replayed = row["wait_p95_minutes"]["measured"], row["wait_p95_minutes"]["replayed"]
            assert abs(replayed - measured) <= max(30.0, 0.25 * measured), row
    assert not [n for n in answer["notes"] if "never start" in n and "proposed" not in n], answer["notes"]
    assert any("reclaimWithinCohort is 'never'" in n for n in answer["notes"])


def test_a_configuration_that_did_not_make_the_history_is_not_calibrated_and_no_advice_rests_on_it(demo):
    store, sim = demo
    end = _end(sim)
    config = Config(whatif=WhatIfConfig(backtest_minutes=0.0, backtest_fraction=0.0))
    was = store.meta(SCHEDULER_RECLAIM)
    store.set_meta(SCHEDULER_RECLAIM, "any")  # a scheduler that reclaims: not the one that ran the history
    try:
        answer = run_whatif(store, config, end - timedelta(days=14), end, use_recommendations=False).to_dict()
        assert not answer["calibrated"]
        assert any(n.startswith("uncalibrated: the replay of the quotas in force does not reproduce")
                   for n in answer["notes"])
        quota = evaluate(store, config, end).quota
        tested = [a for a in quota if "backtest" in a.evidence]
        assert tested and all(a.status == INSUFFICIENT_DATA for a in tested if not a.evidence["backtest"]["calibrated"])
        assert all("cannot be trusted" in a.reason for a in tested if a.status == INSUFFICIENT_DATA)
    finally:
        store.set_meta(SCHEDULER_RECLAIM, was)


def test_no_open_quota_advice_on_the_demo_harms_a_team_or_gains_nobody(demo):
    store, sim = demo
    config = Config()
    quota = evaluate(store, config, _end(sim)).quota
    proposed = [a for a in quota if a.status == "change"]
    for a in proposed:
        effect = a.evidence["simulated_effect"]
        assert effect["calibrated"] and effect["gains"], a.reason
        for row in [r for r in effect["gains"] + effect["pays"] if r["team"] != UNATTRIBUTED]:  # nobody's: no bound
            was, now = row["p95_wait_minutes"]["current"], row["p95_wait_minutes"]["proposed"]
            assert now - was <= max(config.whatif.harm_wait_minutes, config.whatif.harm_wait_fraction * was)
        assert "gains p95 wait" in a.reason and ("pays" in a.reason or "nobody pays" in a.reason)
    # a model's changes are one proposal that leaves no more GPUs under no guarantee than the quotas in force did
    by_model: dict[str, list[QuotaAdvice]] = {}
    for a in quota:
        by_model.setdefault(a.gpu_model, []).append(a)
    capacity = sim.capacity()
    for model, advice in by_model.items():
        if any(a.status == "change" for a in advice):
            after = sum(a.guarantee if a.guarantee is not None else (a.current or 0.0) for a in advice)
            assert sum(a.current or 0.0 for a in advice) <= after <= capacity[model], model
    # the demo's idle L4 GPUs under no guarantee: advised to the teams that wait, a gain with nobody paying
    stranded = [m for m, n in sim.unquoted_gpus]
    fixed = [a for a in proposed if a.gpu_model in stranded and a.guarantee > (a.current or 0.0)]
    assert fixed and all(p["team"] == UNATTRIBUTED for a in fixed for p in a.evidence["simulated_effect"]["pays"]), \
        [a.reason for a in quota]


def _figures(p95: float, mean: float) -> dict:
    return {"jobs": 30, "wait_p50_minutes": 0.0, "wait_p95_minutes": p95, "wait_mean_minutes": mean,
            "completion_p95_hours": 4.0, "preemptions": 0, "waited_gpu_hours": mean, "waited_usd": mean * 2.0}


def _advice() -> QuotaAdvice:
    return QuotaAdvice("nlp", "A100-80GB", "change", 3.0, 2, 8.0, evidence={}, reason="lower nlp")


class _Calibrated:
    calibrated, worst = True, None


def test_a_cut_that_lengthens_the_advised_teams_own_wait_is_held_back():
    a = _advice()
    before = {"nlp": _figures(458.0, 100.0), "vision": _figures(300.0, 50.0), "all": _figures(400.0, 80.0)}
    after = {"nlp": _figures(675.0, 160.0), "vision": _figures(300.0, 50.0), "all": _figures(500.0, 90.0)}
    _judge(a, before, after, WhatIfConfig(), pd.Timestamp("2026-11-01"), pd.Timestamp("2026-11-15"), 60, _Calibrated())
    assert a.status == HELD_BACK and "nlp's p95 wait would grow from 458 to 675" in a.reason
    assert a.evidence["simulated_effect"]["pays"][0]["team"] == "nlp"


def test_a_change_that_gains_nobody_is_not_advice_and_one_that_helps_names_who_gains_and_pays():
    a = _advice()
    same = {"nlp": _figures(458.0, 100.0), "vision": _figures(300.0, 50.0)}
    _judge(a, same, same, WhatIfConfig(), pd.Timestamp("2026-11-01"), pd.Timestamp("2026-11-15"), 60, _Calibrated())
    assert a.status == HELD_BACK and "gains nobody" in a.reason
    b = _advice()
    after = {"nlp": _figures(470.0, 104.0), "vision": _figures(200.0, 30.0)}
    _judge(b, same, after, WhatIfConfig(), pd.Timestamp("2026-11-01"), pd.Timestamp("2026-11-15"), 60, _Calibrated())
    effect = b.evidence["simulated_effect"]
    assert b.status == "change" and [g["team"] for g in effect["gains"]] == ["vision"]
    assert effect["gains"][0]["waited_usd_change"] == pytest.approx(-40.0)
    assert "gains p95 wait vision 300 -> 200 min" in b.reason


def test_the_backtest_judges_only_teams_with_enough_jobs_and_cuts_waits_at_the_window_end():
    jobs = [SimJob(i, f"j{i}", "a" if i < 25 else "b", "H100", 1, 0.0, 600.0, "training", recorded_start=60.0 * i)
            for i in range(30)]
    replayed = [SimJob(j.idx, j.job_id, j.team, j.model, j.gpus, j.submit, j.run, j.workload_class,
                       first_start=2 * 60.0 * j.idx, served_gpu_s=600.0) for j in jobs]
    tested = backtest(jobs, replayed, 3600.0, WhatIfConfig(backtest_minutes=5.0, backtest_fraction=0.1))
    rows = {r["team"]: r for r in tested.teams}
    assert rows["a"]["judged"] and not rows["b"]["judged"]  # 5 jobs: shown, not judged
    assert rows["a"]["wait_p95_minutes"]["replayed"] == pytest.approx(min(2 * 22.8, 60.0), abs=1.0)
    assert max(r["wait_p95_minutes"]["replayed"] for r in tested.teams) <= 60.0  # cut at the window's end
    assert not tested.calibrated and not rows["a"]["within_tolerance"]
    assert tested.worst["team"] in ("a", "all") and "p95 wait" in tested.why_not()
    # a replay that reproduces the record, but of too few jobs to tell: not calibrated, and it says so
    few = [SimJob(j.idx, j.job_id, j.team, j.model, j.gpus, j.submit, j.run, j.workload_class,
                  first_start=j.recorded_start, served_gpu_s=600.0) for j in jobs[:5]]
    small = backtest(jobs[:5], few, 3600.0, WhatIfConfig())
    assert not small.calibrated and small.judged == 0 and "too few jobs" in small.why_not()
    exact = [SimJob(j.idx, j.job_id, j.team, j.model, j.gpus, j.submit, j.run, j.workload_class,
                    first_start=j.recorded_start, served_gpu_s=600.0) for j in jobs]
    assert backtest(jobs, exact, 3600.0, WhatIfConfig()).calibrated


def test_post_whatif_carries_the_backtest_and_the_report_shows_each_advices_effect(demo):
    store, sim = demo
    end = _end(sim)
    with api_client(store, Config(), open_reads=True) as c:
        answer = c.post("/v1/whatif", json={"start": (end - timedelta(days=14)).isoformat(), "end": end.isoformat(),
                                            "use_recommendations": False}).json()
    assert answer["calibrated"] is True and answer["backtest"]["teams"]
    recs = pd.DataFrame([{"kind": "quota", "team": "nlp", "gpu_model": "H100", "status": "proposed",
                          "reason": "lower nlp", "evidence": {"simulated_effect": {
                              "calibrated": True, "backtest_worst": {"team": "nlp", "error_minutes": 3.0},
                              "gains": [{"team": "vision", "p95_wait_minutes": {"current": 300, "proposed": 200}}],
                              "pays": []}}}])
    page = _recommendations(recs, ["kind", "team", "gpu_model", "reason"])
    assert "gains: vision 300-&gt;200 min; pays: nobody; backtest calibrated, worst error +3 min (nlp)" in page \
        or "gains: vision 300->200 min; pays: nobody; backtest calibrated, worst error +3 min (nlp)" in page
    assert "proposed" in page


@pytest.mark.parametrize("model", ["kueue", "kai", "slurm"])
def test_replaying_the_window_under_the_emitted_plan_leaves_no_job_it_rules_out(demo, model):
    """The plan every target is emitted from (open advice applied, GPUs it leaves uncovered filled), replayed over
    the policy window by each scheduler model: no job waits because the plan rules it out (over its team's limit,
    over the Kueue cohort's nominal quota, over the GPUs present). Jobs still queued when the replay drains are a
    matter of capacity, not of the plan."""
    from gpuledger.analytics.job_replay import replay_jobs
    from gpuledger.policies.exporting import STATUSES
    from gpuledger.policies.quota_plan import applicable_plan
    from gpuledger.policies.whatif import half_life_s, never_started, present_capacity, replay
    from gpuledger.policies.whatif.workload import workload_of
    store, sim = demo
    config = Config()
    end = _end(sim)
    start = end - timedelta(days=config.quota.window_days)
    plan = applicable_plan(store, config, STATUSES["open"], at=end, fill=True)
    capacity = present_capacity(store, end)
    workload = workload_of(replay_jobs(store, start, end), start, end, capacity)
    assert len(workload.jobs) > 500
    jobs, _ = replay(workload, capacity, plan, model, config.whatif, (end - start).total_seconds(),
                     half_life_s(config))
    ruled_out = [n for n in never_started(jobs, plan, capacity, model, "emitted") if "still waited" not in n]
    assert not ruled_out, ruled_out
    assert sum(j.first_start is not None for j in jobs) >= 0.9 * len(jobs)
