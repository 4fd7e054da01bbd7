"""Workloads: what the schedulers say happened to jobs (collector/jobs), not what the GPUs show: queue waits, run
times, outcomes and the GPU-hours each outcome took, restarts, and what is waiting now and why.

A job's wait is from its submission to its start (to its end if it never started, to `at` while it still waits). A job's GPU-hours here are its
GPUs times its run time as the scheduler reports it (start to end, or to `at` while running), clipped to the window:
evidence from the scheduler, next to the telemetry's own GPU-hours elsewhere. Jobs the scheduler gave no
submission time have no wait: they are counted apart (`no_submit_time`), never as a wait of zero.
"""
from __future__ import annotations

from datetime import datetime

import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import USAGE
from gpuledger.collector.jobs.lifecycle import HELD_REASONS, LOST, OPEN_STATES, OUTCOMES
from gpuledger.collector.samples import UNATTRIBUTED

# a job's own row, with its wait and its run clipped to [$start, $end) (`$at`: now, for what is still open)
_JOB_SPANS = """
    SELECT job_id, owner(team, $unattributed) AS team, coalesce(gpu_model, 'any') AS gpu_model, gpus, state,
           submit_ts, start_ts, end_ts, restarts, pending_reason, source,
           coalesce(workload_class, 'unclassified') AS workload_class,
           -- the gang a job is part of: a Kubernetes pod's owner (the pods of one PyTorchJob start together), else
           -- the job itself (a Slurm job's GPUs are allocated all at once)
           CASE WHEN source = 'kubernetes' AND name IS NOT NULL THEN coalesce(namespace, '') || '/' || name
                ELSE job_id END AS gang,
           date_diff('millisecond', submit_ts, wait_until) / 60000.0 AS wait_minutes,
           CASE WHEN submit_ts IS NOT NULL AND wait_until IS NOT NULL THEN
               greatest(0, date_diff('millisecond', greatest(submit_ts, $start), least(wait_until, $end)))
               / 3600000.0 * gpus
           ELSE 0 END AS waiting_gpu_hours,
           CASE WHEN start_ts IS NULL THEN 0  -- never started: ran nothing
                WHEN run_until IS NOT NULL THEN
               greatest(0, date_diff('millisecond', greatest(start_ts, $start), least(run_until, $end)))
               / 3600000.0 * gpus
           END AS run_gpu_hours
    -- a job still open runs (or waits) until $at; a finished one the scheduler gave no end has no known length
    -- (null: DuckDB's least() and greatest() skip nulls, so the ends are checked before they are used)
    FROM (SELECT *, coalesce(start_ts, end_ts, now_if_open) AS wait_until, coalesce(end_ts, now_if_open) AS run_until
          FROM (SELECT *, CASE WHEN state IS NULL OR state IN ('pending', 'running') THEN $at END AS now_if_open
                FROM jobs WHERE gpus > 0))"""


def waiting_demand(store: Store, start: datetime, end: datetime, at: datetime) -> pd.DataFrame:
    """Per team and GPU model asked for ('any' where the job named none): GPU-hours spent waiting in the queue
    inside [start, end), the jobs that waited there, and their longest and 95th-percentile waits (minutes). What
    the quota advice counts as demand the telemetry cannot show: a starved team's use is low because it waits.
    A job the scheduler holds (HELD_REASONS: a later begin time, a dependency, a hold) is not waiting for GPUs and
    is left out."""
    sql = f"""
        SELECT team, gpu_model, sum(waiting_gpu_hours) AS waiting_gpu_hours, count(*) AS jobs_waited,
               max(wait_minutes) AS longest_wait_minutes,
               quantile_cont(wait_minutes, 0.95) AS p95_wait_minutes, list(DISTINCT source) AS sources
        FROM ({_JOB_SPANS}) WHERE waiting_gpu_hours > 0
          AND (pending_reason IS NULL OR pending_reason NOT IN (SELECT unnest($held)))
        GROUP BY ALL ORDER BY team, gpu_model"""
    return store.query(sql, {"start": start, "end": end, "at": at, "unattributed": UNATTRIBUTED,
                             "held": list(HELD_REASONS)})


def first_job_record(store: Store) -> datetime | None:
    """When the earliest job record with GPUs entered the system (submitted, else started): before it no scheduler's
    records were loaded, so a queue there is unknown; from it on, a week with no record had none waiting."""
    value = store.scalar("SELECT min(coalesce(submit_ts, start_ts)) FROM jobs WHERE coalesce(gpus, 0) > 0", {})
    return None if value is None or pd.isna(value) else pd.Timestamp(value).to_pydatetime()


def job_records_between(store: Store, start: datetime, end: datetime) -> int:
    """Job records with GPUs that were in the system at some point of [start, end). None at all means the queue is
    not known there (no scheduler's records were loaded), which waiting_demand's empty answer cannot tell apart
    from nothing having waited: a caller counting queued demand says "unknown", never 0, when this is 0."""
    sql = """SELECT count(*) FROM jobs
             WHERE coalesce(gpus, 0) > 0 AND coalesce(submit_ts, start_ts) < $end
               AND (end_ts IS NULL OR end_ts >= $start)"""
    return int(store.scalar(sql, {"start": start, "end": end}) or 0)


# what workload figures can be grouped by; `workload_class` is collector/jobs/classes.py WORKLOAD_CLASSES or
# `unclassified` (a job stored before classes existed counts as unclassified)
WORKLOAD_GROUPS = ("team", "gpu_model", "workload_class")


def workload_summary(store: Store, start: datetime, end: datetime, at: datetime,
                     by: tuple[str, ...] = ("team", "gpu_model")) -> pd.DataFrame:
    """Per team and GPU model (or any of WORKLOAD_GROUPS): jobs that started in the window and their waits (p50,
    p95, longest, minutes), jobs that finished in it by outcome and the GPU-hours each outcome took, GPU-hours lost
    to failed, timed-out, out-of-memory, node-failed and preempted jobs, restarts, what waits at `at` (jobs, GPUs,
    longest wait) and the gang jobs among them (several GPUs or pods that must start together) with their GPUs."""
    if not by or any(b not in WORKLOAD_GROUPS for b in by):
        raise ValueError(f"group workloads by {', '.join(WORKLOAD_GROUPS)}, not {by}")
    keys = ", ".join(by)
    sql = f"""
        WITH spans AS ({_JOB_SPANS}),
        gangs AS (
            SELECT {keys}, count(*) AS gang_jobs_waiting, sum(gpus) AS gang_gpus_waiting FROM (
                SELECT {keys}, gang, sum(gpus) AS gpus, count(*) AS pods FROM spans
                WHERE state = 'pending' AND coalesce(submit_ts, $at) <= $at GROUP BY ALL)
            WHERE gpus > 1 OR pods > 1 GROUP BY ALL),
        summary AS (
        SELECT {keys},
               count(*) FILTER (WHERE start_ts >= $start AND start_ts < $end) AS jobs_started,
               quantile_cont(wait_minutes, 0.5) FILTER (WHERE start_ts >= $start AND start_ts < $end)
                   AS wait_p50_minutes,
               quantile_cont(wait_minutes, 0.95) FILTER (WHERE start_ts >= $start AND start_ts < $end)
                   AS wait_p95_minutes,
               max(wait_minutes) FILTER (WHERE start_ts >= $start AND start_ts < $end) AS wait_max_minutes,
               count(*) FILTER (WHERE start_ts >= $start AND start_ts < $end AND submit_ts IS NULL)
                   AS no_submit_time,
               count(*) FILTER (WHERE end_ts >= $start AND end_ts < $end AND state NOT IN (SELECT unnest($open)))
                   AS jobs_finished,
               coalesce(sum(run_gpu_hours), 0) AS run_gpu_hours,
               coalesce(sum(run_gpu_hours) FILTER (WHERE state IN (SELECT unnest($lost))), 0) AS lost_gpu_hours,
               coalesce(sum(waiting_gpu_hours), 0) AS waiting_gpu_hours,
               coalesce(sum(restarts) FILTER (WHERE start_ts < $end AND coalesce(end_ts, $at) >= $start), 0)
                   AS restarts,
               count(*) FILTER (WHERE state = 'pending' AND coalesce(submit_ts, $at) <= $at) AS pending_jobs,
               coalesce(sum(gpus) FILTER (WHERE state = 'pending' AND coalesce(submit_ts, $at) <= $at), 0)
                   AS pending_gpus,
               max(wait_minutes) FILTER (WHERE state = 'pending') AS longest_pending_minutes
        FROM spans
        WHERE (submit_ts IS NOT NULL OR start_ts IS NOT NULL)  -- a job without any instant says nothing of time
          AND (submit_ts IS NULL OR submit_ts < $end) AND (coalesce(end_ts, $at) >= $start)
        GROUP BY ALL)
        SELECT summary.*, coalesce(gang_jobs_waiting, 0) AS gang_jobs_waiting,
               coalesce(gang_gpus_waiting, 0) AS gang_gpus_waiting
        FROM summary LEFT JOIN gangs USING ({keys}) ORDER BY {keys}"""
    params = {"start": start, "end": end, "at": at, "unattributed": UNATTRIBUTED, "open": list(OPEN_STATES),
              "lost": list(LOST)}
    return store.query(sql, params)


def outcomes(store: Store, start: datetime, end: datetime, at: datetime) -> pd.DataFrame:
    """Per team, GPU model and outcome of the jobs that finished in the window: jobs and the GPU-hours they ran
    (a line of the bill: what failed and preempted work took)."""
    sql = f"""
        SELECT team, gpu_model, state AS outcome, count(*) AS jobs, sum(run_gpu_hours) AS gpu_hours,
               state IN (SELECT unnest($lost)) AS lost
        FROM ({_JOB_SPANS})
        WHERE end_ts >= $start AND end_ts < $end AND state NOT IN (SELECT unnest($open))
        GROUP BY ALL ORDER BY team, gpu_model, gpu_hours DESC"""
    return store.query(sql, {"start": start, "end": end, "at": at, "unattributed": UNATTRIBUTED,
                             "open": list(OPEN_STATES), "lost": list(LOST)})


def waiting_now(store: Store, at: datetime) -> pd.DataFrame:
    """The jobs waiting at `at`, longest first, with what the scheduler says they wait for (`pending_reason`)."""
    sql = f"""SELECT job_id, team, gpu_model, gpus, submit_ts, wait_minutes, pending_reason, source, workload_class
              FROM ({_JOB_SPANS}) WHERE state = 'pending' AND coalesce(submit_ts, $at) <= $at
              ORDER BY wait_minutes DESC NULLS LAST"""
    return store.query(sql, {"start": at, "end": at, "at": at, "unattributed": UNATTRIBUTED})


EXAMPLES = 20  # job ids listed per disagreement (all are counted)


def scheduler_coverage(store: Store, start: datetime, end: datetime, at: datetime,
                       grace_minutes: float = 10.0, team: str | None = None) -> dict:
    """Where the schedulers' records and the GPU telemetry disagree in [start, end), counted and named, never
    resolved by a guess: jobs the scheduler says run (for longer than `grace_minutes`) with no sample of theirs in
    the last `grace_minutes` (a pod on a GPU the exporter does not show), jobs that ran and ended in the window
    with no sample at all (a job in sacct the telemetry never saw), and telemetry of jobs no scheduler record
    knows (where any record exists). Per source; `team`: that team's jobs only (a team token's view)."""
    seen = store.query_usage(
        f"SELECT job_id, max(end_ts) AS last_seen, sum(gpu_s) / 3600.0 AS gpu_hours, "
        f"job_id IN (SELECT job_id FROM jobs) AS recorded FROM {USAGE} "
        "WHERE allocated AND job_id IS NOT NULL AND ($team IS NULL OR owner(team, $unattributed) = $team) "
        "GROUP BY job_id", {"start": start, "end": end, "team": team, "unattributed": UNATTRIBUTED})
    recs = store.query("""
        SELECT job_id, coalesce(source, 'unknown') AS source, state, start_ts, end_ts FROM jobs
        WHERE gpus > 0 AND start_ts IS NOT NULL AND start_ts < $end AND coalesce(end_ts, $at) >= $start
          AND ($team IS NULL OR owner(team, $unattributed) = $team)""",
                       {"start": start, "end": end, "at": at, "team": team, "unattributed": UNATTRIBUTED})
    grace = pd.Timedelta(minutes=grace_minutes)
    at_ts = pd.Timestamp(at)
    last_seen = dict(zip(seen["job_id"], pd.to_datetime(seen["last_seen"], utc=True)))
    recs["start_ts"] = pd.to_datetime(recs["start_ts"], utc=True)
    recs["end_ts"] = pd.to_datetime(recs["end_ts"], utc=True)
    running = recs[(recs["state"] == "running") & (recs["start_ts"] <= at_ts - grace)]
    quiet = pd.Series([last_seen.get(j) is None or last_seen[j] < at_ts - grace for j in running["job_id"]],
                      index=running.index, dtype=bool)
    silent = running[quiet]
    ended = recs[recs["state"].isin(OUTCOMES) & (recs["end_ts"] >= pd.Timestamp(start))
                 & (recs["end_ts"] - recs["start_ts"] >= grace)]
    unseen = ended[~ended["job_id"].isin(last_seen)]
    unknown = seen[~seen["recorded"].astype(bool)]

    def listed(frame: pd.DataFrame) -> dict:
        return {"count": int(len(frame)), "by_source": {str(k): int(v) for k, v in
                                                        frame["source"].value_counts().items()},
                "examples": sorted(frame["job_id"])[:EXAMPLES]}
    return {"window_start": start, "window_end": end, "at": at, "grace_minutes": grace_minutes,
            "telemetry_jobs": int(len(seen)), "scheduler_jobs": int(len(recs)),
            "running_without_samples": listed(silent), "ended_without_samples": listed(unseen),
            "samples_without_record": {
                "count": int(len(unknown)) if len(recs) else None,
                "gpu_hours": float(unknown["gpu_hours"].sum()) if len(recs) else None,
                "examples": sorted(unknown["job_id"])[:EXAMPLES] if len(recs) else []}}
