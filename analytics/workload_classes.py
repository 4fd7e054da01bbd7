"""Cost, GPU-hours, efficiency and waste per workload class (collector/jobs/classes.py): each job the telemetry
billed is read with the class its scheduler record gives (a label, a priority class, a partition, its name); a job
with no record, or one its record could not place, is placed by what its GPUs did, where one rule fits
(TELEMETRY_RULES), and otherwise stays `unclassified`. Every job carries the rule that placed it.

Telemetry rules, first match wins, only over GPU-hours with a utilisation reading (at least half the job's):
- training: several GPUs busy together, mean utilisation at least 50% and idle at most 20% of the time
  (sustained activity on a gang of GPUs);
- interactive: idle at least 60% of its GPU-hours with a mean under 40% (long idle with bursts: a notebook);
- online_inference: one GPU, idle 5-60% of the time, mean 10-70%, for at least 6 hours (a request-driven duty
  cycle: never flat out, rarely silent for long).
"""
from __future__ import annotations

from datetime import datetime

import pandas as pd

from gpuledger.analytics.cost import PRICED
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import measured
from gpuledger.collector.jobs.classes import UNCLASSIFIED
from gpuledger.collector.samples import UNATTRIBUTED

MIN_COVERAGE = 0.5  # a telemetry rule needs readings for at least this share of the job's GPU-hours


def job_classes(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per job the telemetry billed in [start, end): team, class and the rule that placed it, GPUs, GPU-hours,
    cost, used and idle GPU-hours (null where unmeasured), idle cost, mean utilisation, idle share, coverage."""
    sql = f"""
        WITH billed AS (
            SELECT job_id, any_value(owner(team, $unattributed)) AS team, count(DISTINCT gpu_uuid) AS gpus,
                   sum(gpu_hours) AS gpu_hours, sum(cost_usd) AS cost_usd,
                   {measured("sum(used_gpu_hours)")} AS used_gpu_hours,
                   {measured("sum(idle_gpu_s) / 3600.0")} AS idle_gpu_hours,
                   {measured("sum(idle_gpu_s / 3600.0 * coalesce(usd_per_gpu_hour, 0))")} AS idle_cost_usd,
                   sum(util_sum) / nullif(sum(util_n), 0) AS mean_util_pct,
                   sum(idle_gpu_s) / nullif(sum(util_gpu_s), 0) AS idle_share,
                   sum(util_gpu_s) / nullif(sum(gpu_s), 0) AS util_coverage,
                   date_diff('second', min(first_ts), max(end_ts)) / 3600.0 AS hours
            FROM {PRICED} WHERE allocated AND job_id IS NOT NULL GROUP BY job_id)
        SELECT billed.*, j.workload_class, j.class_rule
        FROM billed LEFT JOIN jobs j USING (job_id)"""
    jobs = store.query_usage(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED})
    if jobs.empty:
        return jobs
    open_ = jobs["workload_class"].isna() | (jobs["workload_class"] == UNCLASSIFIED)
    placed = [_by_telemetry(row) for row in jobs[open_].itertuples(index=False)]
    jobs.loc[open_, "workload_class"] = [c for c, _ in placed]
    jobs.loc[open_, "class_rule"] = [
        (f"{rule}" if rec is None or pd.isna(rec) else f"{rec}; {rule}")
        for (_, rule), rec in zip(placed, jobs.loc[open_, "class_rule"])]
    return jobs


def _by_telemetry(job) -> tuple[str, str]:
    """(class, rule) from what a job's GPUs did (the module's rules), or unclassified and why not."""
    if job.util_coverage is None or pd.isna(job.util_coverage) or job.util_coverage < MIN_COVERAGE:
        return UNCLASSIFIED, "telemetry: too few utilisation readings to tell"
    mean, idle = float(job.mean_util_pct), float(job.idle_share)
    if job.gpus >= 2 and mean >= 50 and idle <= 0.2:
        return "training", f"telemetry: {job.gpus} GPUs busy together (mean {mean:.0f}%, idle {idle:.0%})"
    if idle >= 0.6 and mean < 40:
        return "interactive", f"telemetry: idle {idle:.0%} of its GPU-hours with bursts (mean {mean:.0f}%)"
    if job.gpus == 1 and 0.05 <= idle < 0.6 and 10 <= mean <= 70 and job.hours >= 6:
        return "online_inference", (f"telemetry: a request-driven duty cycle for {job.hours:.0f} h (mean "
                                    f"{mean:.0f}%, idle {idle:.0%})")
    return UNCLASSIFIED, f"telemetry: no rule fits (mean {mean:.0f}%, idle {idle:.0%}, {job.gpus} GPUs)"


def class_usage(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per team and workload class: jobs, GPU-hours, cost, used GPU-hours and efficiency (used / measured
    GPU-hours), idle GPU-hours and their cost (waste), utilisation coverage, and how many jobs telemetry placed."""
    jobs = job_classes(store, start, end)
    columns = ["team", "workload_class", "jobs", "gpu_hours", "cost_usd", "used_gpu_hours", "efficiency",
               "idle_gpu_hours", "idle_cost_usd", "util_coverage", "placed_by_telemetry"]
    if jobs.empty:
        return pd.DataFrame(columns=columns)
    jobs["measured_hours"] = jobs["gpu_hours"] * jobs["util_coverage"].fillna(0)
    jobs["by_telemetry"] = jobs["class_rule"].fillna("").str.contains("telemetry: ") & \
        (jobs["workload_class"] != UNCLASSIFIED)
    grouped = jobs.groupby(["team", "workload_class"], dropna=False)
    out = grouped.agg(jobs=("job_id", "count"), gpu_hours=("gpu_hours", "sum"), cost_usd=("cost_usd", "sum"),
                      used_gpu_hours=("used_gpu_hours", lambda s: s.sum(min_count=1)),
                      idle_gpu_hours=("idle_gpu_hours", lambda s: s.sum(min_count=1)),
                      idle_cost_usd=("idle_cost_usd", lambda s: s.sum(min_count=1)),
                      measured_hours=("measured_hours", "sum"),
                      placed_by_telemetry=("by_telemetry", "sum")).reset_index()
    out["efficiency"] = out["used_gpu_hours"] / out["measured_hours"].where(out["measured_hours"] > 0)
    out["util_coverage"] = out["measured_hours"] / out["gpu_hours"].where(out["gpu_hours"] > 0)
    return out[columns].sort_values(["team", "cost_usd"], ascending=[True, False]).reset_index(drop=True)
