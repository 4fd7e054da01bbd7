"""Inference services: throughput, latency against their SLOs, and cost per result (analytics/inference.py)."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Query

from gpuledger.analytics.inference import service_table, team_inference, unknown_slo_names
from gpuledger.analytics.records import records
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import CaughtUp, ConfigDep, Days, End, StoreDep, window
from gpuledger.deploy.api.models import Inference

router = APIRouter(tags=["inference"], dependencies=[CaughtUp])  # deps.caught_up


@router.get("/v1/inference", response_model=Inference)
def inference(caller: ReadCaller, store: StoreDep, config: ConfigDep, days: float = Days,
              end: datetime | None = End,
              limit: int = Query(200, ge=1, le=5000, description="service rows, most costly (then busiest) first; "
                                                                "the team totals cover every service")) -> dict:
    """Per service (server kind, model served, team): requests and tokens per second, TTFT, time per output token
    and end-to-end latency p50/p95/p99 against its SLO, queue depth and KV-cache use, the GPU cost of its pods and
    cost per million tokens and per thousand requests; per team the same cost per million tokens. Read from the
    servers' own /metrics (`[[apps.targets]]`, or the demo's simulated vLLM servers). A figure a server does not
    report is null; a service whose pods have no GPU samples has no cost and says so."""
    start, stop, span = window(days, end)
    services = service_table(store, start, stop, config.slo)
    shown = services.sort_values(["cost_usd", "requests"], ascending=False, na_position="last").head(limit) \
        if len(services) else services
    return {"window": span, "services": caller.visible(records(shown), shared=False),
            "teams": caller.visible(records(team_inference(services)), shared=False),
            "unknown_slos": unknown_slo_names(store, config.slo) if caller.team is None else []}
