"""Placement advice for running jobs: give back GPUs held idle, or move to a smaller shape.

Reclaim: a job whose GPUs have been idle (under `idle_util_pct`) for at least `idle_minutes` up to the
instant evaluated should give them back. Resize: a running job whose peak memory (with 20% headroom) and p95
compute fit a MIG slice of its card, or a smaller card, should move there. A job that is idle gets reclaim
advice, never resize: moving an idle job to a slice still wastes the slice.

Both rest on measured utilisation only: time without a utilisation reading (the Philly and Helios traces, a
failed read) is unknown, never idle, so it neither makes nor lengthens a reclaim, and a job without a p95 from
readings gets no resize.
"""
from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import interval_at
from gpuledger.analytics.waste import idle_runs, oversized_jobs
from gpuledger.policies.efficiency_advice import efficiency_advice
from gpuledger.policies.inference_advice import judged_jobs, missed_slos, rightsize_advice
from gpuledger.policies.colocation import colocate_advice
from gpuledger.policies.consolidation import consolidate_advice, separate_advice
from gpuledger.policies.quota import HOURS_PER_WEEK
from gpuledger.policies.recommendation import Recommendation


def reclaim_advice(store: Store, config: Config, start: datetime, at: datetime,
                   latest: datetime) -> list[Recommendation]:
    runs = idle_runs(store, start, at, config.waste)
    # only measured idleness: a stretch is made of readings under the threshold, so it has a mean reading; one
    # without (a store whose rollups predate schema 9 and were not rebuilt) is no evidence
    runs = runs[runs["mean_util_pct"].notna()]
    if runs.empty:
        return []
    step = pd.Timedelta(seconds=float(interval_at(store, latest) or 60))
    ongoing = runs[runs["end_ts"] >= pd.Timestamp(latest) + step - pd.Timedelta(seconds=1)]
    out = []
    for job_id, group in ongoing.groupby("job_id", dropna=False):
        job = None if pd.isna(job_id) else str(job_id)
        node = str(group["node"].iloc[0])
        per_hour = float(group["idle_cost_usd"].sum() / max(group["idle_gpu_hours"].sum(), 1e-9)) * len(group)
        out.append(Recommendation(
            kind="reclaim", team=str(group["team"].iloc[0]), gpu_model=str(group["gpu_model"].iloc[0]), job_id=job,
            action={"reclaim_gpus": sorted(group["gpu_uuid"].tolist()), "node": node, "gpus": len(group)},
            evidence={"idle_minutes": float(group["idle_minutes"].min()),
                      "idle_gpu_hours": float(group["idle_gpu_hours"].sum()),
                      "idle_cost_usd": float(group["idle_cost_usd"].sum()), "cost_per_hour_usd": per_hour,
                      "effect_usd_per_week": per_hour * HOURS_PER_WEEK,
                      "mean_util_pct": float(group["mean_util_pct"].mean()), "idle_since": group["start_ts"].min(),
                      "idle_util_pct": config.waste.idle_util_pct},
            reason=(f"{job or 'unattributed workload'} has held {len(group)} GPU(s) on {node} idle for "
                    f"{group['idle_minutes'].min():.0f} min; giving them back frees ${per_hour:,.2f}/h "
                    f"(${per_hour * HOURS_PER_WEEK:,.0f}/week)")))
    return out


def resize_advice(store: Store, config: Config, start: datetime, at: datetime, latest: datetime,
                  skip_jobs: set[str | None]) -> list[Recommendation]:
    over = oversized_jobs(store, start, at, config.waste)
    rates = store.current_rates()
    out = []
    for row in over.itertuples(index=False):
        if row.fits is None or pd.Timestamp(row.last_ts) < pd.Timestamp(latest):
            continue  # finished jobs are reported as waste; only running ones can be moved
        if row.job_id in skip_jobs:
            continue  # reclaimed: an idle job should give its GPUs back, not move to a smaller shape
        fraction = float(row.fits["gpu_fraction"])
        gpus = int(row.gpus)
        rate = float(row.usd_per_gpu_hour) if pd.notna(row.usd_per_gpu_hour) else None
        freed = gpus * (1.0 - fraction) if row.fits["kind"] == "mig" else None
        target = row.fits["target"]
        # a slice frees the rest of each card; a smaller card saves the difference in its rate-card price
        cheaper = rates.get(target) if freed is None else None
        saving = (freed * rate * HOURS_PER_WEEK if freed is not None and rate is not None else
                  gpus * (rate - float(cheaper)) * HOURS_PER_WEEK if rate is not None and cheaper is not None else None)
        out.append(Recommendation(
            kind="resize", team=str(row.team), gpu_model=str(row.gpu_model), job_id=str(row.job_id),
            action={"move_to": target, "target_kind": row.fits["kind"], "from": row.gpu_model, "gpus": gpus,
                    "per_gpu": True, "target_gpu_fraction": fraction, "gpus_freed": freed},
            evidence={"peak_mem_mib": float(row.peak_mem_mib), "mem_total_mib": float(row.mem_total_mib),
                      "peak_mem_fraction": float(row.peak_mem_mib / row.mem_total_mib),
                      "mean_util_pct": float(row.mean_util_pct), "p95_util_pct": float(row.p95_util_pct),
                      "compute_pct": float(row.compute_pct), "compute_signal": row.compute_signal,
                      **({} if pd.isna(row.sm_active) else {"sm_active": float(row.sm_active)}),
                      "gpu_hours": float(row.gpu_hours), "cost_usd": float(row.cost_usd),
                      "effect_usd_per_week": saving},
            reason=(f"{row.job_id} peaked at {row.peak_mem_mib / 1024:.1f} GiB of {row.mem_total_mib / 1024:.0f} GiB "
                    f"per {row.gpu_model} at p95 {row.p95_util_pct:.0f}% busy"
                    + (f" ({row.compute_pct:.0f}% of the card by SM activity)" if row.compute_signal == "sm_active"
                       else "") + f"; each of its {gpus} GPU(s) fits "
                    f"{target}" + (f": {freed:.2f} GPUs freed in total, ${saving:,.0f}/week" if saving and freed else
                                   f": ${saving:,.0f}/week at the rate card" if saving else ""))))
    return out


def placement_advice(store: Store, config: Config, at: datetime) -> list[Recommendation]:
    """Reclaim, resize, consolidation and co-location advice for what runs at `at`, from the policy window
    before it."""
    latest = store.latest_ts(before=at)
    if latest is None:
        return []
    start = at - timedelta(days=config.quota.window_days)
    # the usage read for reclaim and resize stops at the start of `at`'s minute (usage_between reads whole
    # minutes): "still running" is judged against the newest sample read, not one taken since in that minute,
    # which a live collector sampling every 15 s nearly always holds (and then no job looked running)
    read = store.latest_ts(before=pd.Timestamp(at).floor("min").to_pydatetime())
    reclaim = reclaim_advice(store, config, start, at, read) if read is not None else []
    # a pod of a service with an SLO is sized by what its service achieves (right-size when far inside the SLO,
    # from its weights and KV cache), never by the memory rule: near or over its bound, a smaller shape would make
    # it miss; the memory rule sizes the rest
    missed = missed_slos(store, config, at)
    reclaimed = {r.job_id for r in reclaim}
    services = rightsize_advice(store, config, at, read, reclaimed) if read is not None else []
    resize = resize_advice(store, config, start, at, read, reclaimed | judged_jobs(store, config, at)) \
        if read is not None else []
    efficiency = efficiency_advice(store, config, start, at, read) if read is not None else []
    return (reclaim + services + resize + efficiency
            + consolidate_advice(store, config, at, latest) + colocate_advice(store, config, at, latest)
            + separate_advice(store, config, at, latest, missed))
