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


def _bucketed(owner: str) -> str:
    """Average concurrent GPUs per bucket: sum per instant first, then average the instants.

    Dividing GPU-hours by the bucket length would under-count partial buckets at the edges
    of the window and whenever the collection interval changes. `owner` narrows "allocated"
    (e.g. to one team) while every instant of the cluster still counts in the average.
    """
    return f"""
        WITH per_instant AS (
            SELECT ts, sum(gpu_fraction) AS present,
                   coalesce(sum(gpu_fraction) FILTER (WHERE allocated AND {owner}), 0) AS allocated,
                   coalesce(sum(gpu_fraction * coalesce(util_pct, 0) / 100.0)
                            FILTER (WHERE allocated AND {owner}), 0) AS used
            FROM samples WHERE ts >= ? AND ts < ? GROUP BY ts
        )
        SELECT time_bucket(to_minutes(?::INTEGER), ts) AS bucket, avg(present) AS total_gpus,
               avg(allocated) AS allocated_gpus, avg(used) AS used_gpus
        FROM per_instant GROUP BY 1 ORDER BY 1"""


def team_usage_series(store: Store, start: datetime, end: datetime, team: str,
                      bucket_minutes: int = 60) -> pd.DataFrame:
    """Allocated and used GPUs (average concurrent) per time bucket for one team."""
    frame = store.query(_bucketed("coalesce(team, 'unattributed') = ?"), [team, team, start, end, bucket_minutes])
    return frame.drop(columns=["total_gpus"])


def cluster_utilization(store: Store, start: datetime, end: datetime, bucket_minutes: int = 60) -> pd.DataFrame:
    """Per bucket: GPUs present, allocated and used (average concurrent), cluster-wide."""
    return store.query(_bucketed("true"), [start, end, bucket_minutes])
