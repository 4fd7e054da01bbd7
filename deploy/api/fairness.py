"""Fairness: the fairshare factor of every team over time."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Query

from gpuledger.analytics.records import records
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import CaughtUp, ConfigDep, End, StoreDep, window
from gpuledger.deploy.api.models import Fairshare
from gpuledger.policies.fairshare import fairshare_history

router = APIRouter(tags=["fairness"], dependencies=[CaughtUp])  # deps.caught_up


@router.get("/v1/fairshare", response_model=Fairshare)
def fairshare(caller: ReadCaller, store: StoreDep, config: ConfigDep, days: float = Query(14.0, gt=0, le=366),
              end: datetime | None = End) -> dict:
    """The configured fairshare algorithm's factor per team and hour over the window viewed.

    Each hour's value comes from the usage before it (the algorithm's whole memory), so it does not depend
    on `days`: a longer view shows more hours of the same history."""
    start, stop, _ = window(days, end)
    return {"algorithm": config.fairshare.algorithm, "half_life_days": config.fairshare.half_life_days,
            "history": caller.visible(records(fairshare_history(store, config, start, stop)))}
