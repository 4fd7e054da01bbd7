"""GPU health: XID errors, throttling, ECC and row remapping, per event, per job that held the GPU, and per GPU."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Query

from gpuledger.analytics.health import events_until, health_by_gpu, health_by_job, health_events
from gpuledger.analytics.records import json_safe, records
from gpuledger.collector.gpu_health import KINDS
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import CaughtUp, Days, End, StoreDep, window
from gpuledger.deploy.api.models import HealthReport

router = APIRouter(tags=["health"], dependencies=[CaughtUp])  # deps.caught_up
Kind = Literal[KINDS]  # type: ignore[valid-type]


@router.get("/v1/health", response_model=HealthReport)
def gpu_health(caller: ReadCaller, store: StoreDep, days: float = Days, end: datetime | None = End,
               node: str | None = Query(None, description="only this node"),
               team: str | None = Query(None, description="only events on GPUs this team's jobs held"),
               kind: Kind | None = Query(None, description="only this kind of event"),
               limit: int = Query(500, ge=1, le=10000, description="most events listed")) -> dict:
    """Health events of the window (XID codes, throttling starts, ECC and row-remap increases), each with the job
    that held the GPU, plus per-job and per-GPU counts: the failed jobs and sick GPUs to look at next to cost. Every
    part of the answer holds to the same filters (node, team)."""
    start, stop, span = window(days, end)
    team = caller.own(team, store)
    return {"window": span, "events_until": json_safe(events_until(store)),
            "events": records(health_events(store, start, stop, node, team, kind, limit)),
            "by_job": records(health_by_job(store, start, stop, team, node)),
            "by_gpu": records(health_by_gpu(store, start, stop, node, team))}
