"""Quota and placement recommendations, each with the evidence behind it.

Quota: a team's demand is the 95th percentile of its hourly concurrent GPUs in the window,
minus the GPUs it held idle, plus what it has pending now; the recommendation adds the
configured headroom. If the recommendations together exceed the cluster, they are scaled
down in proportion so they stay schedulable. Only changes of at least one GPU and 10% are
emitted, to keep schedulers from flapping.

Placement: GPUs idle right now for longer than the idle threshold should be reclaimed;
jobs whose peak memory fits a MIG slice or a smaller card should move there.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.records import json_safe
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import capacity_gpus, hourly_demand, interval_at, pending_jobs
from gpuledger.analytics.waste import idle_runs, oversized_jobs
from gpuledger.policies.fairshare import fairshare_history


@dataclass
class Recommendation:
    kind: str  # "quota" | "reclaim" | "resize"
    team: str
    action: dict[str, Any]
    evidence: dict[str, Any]
    reason: str
    job_id: str | None = None
    id: str = field(default="")

    def __post_init__(self) -> None:
        if not self.id:
            key = json.dumps([self.kind, self.team, self.job_id, self.action], sort_keys=True, default=str)
            self.id = hashlib.sha1(key.encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))


def _largest_remainder(values: dict[str, float], total: int) -> dict[str, int]:
    floors = {k: int(math.floor(v)) for k, v in values.items()}
    left = total - sum(floors.values())
    for k in sorted(values, key=lambda k: values[k] - floors[k], reverse=True)[:max(left, 0)]:
        floors[k] += 1
    return floors


def quota_recommendations(store: Store, config: Config, start: datetime, end: datetime) -> list[Recommendation]:
    teams = store.team_table()
    if teams.empty:
        return []
    capacity = capacity_gpus(store, end)
    demand = hourly_demand(store, start, end, config.idle_util_pct)
    pending = pending_jobs(store)
    pending_gpus = dict(zip(pending["team"], pending["gpus"]))
    fair = fairshare_history(store, start, end, config.half_life_days)
    latest_fair = (fair.sort_values("hour").groupby("team").tail(1).set_index("team")["fairshare"].to_dict()
                   if not fair.empty else {})
    wanted: dict[str, float] = {}
    evidence: dict[str, dict[str, Any]] = {}
    for row in teams.itertuples(index=False):
        series = demand[demand["team"] == row.team]
        busy = (series["allocated_gpus"] - series["idle_gpus"]).clip(lower=0)
        p95_busy = float(np.percentile(busy, 95)) if len(busy) else 0.0
        want = (p95_busy + float(pending_gpus.get(row.team, 0))) * (1.0 + config.quota_headroom)
        wanted[row.team] = want
        evidence[row.team] = {
            "window_start": start, "window_end": end,
            "p95_allocated_gpus": float(np.percentile(series["allocated_gpus"], 95)) if len(series) else 0.0,
            "mean_allocated_gpus": float(series["allocated_gpus"].sum() / max(len(series), 1)),
            "p95_busy_gpus": p95_busy,
            "idle_allocated_gpu_hours": float(series["idle_gpus"].sum()),
            "pending_gpus": float(pending_gpus.get(row.team, 0)),
            "share": float(row.share), "fairshare_factor": latest_fair.get(row.team),
            "cluster_gpus": capacity,
        }
    total_wanted = sum(math.ceil(v) for v in wanted.values())
    scaled_down = bool(capacity and total_wanted > capacity)
    if scaled_down:
        scaled = _largest_remainder({t: v * capacity / sum(wanted.values()) for t, v in wanted.items()},
                                    int(capacity))
    else:
        scaled = {t: int(math.ceil(v)) for t, v in wanted.items()}
    out = []
    for row in teams.itertuples(index=False):
        current = None if pd.isna(row.quota_gpus) else int(row.quota_gpus)
        proposed = max(1, scaled[row.team])
        if current is not None and abs(proposed - current) < max(1.0, 0.1 * current):
            continue
        ev = evidence[row.team]
        direction = "raise" if current is None or proposed > current else "lower"
        out.append(Recommendation(
            kind="quota", team=row.team,
            action={"quota_gpus": proposed, "current_quota_gpus": current},
            evidence=ev,
            reason=(f"{direction} {row.team} GPU quota from {current} to {proposed}: p95 busy "
                    f"{ev['p95_busy_gpus']:.1f} GPUs, {ev['pending_gpus']:.0f} pending, "
                    f"{ev['idle_allocated_gpu_hours']:.0f} GPU-h held idle"
                    + (f"; all teams' demand exceeds the {capacity:.0f}-GPU cluster, so scaled by share of demand"
                       if scaled_down else "")),
        ))
    return out


def placement_recommendations(store: Store, config: Config, start: datetime, end: datetime) -> list[Recommendation]:
    out: list[Recommendation] = []
    latest = store.latest_ts(before=end)
    runs = idle_runs(store, start, end, config.idle_minutes, config.idle_util_pct)
    if latest is not None and not runs.empty:
        step = pd.Timedelta(seconds=float(interval_at(store, latest) or 60))
        ongoing = runs[runs["end_ts"] >= pd.Timestamp(latest) + step - pd.Timedelta(seconds=1)]
        for job_id, group in ongoing.groupby("job_id", dropna=False):
            team = str(group["team"].iloc[0])
            rate = float(group["idle_cost_usd"].sum() / max(group["idle_gpu_hours"].sum(), 1e-9))
            job = None if pd.isna(job_id) else str(job_id)
            out.append(Recommendation(
                kind="reclaim", team=team, job_id=job,
                action={"reclaim_gpus": sorted(group["gpu_uuid"].tolist()), "node": str(group["node"].iloc[0])},
                evidence={"idle_minutes": float(group["idle_minutes"].min()),
                          "idle_gpu_hours": float(group["idle_gpu_hours"].sum()),
                          "idle_cost_usd": float(group["idle_cost_usd"].sum()),
                          "cost_per_hour_usd": rate * len(group),
                          "mean_util_pct": float(group["mean_util_pct"].mean()),
                          "idle_since": group["start_ts"].min()},
                reason=(f"{job or 'unattributed workload'} has held {len(group)} GPU(s) on "
                        f"{group['node'].iloc[0]} idle for {group['idle_minutes'].min():.0f} min"),
            ))
    reclaimed = {r.job_id for r in out}
    over = oversized_jobs(store, start, end, config.oversized_mem_fraction)
    if latest is not None and not over.empty:
        for row in over.itertuples(index=False):
            if row.fits is None or pd.Timestamp(row.last_ts) < pd.Timestamp(latest):
                continue  # finished jobs are reported as waste; only running ones can be moved
            if row.job_id in reclaimed:
                continue  # an idle job should give its GPU back, not move to a smaller one
            saving = row.cost_usd * (1.0 - row.fits["gpu_fraction"]) if row.fits["kind"] == "mig" else None
            out.append(Recommendation(
                kind="resize", team=str(row.team), job_id=str(row.job_id),
                action={"move_to": row.fits["target"], "target_kind": row.fits["kind"], "from": row.gpu_model,
                        "gpus": int(row.gpus)},
                evidence={"peak_mem_mib": float(row.peak_mem_mib), "mem_total_mib": float(row.mem_total_mib),
                          "peak_mem_fraction": float(row.peak_mem_mib / row.mem_total_mib),
                          "mean_util_pct": float(row.mean_util_pct), "p95_util_pct": float(row.p95_util_pct),
                          "gpu_hours": float(row.gpu_hours), "cost_usd": float(row.cost_usd),
                          "estimated_saving_usd": saving},
                reason=(f"{row.job_id} peaked at {row.peak_mem_mib / 1024:.1f} GiB of "
                        f"{row.mem_total_mib / 1024:.0f} GiB on {row.gpu_model}; fits {row.fits['target']}"),
            ))
    return out


def recommend(store: Store, config: Config, start: datetime, end: datetime) -> list[Recommendation]:
    return quota_recommendations(store, config, start, end) + placement_recommendations(store, config, start, end)
