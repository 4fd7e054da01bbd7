"""GPU-hours allocated vs used, per team and over time.

A sample stands for `interval_s` seconds of `gpu_fraction` of a GPU, so GPU-hours are a
sum, whatever the collection interval or MIG layout. "Used" weights allocated time by
utilisation; "allocated" counts the time a job held the GPU, busy or not.
"""
from __future__ import annotations

from datetime import datetime

import pandas as pd

from analytics.store import Store

GPU_HOURS = "sum(interval_s * gpu_fraction) / 3600.0"
USED_GPU_HOURS = "sum(interval_s * gpu_fraction * coalesce(util_pct, 0) / 100.0) / 3600.0"


def team_usage(store: Store, start: datetime, end: datetime, team: str | None = None) -> pd.DataFrame:
    """One row per team: allocated and used GPU-hours, efficiency, jobs seen."""
    sql = f"""
        SELECT coalesce(team, 'unattributed') AS team,
               {GPU_HOURS} AS allocated_gpu_hours,
               {USED_GPU_HOURS} AS used_gpu_hours,
               count(DISTINCT job_id) AS jobs
        FROM samples
        WHERE allocated AND ts >= ? AND ts < ? AND (? IS NULL OR coalesce(team, 'unattributed') = ?)
        GROUP BY 1 ORDER BY allocated_gpu_hours DESC"""
    frame = store.query(sql, [start, end, team, team])
    frame["efficiency"] = (frame["used_gpu_hours"] / frame["allocated_gpu_hours"]).fillna(0.0)
    return frame


def team_usage_series(store: Store, start: datetime, end: datetime, team: str,
                      bucket_minutes: int = 60) -> pd.DataFrame:
    """Allocated and used GPUs (average concurrent) per time bucket for one team."""
    sql = f"""
        SELECT time_bucket(to_minutes(?::INTEGER), ts) AS bucket,
               {GPU_HOURS} * 60.0 / ? AS allocated_gpus,
               {USED_GPU_HOURS} * 60.0 / ? AS used_gpus
        FROM samples
        WHERE allocated AND coalesce(team, 'unattributed') = ? AND ts >= ? AND ts < ?
        GROUP BY 1 ORDER BY 1"""
    return store.query(sql, [bucket_minutes, bucket_minutes, bucket_minutes, team, start, end])


def cluster_utilization(store: Store, start: datetime, end: datetime, bucket_minutes: int = 60) -> pd.DataFrame:
    """Per bucket: GPUs present, allocated and used (average concurrent), cluster-wide."""
    sql = f"""
        SELECT time_bucket(to_minutes(?::INTEGER), ts) AS bucket,
               {GPU_HOURS} * 60.0 / ? AS total_gpus,
               coalesce(sum(interval_s * gpu_fraction) FILTER (WHERE allocated), 0) / 60.0 / ? AS allocated_gpus,
               coalesce(sum(interval_s * gpu_fraction * coalesce(util_pct, 0) / 100.0) FILTER (WHERE allocated), 0)
                   / 60.0 / ? AS used_gpus
        FROM samples WHERE ts >= ? AND ts < ?
        GROUP BY 1 ORDER BY 1"""
    return store.query(sql, [bucket_minutes, bucket_minutes, bucket_minutes, bucket_minutes, start, end])
