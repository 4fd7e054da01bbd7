"""GPU-hours allocated vs used, per team and over time.

A sample stands for `interval_s` seconds of `gpu_fraction` of a GPU, so GPU-hours are a
sum, whatever the collection interval or MIG layout (the store's `gpu_hours` macro).
"Used" weights allocated time by utilisation; "allocated" counts the time a job held the
GPU, busy or not.
"""
from __future__ import annotations

from datetime import datetime

import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED


def team_usage(store: Store, start: datetime, end: datetime, team: str | None = None) -> pd.DataFrame:
    """One row per team: allocated and used GPU-hours, efficiency, jobs seen."""
    sql = """
        SELECT owner(team, $unattributed) AS team,
               sum(gpu_hours(interval_s, gpu_fraction)) AS allocated_gpu_hours,
               sum(used_gpu_hours(interval_s, gpu_fraction, util_pct)) AS used_gpu_hours,
               count(DISTINCT job_id) AS jobs
        FROM samples
        WHERE allocated AND ts >= $start AND ts < $end AND ($team IS NULL OR owner(team, $unattributed) = $team)
        GROUP BY 1 ORDER BY allocated_gpu_hours DESC"""
    frame = store.query(sql, {"start": start, "end": end, "team": team, "unattributed": UNATTRIBUTED})
    frame["efficiency"] = (frame["used_gpu_hours"] / frame["allocated_gpu_hours"]).fillna(0.0)
    return frame


# Average concurrent GPUs per bucket: sum per instant first, then average the instants. Dividing
# GPU-hours by the bucket length would under-count partial buckets at the edges of the window and
# whenever the collection interval changes. `$team` narrows "allocated" to one team (NULL: all)
# while every instant of the cluster still counts in the average.
_BUCKETED = """
    WITH per_instant AS (
        SELECT ts, sum(gpu_fraction) AS present,
               coalesce(sum(gpu_fraction) FILTER (WHERE allocated AND owned), 0) AS allocated,
               coalesce(sum(gpu_fraction * coalesce(util_pct, 0) / 100.0) FILTER (WHERE allocated AND owned), 0)
                   AS used
        FROM (SELECT *, ($team IS NULL OR owner(team, $unattributed) = $team) AS owned FROM samples
              WHERE ts >= $start AND ts < $end)
        GROUP BY ts
    )
    SELECT time_bucket(to_minutes($bucket_minutes::INTEGER), ts) AS bucket, avg(present) AS total_gpus,
           avg(allocated) AS allocated_gpus, avg(used) AS used_gpus
    FROM per_instant GROUP BY 1 ORDER BY 1"""


def _bucketed(store: Store, start: datetime, end: datetime, team: str | None, bucket_minutes: int) -> pd.DataFrame:
    return store.query(_BUCKETED, {"start": start, "end": end, "team": team, "unattributed": UNATTRIBUTED,
                                   "bucket_minutes": bucket_minutes})


def team_usage_series(store: Store, start: datetime, end: datetime, team: str,
                      bucket_minutes: int = 60) -> pd.DataFrame:
    """Allocated and used GPUs (average concurrent) per time bucket for one team."""
    return _bucketed(store, start, end, team, bucket_minutes).drop(columns=["total_gpus"])


def cluster_utilization(store: Store, start: datetime, end: datetime, bucket_minutes: int = 60) -> pd.DataFrame:
    """Per bucket: GPUs present, allocated and used (average concurrent), cluster-wide."""
    return _bucketed(store, start, end, None, bucket_minutes)


def hourly_demand(store: Store, start: datetime, end: datetime, idle_util_pct: float) -> pd.DataFrame:
    """Per owner, GPU model and clock hour: GPUs allocated and GPUs allocated but idle (under `idle_util_pct`),
    on average over the hour."""
    sql = """
        SELECT owner(team, $unattributed) AS team, gpu_model, time_bucket(INTERVAL 1 HOUR, ts) AS hour,
               sum(gpu_hours(interval_s, gpu_fraction)) AS allocated_gpus,
               coalesce(sum(gpu_hours(interval_s, gpu_fraction)) FILTER (WHERE coalesce(util_pct, 0) < $idle_pct), 0)
                   AS idle_gpus
        FROM samples WHERE allocated AND ts >= $start AND ts < $end GROUP BY ALL"""
    return store.query(sql, {"start": start, "end": end, "idle_pct": idle_util_pct, "unattributed": UNATTRIBUTED})


def covered_hours(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per GPU model: the clock hours in [start, end) that hold at least one sample of it (the evidence there is)."""
    sql = """SELECT gpu_model, list_sort(list(DISTINCT time_bucket(INTERVAL 1 HOUR, ts))) AS hours
             FROM samples WHERE ts >= $start AND ts < $end GROUP BY gpu_model"""
    return store.query(sql, {"start": start, "end": end})


def capacity_by_model(store: Store, before: datetime) -> pd.DataFrame:
    """Per GPU model: GPUs present at the newest instant before `before` (MIG instances as their fractions)."""
    sql = """SELECT gpu_model, sum(gpu_fraction) AS gpus FROM samples
             WHERE ts = (SELECT max(ts) FROM samples WHERE ts < $end) GROUP BY gpu_model ORDER BY gpu_model"""
    return store.query(sql, {"end": before})


def interval_at(store: Store, ts: datetime) -> float | None:
    """The longest sampling interval at instant `ts`: how long a sample taken then stands for."""
    return store.scalar("SELECT max(interval_s) FROM samples WHERE ts = $ts", {"ts": ts})


def pending_jobs(store: Store, at: datetime, min_wait_minutes: float = 0.0) -> pd.DataFrame:
    """Jobs waiting in the scheduler's queue at `at` that have waited at least `min_wait_minutes`:
    team, GPU model asked for (null: any), GPUs and minutes waited."""
    sql = """SELECT job_id, owner(team, $unattributed) AS team, gpu_model, gpus,
                    date_diff('second', submit_ts, $at) / 60.0 AS waited_minutes
             FROM jobs
             WHERE state = 'pending' AND (submit_ts IS NULL OR submit_ts <= $at)
               AND coalesce(date_diff('second', submit_ts, $at) / 60.0, 0) >= $min_wait
             ORDER BY team, submit_ts"""
    return store.query(sql, {"at": at, "min_wait": min_wait_minutes, "unattributed": UNATTRIBUTED})


def hourly_user_usage(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Allocated GPU-hours per clock hour, named team and user (null: not known), for account-tree fairshare."""
    sql = """
        SELECT time_bucket(INTERVAL 1 HOUR, ts) AS hour, team, "user", sum(gpu_hours(interval_s, gpu_fraction)) AS gpu_hours
        FROM samples WHERE allocated AND team IS NOT NULL AND ts >= $start AND ts < $end
        GROUP BY ALL"""
    return store.query(sql, {"start": start, "end": end})


def hourly_capacity(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """GPU-hours present per clock hour (allocated or not): the cluster's capacity, for usage as a fraction of it."""
    sql = """SELECT time_bucket(INTERVAL 1 HOUR, ts) AS hour, sum(gpu_hours(interval_s, gpu_fraction)) AS gpu_hours
             FROM samples WHERE ts >= $start AND ts < $end GROUP BY 1 ORDER BY 1"""
    return store.query(sql, {"start": start, "end": end})


def team_gauges(store: Store, start: datetime, end: datetime, idle_util_pct: float) -> pd.DataFrame:
    """Per bill line (teams, unattributed, idle capacity), averaged over [start, end): GPUs held, GPUs busy
    (at or over `idle_util_pct`), GPUs held idle, and cost per hour at the rate card."""
    sql = """
        SELECT bill_line(allocated, team, $unattributed, $idle) AS team,
               sum(gpu_hours) / $hours AS allocated_gpus,
               coalesce(sum(gpu_hours) FILTER (WHERE allocated AND coalesce(util_pct, 0) >= $idle_pct), 0) / $hours
                   AS busy_gpus,
               sum(cost_usd) / $hours AS cost_usd_per_hour
        FROM priced_samples WHERE ts >= $start AND ts < $end GROUP BY 1 ORDER BY 1"""
    hours = (end - start).total_seconds() / 3600.0
    frame = store.query(sql, {"start": start, "end": end, "hours": hours, "idle_pct": idle_util_pct,
                              "unattributed": UNATTRIBUTED, "idle": IDLE_CAPACITY})
    frame["idle_gpus"] = (frame["allocated_gpus"] - frame["busy_gpus"]).where(frame["team"] != IDLE_CAPACITY, 0.0)
    return frame


def node_gauges(store: Store, start: datetime, end: datetime, idle_util_pct: float) -> pd.DataFrame:
    """Per node, averaged over [start, end): GPUs present, allocated, and busy (at or over `idle_util_pct`)."""
    sql = """
        SELECT node, sum(gpu_hours(interval_s, gpu_fraction)) / $hours AS gpus,
               coalesce(sum(gpu_hours(interval_s, gpu_fraction)) FILTER (WHERE allocated), 0) / $hours AS allocated_gpus,
               coalesce(sum(gpu_hours(interval_s, gpu_fraction))
                        FILTER (WHERE allocated AND coalesce(util_pct, 0) >= $idle_pct), 0) / $hours AS busy_gpus
        FROM samples WHERE ts >= $start AND ts < $end AND node IS NOT NULL GROUP BY 1 ORDER BY 1"""
    hours = (end - start).total_seconds() / 3600.0
    return store.query(sql, {"start": start, "end": end, "hours": hours, "idle_pct": idle_util_pct})
