"""Efficiency beyond GPU_UTIL: what the profiling readings say jobs and teams achieve (analytics/efficiency.py)."""
from __future__ import annotations

from dataclasses import asdict
from datetime import datetime

from fastapi import APIRouter, Query

from gpuledger.analytics.efficiency import EFFICIENCY_FLAGS, flagged_by_team, job_efficiency, team_efficiency
from gpuledger.analytics.records import records
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import CaughtUp, ConfigDep, Days, End, StoreDep, window
from gpuledger.deploy.api.models import Efficiency

router = APIRouter(tags=["efficiency"], dependencies=[CaughtUp])  # deps.caught_up


@router.get("/v1/efficiency", response_model=Efficiency)
def efficiency(caller: ReadCaller, store: StoreDep, config: ConfigDep, days: float = Days, end: datetime | None = End,
               limit: int = Query(200, ge=1, le=1000, description="job rows, most costly first")) -> dict:
    """Per team and per job (like jobstats): SM activity, SM occupancy, tensor and DRAM activity over the GPU-seconds
    that read them, the coverage they rest on, GPU_UTIL on the same samples, NVLink and PCIe bytes, and the flags
    the readings support (busy but starved: input pipeline or communication bound; memory-bandwidth bound; tensor
    cores idle). A GPU that does not report a field has null, never 0; a job whose readings are too few has no flag
    and a note saying so."""
    start, stop, span = window(days, end)
    jobs = job_efficiency(store, start, stop, config.efficiency, limit=limit)
    return {"window": span, "flags": EFFICIENCY_FLAGS, "thresholds": asdict(config.efficiency),
            "teams": caller.visible(records(team_efficiency(store, start, stop))),
            "flagged": caller.visible(records(flagged_by_team(jobs)), shared=False),
            "jobs": caller.visible(records(jobs), shared=False)}
