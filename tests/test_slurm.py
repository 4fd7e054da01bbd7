"""Against a real Slurm (Debian's slurmctld, slurmd, slurmdbd, munge and MariaDB): the emitted sacctmgr script
applies and reads back, gpuledger's Fair Tree gives the factors `sshare -l` gives on the same usage, and the jobs
`sacct -P` reports (completed, failed, timed out, cancelled, pending with a reason) are stored as it reports them."""
from __future__ import annotations

import math
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest

from gpuledger.analytics.config import WhatIfConfig
from gpuledger.analytics.job_replay import prior_usage, replay_jobs
from gpuledger.analytics.store import Store
from gpuledger.analytics.workloads import outcomes, waiting_now, workload_summary
from gpuledger.collector.jobs.sacct import parse_sacct
from gpuledger.collector.jobs.squeue import parse_squeue
from gpuledger.collector.jobs.sacctmgr import parse_sacctmgr
from gpuledger.collector.jobs.slurm_commands import SlurmLifecycle
from gpuledger.policies.emitters import emitter_for
from gpuledger.policies.emitters.slurm import CURRENT_FORMAT, parse_current
from gpuledger.policies.fairshare.slurm_fair_tree import tree_from_associations, tree_rows
from gpuledger.policies.quota_plan import QuotaPlan, TeamPlan
from gpuledger.policies.whatif import replay
from gpuledger.policies.whatif.workload import workload_of
from gpuledger.analytics.config import Config
from gpuledger.deploy.job_loop import JobLoop
from gpuledger.deploy.jobs_agent import SlurmSender
from gpuledger.deploy.server import ApiServer
from gpuledger.deploy.token_admin import RemoteAdmin
from tests.procs import GPULEDGER, wait_until
from tests.slurm_cluster import SlurmCluster, require_slurm

PLAN = QuotaPlan(teams=[TeamPlan("vision", 30, "ml", {"H100": 1}, {"H100": 2, "L4": 1}),
                        TeamPlan("nlp", 10, "ml", {"H100": 1}, {"H100": 1}),
                        TeamPlan("research", 20, None, {"L4": 1}, {"L4": 1})],
                 capacity={"H100": 2, "L4": 1}, made=datetime(2026, 12, 1, tzinfo=timezone.utc))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    require_slurm()
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        script = cluster.root / "plan.sh"
        script.write_text(emitter_for("slurm").emit(PLAN).text)
        cluster.run("sh", str(script))
        cluster.run("sacctmgr", "-i", "add", "user", "root", "account=vision,nlp,research")
        # a job that will time out (Slurm's smallest limit is a minute): submitted first, so the minute passes
        # while the other tests run (test_sacct_history_gives_states_waits_gpus_and_reasons reads it at the end)
        cluster.timeout_job = cluster.run("sbatch", "-A", "research", "--gres=gpu:l4:1", "-c", "1", "--time=1",
                                          "-o", "/dev/null", "--parsable", "--wrap", "sleep 600").stdout.strip()
        yield cluster
    finally:
        cluster.stop()


def associations(cluster: SlurmCluster) -> str:
    return cluster.run("sacctmgr", "-nP", "show", "assoc", f"format={CURRENT_FORMAT}").stdout


def test_the_emitted_sacctmgr_script_applies_and_reads_back(slurm):
    accounts = parse_current(associations(slurm))
    assert accounts["ml"]["fairshare"] == "40" and accounts["ml"]["parent"] == "root"
    assert accounts["vision"]["parent"] == "ml" and accounts["vision"]["fairshare"] == "30"
    assert accounts["vision"]["grp_tres"] == {"gres/gpu:h100": "2", "gres/gpu:l4": "1"}
    assert accounts["research"]["grp_tres"] == {"gres/gpu:l4": "1"}
    assert emitter_for("slurm").emit(PLAN, associations(slurm)).objects == []  # applied: nothing left to change
    # `gpuledger import sacctmgr` reads the real sacctmgr's output, with -n and with its own header, the same
    with_header = slurm.run("sacctmgr", "-P", "show", "assoc", f"format={CURRENT_FORMAT}").stdout
    for text in (associations(slurm), with_header):
        rows = parse_sacctmgr(text, datetime.now(timezone.utc)).rows
        limits = {(r.queue, r.flavor): r.value for r in rows[rows["figure"] == "limit_gpus"].itertuples()}
        assert limits == {("vision", "h100"): 2.0, ("vision", "l4"): 1.0, ("nlp", "h100"): 1.0,
                          ("research", "l4"): 1.0}, limits
        shares = rows[rows["figure"] == "fairshare_shares"].set_index("queue")["value"]
        assert (shares["vision"], shares["ml"]) == (30.0, 40.0)


def test_a_changed_plan_modifies_only_what_differs_and_slurm_enforces_it(slurm):
    changed = QuotaPlan(teams=[TeamPlan("vision", 30, "ml", {"H100": 1}, {"H100": 1, "L4": 1})] + PLAN.teams[1:],
                        capacity=PLAN.capacity, made=PLAN.made)
    delta = emitter_for("slurm").emit(changed, associations(slurm))
    assert [r["account"] for r in delta.objects] == ["vision"]
    script = slurm.root / "delta.sh"
    script.write_text(delta.text)
    slurm.run("sh", str(script))
    assert parse_current(associations(slurm))["vision"]["grp_tres"]["gres/gpu:h100"] == "1"
    # two H100s asked under a one-H100 limit: Slurm holds the job on the association's GPU limit
    job = slurm.run("sbatch", "-A", "vision", "--gres=gpu:h100:2", "-o", "/dev/null", "--parsable",
                    "--wrap", "true").stdout.strip()
    state = wait_until(lambda: _job_state(slurm, job), 60, "the scheduler to look at the job")
    assert state[0] == "PENDING" and ("AssocGrpGRES" in state[1] or "AssocGrpTRES" in state[1]), state
    slurm.run("scancel", job)
    slurm.run("sh", str(slurm.root / "plan.sh"))  # back to the plan the other test expects


def _job_state(cluster: SlurmCluster, job: str) -> tuple[str, str] | None:
    """(state, reason) once the scheduler has looked at the job (a reason other than None, or it left the queue)."""
    shown = cluster.run("squeue", "-h", "-j", job, "-o", "%T|%r", check=False).stdout.strip()
    if not shown:
        return ("GONE", "")
    state, _, reason = shown.partition("|")
    return (state, reason) if reason != "None" else None


def _sshare(cluster: SlurmCluster) -> list[dict]:
    lines = cluster.run("sshare", "-lP", "-a").stdout.splitlines()
    head = lines[0].split("|")
    return [dict(zip(head, line.split("|"))) for line in lines[1:]]


def test_fair_tree_matches_sshare_on_the_same_usage(slurm):
    # vision's 16 s against nlp's 1 s: well over vision's 30:10 share even when a slow machine adds seconds of
    # start-up to every job (4 s against 2 s once failed that way: 0.92 instead of over 1)
    for account, seconds in (("vision", 8), ("vision", 8), ("nlp", 1)):
        slurm.run("sbatch", "-A", account, "--gres=gpu:h100:1", "-c", "1", "-o", "/dev/null", "--wrap",
                  f"sleep {seconds}")
    last: list[list[dict]] = []

    def settled():  # the priority thread recomputes shares every PriorityCalcPeriod (a minute)
        rows = _sshare(slurm)
        done = not slurm.run("squeue", "-h", "-A", "vision,nlp").stdout.strip()
        used = [r for r in rows if r["User"] and r["Account"].strip() in ("vision", "nlp")]
        charged = done and used and all(float(r["EffectvUsage"] or 0) > 0 for r in used)
        steady = charged and last and last[-1] == rows  # every job's usage charged: two readings agree
        last.append(rows)
        return rows if steady else None

    rows = wait_until(settled, 150, "sshare to show the jobs' usage", step_s=2)
    listed = [{"account": r["Account"].strip(), "user": r["User"] or None, "raw_shares": r["RawShares"],
               "usage": float(r["NormUsage"] or 0), "depth": len(r["Account"]) - len(r["Account"].lstrip(" ")),
               "slurm": r} for r in rows if r["Account"] != "root" or r["User"]]
    ours = tree_rows(tree_from_associations(listed))
    assert len(ours) == len(listed)
    for mine, theirs in zip(ours.to_dict(orient="records"), (row["slurm"] for row in listed)):
        where = f"{theirs['Account'].strip()}/{theirs['User']}"
        assert mine["norm_shares"] == pytest.approx(float(theirs["NormShares"]), abs=2e-6), where
        if theirs["User"]:
            assert mine["fairshare"] == pytest.approx(float(theirs["FairShare"]), abs=2e-6), where
        if theirs["LevelFS"] == "inf":
            assert math.isinf(mine["level_fs"]), where
        else:  # Slurm prints usage rounded to six places: LevelFS agrees to that precision
            assert mine["level_fs"] == pytest.approx(float(theirs["LevelFS"]), rel=1e-4), where
    levels = {r["account"]: r["level_fs"] for r in ours.to_dict(orient="records") if not isinstance(r["user"], str)}
    assert levels["nlp"] > 1 > levels["vision"]  # vision used more than its 30:10 share of ml


SACCT_FIELDS = "JobID,State,Submit,Eligible,Start,End,Account,User,Partition,QOS,NodeList,AllocTRES,ReqTRES," \
               "Reason,ExitCode,JobName"
SQUEUE_FORMAT = "%i|%T|%V|%a|%u|%P|%q|%b|%r|%j|%D|%S"


def _sacct(cluster: SlurmCluster) -> str:
    return subprocess.run(["sacct", "-aP", "-S", "now-1hour", "-o", SACCT_FIELDS], capture_output=True, text=True,
                          env=dict(cluster.env, TZ="UTC"), timeout=60, check=True).stdout


def test_sacct_history_gives_states_waits_gpus_and_reasons(slurm, tmp_path):
    def submit(account: str, gres: str, *args: str) -> str:
        return slurm.run("sbatch", "-A", account, f"--gres=gpu:{gres}", "-c", "1", "-o", "/dev/null", "--parsable",
                         *args).stdout.strip()

    # the continuous source (`serve --jobs-from slurm`) reads while the jobs are submitted, run, fail and are
    # cancelled; at the end its store must hold what sacct's final record says (issue 41 item 3)
    live = Store(tmp_path / "live.duckdb")
    loop = JobLoop(SlurmLifecycle(since=timedelta(hours=2), env=slurm.env), live, 1.0)
    # and a sender on the "controller" (`gpuledger jobs-agent`) pushes its reads to a server on another port
    # (POST /v1/jobs/slurm), which must end with the same jobs
    remote_store = Store(tmp_path / "remote.duckdb")
    remote = ApiServer(remote_store, Config(), port=0, token="slurm-admin")
    sender = SlurmSender(SlurmLifecycle(since=timedelta(hours=2), env=slurm.env),
                         RemoteAdmin(remote.start(), "slurm-admin"), 1.0)

    def read_both() -> None:
        loop.read_once()
        sender.send_once()

    read_both()
    done = submit("vision", "h100:1", "--wrap", "true")
    failed = submit("vision", "h100:1", "--wrap", "exit 3")
    cancelled = submit("vision", "h100:1", "--wrap", "sleep 300")
    held = submit("nlp", "h100:1", "--begin=now+1hour", "--wrap", "true")  # waits for its begin time
    read_both()
    wait_until(lambda: slurm.run("squeue", "-h", "-j", cancelled, "-o", "%T", check=False).stdout.strip()
               == "RUNNING", 60, "the job to be cancelled to run")
    read_both()
    slurm.run("scancel", cancelled)
    def ended() -> bool:
        states = parse_sacct(_sacct(slurm)).jobs.set_index("job_id")["state"]
        return all(states.get(f"slurm:{job}") not in (None, "pending", "running")
                   for job in (done, failed, cancelled, slurm.timeout_job))

    wait_until(ended, 180, "the jobs to end (the timeout job's minute)", step_s=2)
    # sacct lists a job held for a later begin time only once it is eligible: the queue comes from squeue
    queue = subprocess.run(["squeue", "-a", "-o", SQUEUE_FORMAT], capture_output=True, text=True,
                           env=dict(slurm.env, TZ="UTC"), timeout=60, check=True).stdout
    pending = parse_squeue(queue).jobs.set_index("job_id").loc[f"slurm:{held}"]
    assert pending["state"] == "pending" and pending["pending_reason"] == "BeginTime"
    assert pending["gpus"] == 1 and pending["gpu_model"] == "H100" and pd.isna(pending["start_ts"])
    db = tmp_path / "slurm.duckdb"
    out = subprocess.run([GPULEDGER, "import", "squeue", "-", "--db", str(db)], input=queue, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    with Store(db) as store:
        assert waiting_now(store, datetime.now(timezone.utc))["pending_reason"].tolist() == ["BeginTime"]
    slurm.run("scancel", held)
    queue = subprocess.run(["squeue", "-a", "-o", SQUEUE_FORMAT], capture_output=True, text=True,
                           env=dict(slurm.env, TZ="UTC"), timeout=60, check=True).stdout
    out = subprocess.run([GPULEDGER, "import", "squeue", "-", "--db", str(db)], input=queue, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "no longer in the queue: marked left_queue" in out.stdout, out.stdout
    batch = parse_sacct(_sacct(slurm))
    jobs = batch.jobs.set_index("job_id")
    got = {job: jobs.loc[f"slurm:{job}"] for job in (done, failed, cancelled, slurm.timeout_job)}
    assert got[done]["state"] == "completed" and got[done]["exit_code"] == "0:0"
    assert got[failed]["state"] == "failed" and got[failed]["exit_code"] == "3:0"
    assert got[slurm.timeout_job]["state"] == "timeout"
    assert got[cancelled]["state"] == "cancelled" and got[cancelled]["start_ts"] <= got[cancelled]["end_ts"]
    for job in (done, failed):  # AllocTRES gres/gpu=1 beside gres/gpu:h100=1: one GPU, an H100
        assert got[job]["gpus"] == 1 and got[job]["gpu_model"] == "H100" and got[job]["team"] == "vision"
    # the continuous source's store, read by read, ends where sacct's final record is
    read_both()
    final = parse_sacct(_sacct(slurm)).jobs.set_index("job_id")
    ids = [f"slurm:{job}" for job in (done, failed, cancelled, slurm.timeout_job, held)]
    stored = live.query("SELECT job_id, state, start_ts, end_ts, gpus, gpu_model, team FROM jobs "
                        "WHERE job_id IN (SELECT unnest($ids))", {"ids": ids}).set_index("job_id")
    assert sorted(stored.index) == sorted(ids), stored
    if f"slurm:{held}" not in final.index:  # cancelled before eligible: sacct may never list it; squeue did
        assert stored.loc[f"slurm:{held}", "state"] in ("left_queue", "cancelled"), stored.loc[f"slurm:{held}"]
    for job_id in [i for i in ids if i in final.index]:
        for column in ("state", "gpus", "gpu_model", "team", "start_ts", "end_ts"):
            want, have = final.loc[job_id, column], stored.loc[job_id, column]
            assert (pd.isna(want) and pd.isna(have)) or want == have, (job_id, column, want, have)
    limits = live.query("SELECT queue, flavor, value FROM queue_metrics WHERE scheduler = 'slurm' "
                        "AND figure = 'limit_gpus'")
    assert {"vision", "research"} <= set(limits["queue"]), limits  # the association limits in force, read too
    assert loop.failures == 0
    columns = "job_id, state, submit_ts, start_ts, end_ts, gpus, gpu_model, team, exit_code"
    # a job that left the queue unseen ends when a read noticed it gone: the two readers' own instants
    noticed = "CASE WHEN state = 'left_queue' THEN end_ts IS NOT NULL ELSE NULL END AS noticed, " \
              "CASE WHEN state = 'left_queue' THEN NULL ELSE end_ts END AS ended"
    sent = remote_store.query(f"SELECT {columns}, {noticed} FROM jobs ORDER BY job_id").drop(columns="end_ts")
    pd.testing.assert_frame_equal(sent, live.query(f"SELECT {columns}, {noticed} FROM jobs ORDER BY job_id")
                                  .drop(columns="end_ts"))
    sent_limits = remote_store.query("SELECT queue, flavor, value FROM queue_metrics WHERE figure = 'limit_gpus' "
                                     "ORDER BY ALL")
    assert sent_limits.equals(live.query("SELECT queue, flavor, value FROM queue_metrics WHERE figure = "
                                         "'limit_gpus' ORDER BY ALL")) and len(sent_limits)
    assert sender.sent == loop.reads and sender.failures == 0
    remote.stop()
    remote_store.close()
    live.close()
    assert got[slurm.timeout_job]["gpu_model"] == "L4" and got[slurm.timeout_job]["team"] == "research"
    ran = got[slurm.timeout_job]
    assert 55 <= (ran["end_ts"] - ran["start_ts"]).total_seconds() <= 180  # its one-minute limit, as sacct says
    assert all(got[j]["submit_ts"] <= got[j]["start_ts"] for j in (done, failed))
    assert batch.skipped["step"] > 0 and not batch.unknown_states
    # stored and read back: waits as sacct gives them (start - submit), outcomes, the lost GPU-hours
    out = subprocess.run([GPULEDGER, "import", "sacct", "-", "--db", str(db)], input=_sacct(slurm),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "GPU jobs" in out.stdout, out.stderr
    with Store(db) as store:
        assert waiting_now(store, datetime.now(timezone.utc)).empty  # the held job is cancelled now
        now = datetime.now(timezone.utc)
        summary = workload_summary(store, now - timedelta(hours=2), now, now).set_index(["team", "gpu_model"])
        ends = outcomes(store, now - timedelta(hours=2), now, now)
    vision = summary.loc[("vision", "H100")]
    mine = jobs[(jobs["team"] == "vision") & jobs["start_ts"].notna()]  # the fair-tree test's jobs too
    waits = (mine["start_ts"] - mine["submit_ts"]).dt.total_seconds() / 60
    assert vision["jobs_started"] == len(mine) >= 3
    assert vision["wait_max_minutes"] == pytest.approx(waits.max(), abs=1e-6)
    lost = ends[ends["lost"]]
    assert set(lost["outcome"]) == {"failed", "timeout"}
    assert summary.loc[("research", "L4"), "lost_gpu_hours"] == pytest.approx(
        (ran["end_ts"] - ran["start_ts"]).total_seconds() / 3600, rel=1e-6)


# The Slurm-like what-if model against this Slurm (issue 25): how far its predicted waits may be from the measured
# ones, per job. Slurm starts a job a second or three after GPUs free up (the job's epilog, the scheduler's next
# pass, more on a loaded machine); sacct reports whole seconds. A wait step is 8 s, so 6 s still tells a step from
# none.
CALIBRATION_TOLERANCE_S = 6.0
CALIBRATION_RUN_S = 8  # each job's sleep: long enough that a wait step (8 s) is clear of the tolerance


def _calibration_run(slurm: SlurmCluster, name: str, limit: int, db: Path) -> dict[str, dict]:
    """Under fresh accounts `<name>nlp` and `<name>vision` (no usage yet, so fair share orders nothing but age, in
    Slurm and in the model alike), apply GrpTRES limits of `limit` H100s each through the emitted sacctmgr script,
    run the calibration workload for real, import it from sacct into `db` and answer per job: its role (nlp,
    vision), its measured wait and the Slurm-like model's predicted wait (seconds)."""
    accounts = {role: f"{name}{role}" for role in ("nlp", "vision")}
    plan = QuotaPlan([TeamPlan(a, 1, None, {}, {"H100": limit}) for a in accounts.values()], {"H100": 2}, PLAN.made)
    script = slurm.root / "calibration.sh"
    script.write_text(emitter_for("slurm").emit(plan, associations(slurm)).text)
    slurm.run("sh", str(script))
    slurm.run("sacctmgr", "-i", "add", "user", "root", f"account={','.join(accounts.values())}")
    wait_until(lambda: not slurm.run("squeue", "-h", "-o", "%i").stdout.strip(), 240, "an idle cluster", step_s=1)
    roles = ["nlp", "nlp", "nlp", "vision"]  # three jobs of one team, then one of the other
    order = [accounts[role] for role in roles]
    ids = [slurm.run("sbatch", "-A", team, "--gres=gpu:h100:1", "-c", "1", "-o", "/dev/null", "--parsable",
                     "--wrap", f"sleep {CALIBRATION_RUN_S}").stdout.strip() for team in order]

    def finished() -> bool:
        states = parse_sacct(_sacct(slurm)).jobs.set_index("job_id")["state"]
        return all(states.get(f"slurm:{job}") == "completed" for job in ids)

    wait_until(finished, 240, "the calibration jobs to complete", step_s=1)
    out = subprocess.run([GPULEDGER, "import", "sacct", "-", "--db", str(db)], input=_sacct(slurm),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    with Store(db) as store:
        jobs = store.query("SELECT job_id, submit_ts, start_ts, end_ts FROM jobs "
                           "WHERE job_id IN (SELECT unnest($ids))", {"ids": [f"slurm:{j}" for j in ids]})
        jobs = jobs.set_index("job_id")
        start = jobs["submit_ts"].min().to_pydatetime() - timedelta(seconds=1)
        end = jobs["end_ts"].max().to_pydatetime() + timedelta(seconds=1)
        capacity = {"H100": 2}
        workload = workload_of(replay_jobs(store, start, end), start, end, capacity)
        # the usage Slurm's fair share starts from: the jobs before these (the first run's, for the second)
        usage = prior_usage(store, start, 7 * 86400.0, timedelta(days=1))
    settings = WhatIfConfig(model="slurm", slurm_age_weight=0.0, slurm_calc_period_s=60.0)  # as slurm.conf says
    replayed, _ = replay(workload, capacity, plan, "slurm", settings, (end - start).total_seconds(), 7 * 86400.0,
                         usage)
    predicted = {j.job_id: j.first_start - j.submit for j in replayed}
    return {f"slurm:{job}": {"team": role,
                             "measured_s": (jobs.loc[f"slurm:{job}", "start_ts"]
                                            - jobs.loc[f"slurm:{job}", "submit_ts"]).total_seconds(),
                             "predicted_s": predicted[f"slurm:{job}"]}
            for job, role in zip(ids, roles)}


def _mean_wait(run: dict[str, dict], team: str, key: str) -> float:
    return sum(j[key] for j in run.values() if j["team"] == team) / sum(j["team"] == team for j in run.values())


def test_the_slurm_like_model_predicts_waits_and_their_change_measured_in_slurm(slurm, tmp_path):
    """Issue 25: a workload of short jobs under two accounts with GrpTRES limits runs in the real Slurm; the
    Slurm-like model, given the same submissions, run times and limits, predicts each job's wait. Then the limits
    gpuledger recommends (a limit is the model's capacity: idle GPUs stay borrowable) are applied and the workload
    runs again (under fresh accounts, so the first run's usage does not reorder it at whichever PriorityCalcPeriod
    slurmctld happens to reach): the predicted change in each team's mean wait matches the measured one in direction
    and size."""
    runs = {"limited": _calibration_run(slurm, "cal1", 1, tmp_path / "limited.duckdb"),
            "recommended": _calibration_run(slurm, "cal2", 2, tmp_path / "recommended.duckdb")}
    errors = [abs(j["predicted_s"] - j["measured_s"]) for run in runs.values() for j in run.values()]
    print(f"\ncalibration: tolerance {CALIBRATION_TOLERANCE_S:g} s per job; measured error mean "
          f"{sum(errors) / len(errors):.2f} s, max {max(errors):.2f} s over {len(errors)} jobs")
    for name, run in runs.items():
        for job, j in run.items():
            print(f"  {name:<12} {job:<12} {j['team']:<10} measured {j['measured_s']:5.1f} s  "
                  f"predicted {j['predicted_s']:5.1f} s")
    assert max(errors) <= CALIBRATION_TOLERANCE_S
    # the start order: by measured start, the predicted starts never go backwards by more than the tolerance
    for run in runs.values():
        by_measured = sorted(run.values(), key=lambda j: j["measured_s"])
        assert all(b["predicted_s"] >= a["predicted_s"] - CALIBRATION_TOLERANCE_S
                   for a, b in zip(by_measured, by_measured[1:]))
    for team in ("nlp", "vision"):
        measured = _mean_wait(runs["recommended"], team, "measured_s") - _mean_wait(runs["limited"], team,
                                                                                     "measured_s")
        predicted = _mean_wait(runs["recommended"], team, "predicted_s") - _mean_wait(runs["limited"], team,
                                                                                       "predicted_s")
        print(f"  {team}: mean wait change measured {measured:+.1f} s, predicted {predicted:+.1f} s")
        assert math.copysign(1, measured) == math.copysign(1, predicted) and abs(measured) >= 2
        assert abs(measured - predicted) <= CALIBRATION_TOLERANCE_S
