"""Recommendations for schedulers: quota, reclaim and resize advice with its evidence."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Query

from gpuledger.analytics.windows import utc_now
from gpuledger.deploy.api.deps import ConfigDep, Days, End, StoreDep, window
from gpuledger.deploy.api.models import Recommendations
from gpuledger.policies.recommender import recommend

router = APIRouter(tags=["recommendations"])


@router.get("/v1/recommendations", response_model=Recommendations)
def recommendations(store: StoreDep, config: ConfigDep, days: float = Days, end: datetime | None = End,
                    kind: str | None = Query(None, pattern="^(quota|reclaim|resize)$"),
                    team: str | None = None) -> dict:
    """Quota changes, GPUs to reclaim and jobs to resize, each with the measurements behind it."""
    start, stop, span = window(days, end)
    recs = [r.to_dict() for r in recommend(store, config, start, stop)
            if (kind is None or r.kind == kind) and (team is None or r.team == team)]
    return {"generated_at": utc_now(), "window": span, "recommendations": recs}
