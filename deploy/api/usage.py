"""Usage: teams, a team's GPU-hours and cost over time, and cluster utilisation."""
from __future__ import annotations

from datetime import datetime

import pandas as pd
from fastapi import APIRouter, Query

from gpuledger.analytics.cost import cost_by_team_and_model
from gpuledger.analytics.records import json_safe, records
from gpuledger.analytics.usage import cluster_utilization, team_model_series, team_usage, team_usage_series
from gpuledger.analytics.windows import check_buckets
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import BucketMinutes, CaughtUp, Days, End, StoreDep, window
from gpuledger.deploy.api.models import Team, TeamUsage, UtilizationPoint

router = APIRouter(tags=["usage"], dependencies=[CaughtUp])  # deps.caught_up


@router.get("/v1/teams", response_model=list[Team])
def teams(caller: ReadCaller, store: StoreDep) -> list[dict]:
    """Every team with a share or with GPU usage, and the unattributed bucket when it has usage."""
    seen = pd.DataFrame({"team": pd.Series(store.teams(), dtype=object)})  # typed even when empty
    return caller.visible(records(seen.merge(store.team_table(), on="team", how="left")))


@router.get("/v1/teams/{team}/usage", response_model=TeamUsage)
def usage(team: str, caller: ReadCaller, store: StoreDep, days: float = Days, end: datetime | None = End,
          bucket_minutes: int = BucketMinutes) -> dict:
    """One team's allocated and used GPU-hours, cost per GPU model, a time series of its GPUs, and per GPU model
    its guarantee and limit next to the GPUs it held over time. At most 20,000 buckets per series (422 beyond,
    naming the bucket that fits)."""
    check_buckets(days, bucket_minutes)  # before any work: a parameter that cannot be answered
    caller.own(team, store)
    start, stop, span = window(days, end)
    totals = team_usage(store, start, stop, team)
    models = cost_by_team_and_model(store, start, stop, team)
    row = totals.iloc[0].to_dict() if not totals.empty else {
        "team": team, "allocated_gpu_hours": 0.0, "used_gpu_hours": 0.0, "jobs": 0, "efficiency": 0.0}
    row["cost_usd"] = float(models["cost_usd"].sum()) if not models.empty else 0.0
    quotas = store.team_quotas()
    return {"team": team, "window": span, "totals": json_safe(row), "by_model": records(models),
            "series": records(team_usage_series(store, start, stop, team, bucket_minutes)),
            "quotas": records(quotas[quotas["team"] == team].drop(columns="team")),
            "model_series": records(team_model_series(store, start, stop, team, bucket_minutes))}


@router.get("/v1/cluster/utilization", response_model=list[UtilizationPoint])
def utilization(caller: ReadCaller, store: StoreDep, days: float = Query(1.0, gt=0, le=366), end: datetime | None = End,
                bucket_minutes: int = BucketMinutes) -> list[dict]:
    """GPUs present, allocated and used per time bucket, cluster-wide; at most 20,000 buckets (422 beyond, naming
    the bucket that fits)."""
    check_buckets(days, bucket_minutes)
    start, stop, _ = window(days, end)
    return records(cluster_utilization(store, start, stop, bucket_minutes))
