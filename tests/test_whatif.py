"""What-if (issue 25): the scheduler models on hand-checkable workloads, invariants on a random one, and the whole
path (job records in a real DuckDB store -> replay -> CLI, API, quota advice evidence)."""
from __future__ import annotations

import json
import subprocess
from datetime import timedelta

import numpy as np
import pytest

from gpuledger.analytics.config import WHATIF_MODELS, Config, TeamConfig, WhatIfConfig
from gpuledger.analytics.store import Store
from gpuledger.collector.errors import InputError
from gpuledger.collector.jobs.lifecycle import events_of, jobs_frame
from gpuledger.deploy.api.models import Recommendation as RecommendationModel
from gpuledger.policies.quota import QuotaAdvice
from gpuledger.policies.quota_plan import QuotaPlan, TeamPlan
from gpuledger.policies.recommendation import HELD_BACK
from gpuledger.policies.recommender import quota_recommendation
from gpuledger.policies.whatif import figures_of, replay, run_whatif
from gpuledger.policies.whatif.effects import simulate_effects
from gpuledger.policies.whatif.kai_like import fair_shares
from gpuledger.policies.whatif.workload import SimJob, Workload
from tests.helpers import T0, api_client, gpu_rows, table
from tests.procs import GPULEDGER

DAY = 86400.0


def jobs(*specs: tuple[str, int, float, float]) -> Workload:
    """(team, GPUs, submitted at s, runs s) per job, all on H100."""
    return Workload([SimJob(i, f"j{i}", team, "H100", gpus, submit, run, "training")
                     for i, (team, gpus, submit, run) in enumerate(specs)])


def plan(guarantees: dict[str, float], limits: dict[str, float], gpus: int = 2, shares=None) -> QuotaPlan:
    teams = sorted(set(guarantees) | set(limits))
    return QuotaPlan([TeamPlan(t, (shares or {}).get(t, 1.0), None,
                               {"H100": guarantees[t]} if t in guarantees else {},
                               {"H100": limits[t]} if t in limits else {}) for t in teams],
                     {"H100": gpus}, T0)


def run(workload: Workload, quotas: QuotaPlan, model: str, gpus: int = 2, **settings) -> dict[str, SimJob]:
    done, _ = replay(workload, {"H100": gpus}, quotas, model, WhatIfConfig(**settings), DAY, 7 * DAY)
    return {j.job_id: j for j in done}


def waits(done: dict[str, SimJob]) -> list[float]:
    return [done[k].first_start - done[k].submit for k in sorted(done, key=lambda k: int(k[1:]))]


def test_slurm_like_grptres_limits_serialise_a_team_and_block_nobody_else():
    work = jobs(("a", 1, 0, 8), ("a", 1, 0, 8), ("a", 1, 0, 8), ("b", 1, 0, 8))
    assert waits(run(work, plan({}, {"a": 1, "b": 1}), "slurm")) == [0, 8, 16, 0]
    assert waits(run(work, plan({}, {"a": 2, "b": 2}), "slurm")) == [0, 0, 8, 8]


def test_slurm_like_starts_a_submission_at_once_and_freed_gpus_at_the_next_pass():
    """slurmctld tries a submitted job when it arrives, but hands GPUs a job frees to waiting jobs at its next
    scheduling pass: `slurm_pass_delay_s` after the end. Over a chain of starts the delays add up."""
    work = jobs(("a", 1, 0, 8), ("a", 1, 0, 8), ("a", 1, 0, 8), ("b", 1, 5, 8))
    assert waits(run(work, plan({}, {"a": 1, "b": 1}), "slurm", slurm_pass_delay_s=1.0)) == [0, 9, 18, 0]
    # no pass delay: each start at the instant the GPU is free
    assert waits(run(work, plan({}, {"a": 1, "b": 1}), "slurm")) == [0, 8, 16, 0]
    # the other models reconcile at once whatever the setting says (it is Slurm's)
    assert waits(run(work, plan({"a": 1, "b": 1}, {"a": 1, "b": 1}), "kueue", slurm_pass_delay_s=1.0)) == [0, 8, 16, 0]


def test_slurm_like_backfills_a_short_job_but_not_one_that_would_delay_the_reservation():
    # 4 GPUs: a 2-GPU job runs until 100; a 4-GPU job waits for it (shadow 100); 2 GPUs are free until then
    base = [("a", 2, 0, 100), ("b", 4, 1, 50)]
    short = run(jobs(*base, ("c", 2, 2, 50)), plan({}, {}, 4), "slurm", gpus=4, slurm_age_weight=0.0)
    assert short["j2"].first_start == 2 and short["j1"].first_start == 100  # ends at 52: backfilled
    long = run(jobs(*base, ("c", 2, 2, 500)), plan({}, {}, 4), "slurm", gpus=4, slurm_age_weight=0.0)
    assert long["j1"].first_start == 100 and long["j2"].first_start == 150  # would hold the reservation's GPUs


def test_kueue_like_a_team_within_its_nominal_quota_reclaims_from_a_borrower():
    # b borrows both GPUs (nominal 1 each); a's job fits a's nominal quota: b's newest job is evicted
    work = jobs(("b", 1, 0, 100), ("b", 1, 1, 100), ("a", 1, 10, 10))
    done = run(work, plan({"a": 1, "b": 1}, {"a": 2, "b": 2}), "kueue")
    assert done["j2"].first_start == 10 and done["j1"].preemptions == 1
    assert done["j1"].lost_gpu_s == pytest.approx(9.0) and done["j1"].end == 20 + 100
    never = run(work, plan({"a": 1, "b": 1}, {"a": 2, "b": 2}), "kueue", kueue_reclaim="never")
    assert never["j2"].first_start == 100 and never["j1"].preemptions == 0


def test_kueue_like_admits_no_more_than_the_cohorts_nominal_quota():
    done = run(jobs(("a", 1, 0, 10), ("a", 1, 0, 10)), plan({"a": 1}, {"a": 2}, 4), "kueue", gpus=4)
    assert waits(done) == [0, 10]  # four GPUs present, one under quota


def test_kai_like_fair_shares_give_deserved_first_then_split_by_weight():
    fair = fair_shares({"a": 10, "b": 10, "c": 1}, {"a": 2, "b": 0, "c": 0}, {"a": 10, "b": 10, "c": 10},
                       {"a": 1, "b": 3, "c": 1}, 10)
    assert fair["a"] == pytest.approx(2 + 7 / 4 * 1 + (7 - 7 / 4 * 4 - 1 + 7 / 5) * 0 + fair["a"] - fair["a"])
    assert fair["c"] == pytest.approx(1.0) and sum(fair.values()) == pytest.approx(10.0)
    assert fair["b"] == pytest.approx(3 * (fair["a"] - 2))  # the rest split 1:3


def test_kai_like_reclaims_for_a_team_under_its_fair_share():
    work = jobs(("b", 1, 0, 100), ("b", 1, 1, 100), ("a", 1, 10, 10))
    done = run(work, plan({"a": 1, "b": 1}, {"a": 2, "b": 2}), "kai")
    assert done["j2"].first_start == 10 and done["j1"].preemptions == 1


@pytest.mark.parametrize("model", WHATIF_MODELS)
def test_no_model_runs_more_gpus_than_present_or_a_team_over_its_limit(model):
    rng = np.random.default_rng(5)
    specs = [(f"t{rng.integers(3)}", int(rng.choice([1, 2, 4, 8])), float(rng.uniform(0, DAY)),
              float(rng.lognormal(7, 1))) for _ in range(400)]
    quotas = plan({"t0": 4, "t1": 8, "t2": 4}, {"t0": 12, "t1": 16, "t2": 8}, 16)
    done = run(jobs(*specs), quotas, model, gpus=16)
    events = sorted([(j.first_start if not j.preemptions else j.start, j.gpus, j.team) for j in done.values()]
                    + [(j.end, -j.gpus, j.team) for j in done.values() if j.end is not None])
    held, by_team = 0, {}
    for _, gpus, team in events:  # ends sort before starts at the same instant (negative GPUs first)
        held += gpus
        by_team[team] = by_team.get(team, 0) + gpus
        assert held <= 16 and by_team[team] <= quotas.limit_of(next(t for t in quotas.teams if t.team == team),
                                                               "H100")
    for job in done.values():
        assert job.first_start >= job.submit
        if job.end is not None:
            assert job.end - job.start == pytest.approx(job.run)  # its whole run after its last start
    if model == "slurm":
        assert not any(j.preemptions for j in done.values())
    figures = figures_of(list(done.values()), 7 * DAY)
    assert figures["all"]["jobs"] == 400 and figures["all"]["started"] + figures["all"]["still_waiting"] == 400


# -- the whole path, over a real store

AT = T0 + timedelta(days=2)


@pytest.fixture
def job_store(tmp_path):
    """Two teams on one node of two H100s for two days: nlp's three jobs at once and vision's one, twice a day."""
    store = Store(tmp_path / "whatif.duckdb")
    config = Config(teams={"nlp": TeamConfig(share=1, guarantee={"H100": 1}, limit={"H100": 1}),
                           "vision": TeamConfig(share=1, guarantee={"H100": 1}, limit={"H100": 1})})
    store.upsert_teams(config.team_frame())
    store.set_team_quotas(config.quota_frame())
    # the node's GPUs (what is present); which team held them is the job records' to say
    store.append_samples(table(*(gpu_rows("n1", g, "H100", 60 * 48, step_s=300, start=T0) for g in range(2))))
    store.fold()  # whole now: a bounded fold left behind on a loaded machine made the API answer 503 (catching up)
    records, n = [], 0
    for half_day in range(4):
        at = T0 + timedelta(hours=12 * half_day)
        for i, team in enumerate(["nlp", "nlp", "nlp", "vision"]):
            wait = {0: 0, 1: 3600, 2: 7200, 3: 0}[i]
            start = at + timedelta(seconds=wait)
            records.append({"job_id": f"s:{n}", "team": team, "gpu_model": "H100", "gpus": 1, "submit_ts": at,
                            "start_ts": start, "end_ts": start + timedelta(hours=1), "state": "completed",
                            "source": "test"})
            n += 1
    frame = jobs_frame(records)
    store.record_jobs(frame, events_of(frame))
    yield store, config
    store.close()


def test_a_raised_limit_is_replayed_with_each_teams_waits_under_both(job_store):
    store, config = job_store
    answer = run_whatif(store, config, T0, AT, "slurm", {"nlp": {"H100": {"limit": 2}}}, use_recommendations=False)
    figures = answer.figures
    assert answer.to_dict()["jobs"] == 16
    # one GPU at a time: nlp's three jobs wait 0, 60 and 120 minutes each half-day
    assert figures["current"]["nlp"]["wait_p95_minutes"] == pytest.approx(np.quantile([0, 60, 120] * 4, 0.95))
    assert figures["proposed"]["nlp"]["wait_p95_minutes"] < figures["current"]["nlp"]["wait_p95_minutes"]
    assert figures["proposed"]["vision"]["wait_p95_minutes"] > figures["current"]["vision"]["wait_p95_minutes"]
    assert answer.difference()["nlp"]["gpu_hours"] == pytest.approx(0.0)  # the same work, served sooner


def test_bad_proposals_and_windows_answer_with_the_reason(job_store):
    store, config = job_store
    with pytest.raises(InputError, match="exceed capacity: H100 guarantees add up to 3"):
        run_whatif(store, config, T0, AT, "kueue", {"nlp": {"H100": {"guarantee": 2, "limit": 2}}},
                   use_recommendations=False)
    with pytest.raises(InputError, match="unknown team 'ghost'"):
        run_whatif(store, config, T0, AT, "kueue", {"ghost": {"H100": {"guarantee": 1}}})
    with pytest.raises(InputError, match="no job records between"):
        run_whatif(store, config, AT + timedelta(days=1), AT + timedelta(days=2), capacity={"H100": 2})


def test_the_cli_prints_per_team_waits_and_refuses_a_bad_set(job_store, tmp_path):
    store, config = job_store
    db = store.path
    store.close()
    end = AT.isoformat()
    out = subprocess.run([GPULEDGER, "whatif", "--db", str(db), "--end", end, "--days", "2", "--model", "slurm",
                          "--set", "nlp:H100=1/2", "--no-recommendations"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.split()}
    assert "slurm-like" in out.stdout and "nlp H100 guarantee 1 -> 1, limit 1 -> 2" in out.stdout
    assert "120 ->" in lines["nlp"] and "vision" in lines
    as_json = subprocess.run([GPULEDGER, "whatif", "--db", str(db), "--end", end, "--days", "2", "--json",
                              "--no-recommendations"], capture_output=True, text=True, timeout=120)
    assert json.loads(as_json.stdout)["configurations"]["current"]["teams"]["nlp"]["jobs"] == 12
    bad = subprocess.run([GPULEDGER, "whatif", "--db", str(db), "--end", end, "--set", "nlp:H100=lots"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "expected TEAM:MODEL=GUARANTEE" in bad.stderr


def test_post_whatif_answers_both_configurations_and_422s_a_proposal_over_capacity(job_store):
    store, config = job_store
    with api_client(store, config, open_reads=True) as c:
        body = {"model": "kai", "start": T0.isoformat(), "end": AT.isoformat(), "use_recommendations": False,
                "edits": {"nlp": {"H100": {"limit": 2}}}}
        answer = c.post("/v1/whatif", json=body)
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert set(got["configurations"]) == {"current", "proposed"} and got["jobs"] == 16
        assert got["configurations"]["current"]["teams"]["vision"]["wait_p50_minutes"] is not None
        over = c.post("/v1/whatif", json={**body, "edits": {"nlp": {"H100": {"guarantee": 5, "limit": 5}}}})
        assert over.status_code == 422 and "exceed capacity" in over.json()["detail"]
        for model in WHATIF_MODELS:
            assert c.post("/v1/whatif", json={**body, "model": model}).status_code == 200
        assert c.post("/v1/whatif", json={**body, "model": "yarn"}).status_code == 422


def test_a_limit_raise_that_lengthens_another_teams_waits_is_held_back_with_its_numbers(job_store):
    store, config = job_store
    advice = QuotaAdvice("nlp", "H100", "change", 1.0, guarantee=1, limit=2, evidence={}, reason="raise nlp")
    # 16 jobs, too few for the backtest's default: judged on every job, within any error (the harm is the point)
    trusted = {"backtest_min_jobs": 1, "backtest_minutes": 1e6}
    config = Config(teams=config.teams, whatif=WhatIfConfig(model="slurm", harm_wait_minutes=10, **trusted))
    [held] = simulate_effects(store, config, AT, [advice])
    effect = held.evidence["simulated_effect"]
    # vision waits an hour once: the first half-day, before nlp's usage lowers nlp's fair-share priority
    grown = f"vision's p95 wait would grow from 0 to {np.quantile([60, 0, 0, 0], 0.95):.0f} minutes"
    assert held.status == HELD_BACK and grown in held.reason
    assert effect["team"]["wait_p95_minutes"]["proposed"] < effect["team"]["wait_p95_minutes"]["current"]
    assert effect["most_harmed"]["team"] == "vision" and effect["jobs_replayed"] == 16
    shown = RecommendationModel.model_validate(quota_recommendation(held).to_dict())  # what the API serves
    assert shown.status == HELD_BACK
    lenient = Config(teams=config.teams, whatif=WhatIfConfig(model="slurm", harm_wait_minutes=120, **trusted))
    advice = QuotaAdvice("nlp", "H100", "change", 1.0, guarantee=1, limit=2, evidence={}, reason="raise nlp")
    [kept] = simulate_effects(store, lenient, AT, [advice])
    assert kept.status == "change" and "simulated (slurm-like, policy window)" in kept.reason


def test_without_job_records_the_effect_is_unknown_not_zero(tmp_path):
    with Store(tmp_path / "empty.duckdb") as store:
        advice = QuotaAdvice("nlp", "H100", "change", 1.0, guarantee=2, limit=2, evidence={}, reason="raise")
        [same] = simulate_effects(store, Config(), AT, [advice])
    assert same.status == "change" and "simulated_effect" not in same.evidence
    assert same.evidence["simulated_effect_unknown"] == "no job records in the policy window to replay"


# -- placement what-if

def test_a_gang_starts_only_when_every_task_is_placed_and_holds_nothing_while_it_waits():
    from gpuledger.analytics.fragmentation import NodeArrays, TaskShape, Workload
    from gpuledger.policies.whatif.placement import Arrival, emptied, replay_placement, tasks_for

    big = 1 << 40
    nodes = emptied(NodeArrays(["a", "b"], np.array(["H100", "H100"], dtype=object), np.array([big, big]),
                               np.array([big, big]), np.zeros((2, 4), dtype=np.int64), np.array([4, 4])))
    gang = tasks_for(8, "H100", 4, "gang")
    assert [t.shape.gpus for t in gang] == [4, 4]
    arrivals = [Arrival("one", tasks_for(3, "H100", 4, "one"), 0, 100, 0),
                Arrival("gang", gang, 1, 50, 500),
                Arrival("small", tasks_for(1, "H100", 4, "small"), 2, 10, 0)]
    workload = Workload((TaskShape(0, 1000, 1, frozenset({"H100"})),), (1.0,))
    for policy in ("fgd", "bestfit", "dotprod", "random"):
        got = replay_placement(nodes, arrivals, policy, workload, {"H100": 2.0}, 1000)
        assert got["started"] == 3 and got["still_waiting"] == 0
        # the gang waited for "one" to end (99 s, not its recorded 500): started earlier than the record says
        assert got["gang_jobs_started_earlier"] == 1 and got["wait_p95_minutes"] <= 99 / 60 + 1e-9
        assert 0 <= got["fragmented_share"] <= 1 and 0 < got["allocated_share"] <= 1
        assert got["stranded_usd"] == pytest.approx(got["stranded_gpu_hours"] * 2.0)


def test_the_placement_whatif_counts_tasks_split_over_islands_and_replays_keeping_them_inside_one():
    """One node, two NVLink islands of 4 GPUs. A 2-GPU job takes the first GPUs; a 4-GPU job arriving next gets
    GPUs 2-5 from best fit (across both islands) and island 1 (GPUs 4-7) when kept within islands; with no
    topology the split is unknown, not zero."""
    from gpuledger.analytics.fragmentation import NodeArrays, TaskShape, Workload
    from gpuledger.policies.whatif.placement import Arrival, compare_placers, emptied, replay_placement, tasks_for

    big = 1 << 40
    nodes = emptied(NodeArrays(["a"], np.array(["H100"], dtype=object), np.array([big]), np.array([big]),
                               np.zeros((1, 8), dtype=np.int64), np.array([8])))
    arrivals = [Arrival("two", tasks_for(2, "H100", 8, "two"), 0, 100, 0),
                Arrival("four", tasks_for(4, "H100", 8, "four"), 1, 50, 0)]
    workload = Workload((TaskShape(0, 1000, 1, frozenset({"H100"})),), (1.0,))
    islands = [np.array([0, 0, 0, 0, 1, 1, 1, 1])]
    plain = replay_placement(nodes, arrivals, "bestfit", workload, {}, 1000, islands=islands)
    assert (plain["multi_gpu_tasks"], plain["split_tasks"], plain["kept_within_islands"]) == (2, 1, False)
    for policy in ("fgd", "bestfit", "dotprod", "random"):
        kept = replay_placement(nodes, arrivals, policy, workload, {}, 1000, islands=islands, keep_within=True)
        assert (kept["multi_gpu_tasks"], kept["split_tasks"], kept["started"]) == (2, 0, 2), policy
    unknown = replay_placement(nodes, arrivals, "bestfit", workload, {}, 1000)
    assert unknown["split_tasks"] is None and unknown["unknown_topology_tasks"] == 2
    both = compare_placers(nodes, arrivals, ["fgd", "bestfit"], workload, {}, 1000, islands=islands)
    assert [(p["policy"], p["kept_within_islands"]) for p in both] == [
        ("fgd", False), ("fgd", True), ("bestfit", False), ("bestfit", True)]
    assert len(compare_placers(nodes, arrivals, ["fgd"], workload, {}, 1000, islands=[np.full(8, -1)])) == 1


def test_post_whatif_placement_answers_every_placer_and_refuses_bad_ones(job_store):
    store, config = job_store
    with api_client(store, config, open_reads=True) as c:
        body = {"start": T0.isoformat(), "end": AT.isoformat()}
        answer = c.post("/v1/whatif/placement", json=body)
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert [p["policy"] for p in got["placers"]] == ["fgd", "bestfit", "dotprod", "random"]
        assert got["jobs"] == 16 and got["gpus"] == 2
        for placer in got["placers"]:
            assert placer["started"] == 16 and 0 <= placer["allocated_share"] <= 1
        assert c.post("/v1/whatif/placement", json={**body, "placers": ["yarn"]}).status_code == 422
        empty = c.post("/v1/whatif/placement", json={"start": (AT + timedelta(hours=1)).isoformat(),
                                                     "end": (AT + timedelta(hours=2)).isoformat()})
        assert empty.status_code == 422


def test_jobs_a_configuration_can_never_start_are_counted_with_the_reason():
    from gpuledger.policies.whatif import never_started
    quotas = plan({"a": 1}, {"a": 2}, 2)  # Kueue: the cohort holds one GPU of nominal quota, two are present
    done, _ = replay(jobs(("a", 2, 0, 10), ("a", 1, 0, 10)), {"H100": 2}, quotas, "kueue", WhatIfConfig(), DAY,
                     2 * DAY)
    assert [j.first_start for j in done] == [None, 0]
    assert never_started(done, quotas, {"H100": 2}, "kueue", "the quotas in force") == [
        "the quotas in force: 1 job(s) never start: they ask more H100 GPUs than the Kueue cohort holds in nominal "
        "quota (1)"]


def test_a_window_longer_than_the_history_starts_at_the_first_evidence(job_store):
    store, config = job_store
    answer = run_whatif(store, config, T0 - timedelta(days=12), AT, "slurm", use_recommendations=False)
    assert answer.start == T0 and any(n.startswith("the window starts at 2026-11-02 00:00 UTC") for n in answer.notes)
    assert answer.utilisation["current"] == pytest.approx(16 / (2 * 48))  # 16 one-GPU hours of 2 GPUs x 48 h
