"""Workloads: queue waits, outcomes and what waits now, from the schedulers' job records (collector/jobs)."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter

from gpuledger.analytics.records import json_safe, records
from gpuledger.analytics.windows import utc_now
from gpuledger.analytics.workloads import outcomes, waiting_now, workload_summary
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import CaughtUp, Days, End, StoreDep, window
from gpuledger.deploy.api.models import Workloads

router = APIRouter(tags=["workloads"], dependencies=[CaughtUp])  # deps.caught_up


@router.get("/v1/workloads", response_model=Workloads)
def workloads(caller: ReadCaller, store: StoreDep, days: float = Days, end: datetime | None = End) -> dict:
    """Per team and GPU model: queue waits (p50, p95, longest) of the jobs that started in the window, jobs and
    GPU-hours by outcome (GPU-hours lost to failed and preempted work on a line of their own), restarts, and the
    jobs waiting now with the scheduler's reason. Empty where no scheduler's job records were loaded
    (`gpuledger import sacct`): no wait is ever assumed to be zero."""
    start, stop, span = window(days, end)
    at = min(stop, utc_now())
    return {"window": span, "at": json_safe(at),
            "by_team": caller.visible(records(workload_summary(store, start, stop, at)), shared=False),
            "outcomes": caller.visible(records(outcomes(store, start, stop, at)), shared=False),
            "waiting_now": caller.visible(records(waiting_now(store, at)), shared=False)}
