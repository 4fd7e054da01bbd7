"""Capacity: the per-model demand forecast of the monthly capacity review (analytics/forecast.py). A read over every
team's use, but per GPU model only, with no team named: any read token (a team's included) may see it."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Query

from gpuledger.analytics.forecast import DEFAULT_WEEKS, MAX_WEEKS, MIN_WEEKS, demand_forecast
from gpuledger.analytics.records import json_safe
from gpuledger.analytics.windows import as_utc, utc_now
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import CaughtUp, ConfigDep, End, StoreDep
from gpuledger.deploy.api.models import CapacityForecast

router = APIRouter(tags=["capacity"], dependencies=[CaughtUp])  # deps.caught_up

Weeks = Query(DEFAULT_WEEKS, ge=MIN_WEEKS, le=MAX_WEEKS,
              description=f"whole weeks of history to fit the trend through, ending at `end` ({MIN_WEEKS} to "
                          f"{MAX_WEEKS})")


@router.get("/v1/capacity/forecast", response_model=CapacityForecast)
def forecast(caller: ReadCaller, store: StoreDep, config: ConfigDep, weeks: int = Weeks,
             end: datetime | None = End) -> dict:
    """Per GPU model present: the weekly demand (busy plus queued GPU-hours) of the `weeks` whole weeks before
    `end`, its least-squares trend with the slope's 80% interval, and the weeks until it reaches the model's
    capacity (GPUs x 168 hours) with the range that interval implies. A model with fewer than three whole weeks of
    samples is insufficient_data with the reason; a flat or falling trend is not_saturating; a model without
    utilisation readings is forecast on its allocated GPU-hours, and its `basis` says so."""
    at = as_utc(end) if end is not None else utc_now()
    return json_safe(demand_forecast(store, at, weeks, config.waste.idle_util_pct))
