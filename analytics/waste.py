"""Waste: GPUs held but idle for long stretches, and jobs whose memory footprint is a fraction of the card.

Idle stretches are found per GPU and job as runs of consecutive samples below the idle
threshold (gaps-and-islands), so a job that is busy for a minute every hour still counts
its long idle stretches. Short pauses under `idle_minutes` are normal and ignored.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.collector.gpu_catalog import mig_fraction, mig_profiles, smaller_cards
from gpuledger.collector.samples import UNATTRIBUTED


def idle_runs(store: Store, start: datetime, end: datetime, idle_minutes: float,
              idle_util_pct: float) -> pd.DataFrame:
    """Stretches where an allocated GPU stayed under `idle_util_pct` for at least `idle_minutes`."""
    sql = """
        WITH s AS (
            SELECT ts, interval_s, gpu_fraction, gpu_uuid, coalesce(mig_instance, -1) AS mig, node, gpu_model,
                   job_id, owner(team, $unattributed) AS team, coalesce(util_pct, 0) < $idle_pct AS idle, util_pct
            FROM samples WHERE allocated AND ts >= $start AND ts < $end
        ), g AS (
            SELECT *, row_number() OVER (PARTITION BY gpu_uuid, mig, job_id ORDER BY ts)
                    - row_number() OVER (PARTITION BY gpu_uuid, mig, job_id, idle ORDER BY ts) AS grp
            FROM s
        )
        SELECT g.team, g.job_id, g.node, g.gpu_uuid, g.gpu_model, min(g.ts) AS start_ts,
               max(g.ts) + to_seconds(any_value(g.interval_s)::BIGINT) AS end_ts,
               sum(g.interval_s) / 60.0 AS idle_minutes,
               sum(gpu_hours(g.interval_s, g.gpu_fraction)) AS idle_gpu_hours,
               sum(gpu_hours(g.interval_s, g.gpu_fraction) * coalesce(r.usd_per_gpu_hour, 0)) AS idle_cost_usd,
               avg(g.util_pct) AS mean_util_pct
        FROM g LEFT JOIN rate_card r USING (gpu_model)
        WHERE g.idle
        GROUP BY g.team, g.job_id, g.node, g.gpu_uuid, g.mig, g.gpu_model, g.grp
        HAVING sum(g.interval_s) >= $idle_minutes * 60
        ORDER BY idle_gpu_hours DESC"""
    return store.query(sql, {"start": start, "end": end, "idle_pct": idle_util_pct, "idle_minutes": idle_minutes,
                             "unattributed": UNATTRIBUTED})


def job_profiles(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per job on whole GPUs: peak memory against card size, utilisation, GPU-hours and cost."""
    sql = """
        SELECT job_id, any_value(owner(team, $unattributed)) AS team, any_value(gpu_model) AS gpu_model,
               count(DISTINCT gpu_uuid) AS gpus, min(ts) AS first_ts, max(ts) AS last_ts,
               max(mem_used_mib) AS peak_mem_mib, max(mem_total_mib) AS mem_total_mib,
               avg(coalesce(util_pct, 0)) AS mean_util_pct,
               quantile_cont(coalesce(util_pct, 0), 0.95) AS p95_util_pct,
               sum(gpu_hours) AS gpu_hours, sum(cost_usd) AS cost_usd,
               any_value(usd_per_gpu_hour) AS usd_per_gpu_hour
        FROM priced_samples
        WHERE allocated AND job_id IS NOT NULL AND mig_profile IS NULL AND ts >= $start AND ts < $end
        GROUP BY job_id"""
    return store.query(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED})


# A smaller card has far less compute; only jobs this lightly loaded are moved to one.
SMALLER_CARD_MAX_UTIL_PCT = 30.0
MEMORY_HEADROOM = 1.2  # a job fits a slice or card with 20% more memory than its peak


def smallest_fit(model: str, peak_mem_mib: float, p95_util_pct: float) -> dict | None:
    """The smallest MIG slice of `model` holding the job's memory (with headroom) and p95 compute,
    else, for lightly loaded jobs, the smallest smaller card with that memory."""
    need_gb = peak_mem_mib * MEMORY_HEADROOM / 1024.0
    for profile in mig_profiles(model):
        fraction = mig_fraction(model, profile.name)
        if fraction < 1.0 and profile.memory_gb >= need_gb and fraction * 100.0 >= p95_util_pct:
            return {"kind": "mig", "target": f"{model} MIG {profile.name}", "gpu_fraction": fraction}
    if p95_util_pct > SMALLER_CARD_MAX_UTIL_PCT:
        return None
    smaller = smaller_cards(need_gb, than=model)
    if smaller:
        return {"kind": "gpu", "target": smaller[0], "gpu_fraction": 1.0}
    return None


def oversized_jobs(store: Store, start: datetime, end: datetime, mem_fraction: float,
                   min_gpu_hours: float = 0.5, idle_util_pct: float = 0.0) -> pd.DataFrame:
    """Jobs whose peak memory stayed under `mem_fraction` of the card, with the smallest shape that fits.

    A job whose p95 utilisation stayed under `idle_util_pct` is `idle`: it is listed, but no shape is suggested,
    since a slice held idle wastes the slice (its GPUs should be given back)."""
    jobs = job_profiles(store, start, end)
    if jobs.empty:
        return jobs.assign(idle=pd.Series(dtype=bool), fits=pd.Series(dtype=object))
    over = jobs[(jobs["peak_mem_mib"] < mem_fraction * jobs["mem_total_mib"]) & (jobs["gpu_hours"] >= min_gpu_hours)]
    over = over.copy()
    over["idle"] = over["p95_util_pct"] < idle_util_pct
    over["fits"] = [None if idle else smallest_fit(m, p, u) for m, p, u, idle in
                    zip(over["gpu_model"], over["peak_mem_mib"], over["p95_util_pct"], over["idle"])]
    return over.sort_values("cost_usd", ascending=False).reset_index(drop=True)


@dataclass
class Waste:
    """The idle stretches, the memory-oversized jobs, and their sums per team, each query run once."""
    runs: pd.DataFrame
    oversized: pd.DataFrame
    by_team: pd.DataFrame


def waste(store: Store, start: datetime, end: datetime, idle_minutes: float, idle_util_pct: float,
          mem_fraction: float) -> Waste:
    runs = idle_runs(store, start, end, idle_minutes, idle_util_pct)
    over = oversized_jobs(store, start, end, mem_fraction, idle_util_pct=idle_util_pct)
    return Waste(runs, over, _per_team(runs, over))


def waste_by_team(store: Store, start: datetime, end: datetime, idle_minutes: float, idle_util_pct: float,
                  mem_fraction: float) -> pd.DataFrame:
    """Per team: idle allocated GPU-hours and their cost, and how many jobs were memory-oversized."""
    return waste(store, start, end, idle_minutes, idle_util_pct, mem_fraction).by_team


def _per_team(runs: pd.DataFrame, over: pd.DataFrame) -> pd.DataFrame:
    idle = runs.groupby("team", as_index=False).agg(
        idle_gpu_hours=("idle_gpu_hours", "sum"), idle_cost_usd=("idle_cost_usd", "sum"),
        idle_stretches=("idle_gpu_hours", "size"))
    sized = (over.groupby("team", as_index=False).agg(oversized_jobs=("job_id", "size"),
                                                       oversized_gpu_hours=("gpu_hours", "sum"))
             if not over.empty else pd.DataFrame(columns=["team", "oversized_jobs", "oversized_gpu_hours"]))
    merged = idle.merge(sized, on="team", how="outer")
    merged = merged.fillna({"idle_gpu_hours": 0.0, "idle_cost_usd": 0.0, "idle_stretches": 0,
                            "oversized_jobs": 0, "oversized_gpu_hours": 0.0})
    return merged.sort_values("idle_cost_usd", ascending=False).reset_index(drop=True)
