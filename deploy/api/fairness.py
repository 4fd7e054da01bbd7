"""Fairness: the fairshare factor of every team over time."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Query

from gpuledger.analytics.records import records
from gpuledger.deploy.api.deps import ConfigDep, End, StoreDep, window
from gpuledger.deploy.api.models import Fairshare
from gpuledger.policies.fairshare import fairshare_history

router = APIRouter(tags=["fairness"])


@router.get("/v1/fairshare", response_model=Fairshare)
def fairshare(store: StoreDep, config: ConfigDep, days: float = Query(14.0, gt=0, le=366),
              end: datetime | None = End) -> dict:
    """Slurm's classic factor F = 2^(-U/S) per team and hour, usage decayed with the configured half-life."""
    start, stop, _ = window(days, end)
    return {"half_life_days": config.half_life_days,
            "history": records(fairshare_history(store, start, stop, config.half_life_days))}
