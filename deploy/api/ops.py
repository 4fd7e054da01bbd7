"""Operations: health, Prometheus metrics and the agents pushing to this server."""
from __future__ import annotations

from datetime import datetime, timedelta

import anyio

import pandas as pd
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import generate_latest

from gpuledger.analytics.fragmentation import holders
from gpuledger.analytics.records import json_safe, records
from gpuledger.analytics.usage import gpu_series, telemetry_coverage
from gpuledger.analytics.windows import buckets_in, fitting_bucket, utc_now
from gpuledger.deploy.api.access import ClusterCaller, ReadCaller
from gpuledger.collector.errors import CatchingUpError
from gpuledger.deploy.api.deps import BucketMinutes, CaughtUp, Days, End, StoreDep, fold_state, window
from gpuledger.deploy.api.models import Gpus, Health, Liveness, NodeStatus, Readiness, TelemetryCoverage

router = APIRouter(tags=["ops"])
STALE_AFTER_INTERVALS = 3
MAX_GPU_POINTS = 200_000  # rows of /v1/gpus' series (~35 MB of JSON): 1,024 GPUs over 7 days at 60 minutes


# the probes' own threads: a pool full of slow reads (deploy/api/read_limits.py) never makes a probe wait
PROBE_THREADS = anyio.CapacityLimiter(4)


@router.get("/livez", response_model=Liveness)
async def livez() -> dict:
    """Liveness: the process serves requests. Constant cost, no store access and no worker thread (answered on the
    event loop), so a probe never kills a server that is busy folding a backlog or answering slow reads (use
    /readyz for whether it answers analytic reads)."""
    return {"status": "ok"}


@router.get("/readyz", response_model=Readiness,
            responses={503: {"model": Readiness, "description": "folding a backlog: not ready for analytic reads"}})
async def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 when the store is caught up and analytic reads are answered; 503 (with Retry-After) while the
    server folds a backlog. Constant cost, on the probes' own threads."""
    state = await anyio.to_thread.run_sync(fold_state, request.app.state.store, limiter=PROBE_THREADS)
    body = json_safe({"ready": not state["catching_up"], **state})
    if state["catching_up"]:
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(CatchingUpError.retry_after_s)})
    return JSONResponse(body)


@router.get("/healthz", response_model=Health)
async def healthz(request: Request) -> dict:
    """Whether the server answers, how many samples it holds, the newest one's instant and how far the fold is
    behind it; `degraded`, with the reason, while the server's own collection has failed for 3 intervals or more.
    Cheap while a backlog is folded (the unfolded rows are counted, not aggregated), on the probes' own threads."""
    return await anyio.to_thread.run_sync(_health, request, limiter=PROBE_THREADS)


def _health(request: Request) -> dict:
    """/healthz's answer (no dependency: FastAPI would resolve a synchronous one on the worker pool)."""
    store = request.app.state.store
    loop = getattr(request.app.state, "collection", None)
    healthy, reason = loop.health() if loop is not None else (True, None)
    jobs = getattr(request.app.state, "job_source", None)
    if healthy and jobs is not None:
        healthy, reason = jobs.health()
    apps = getattr(request.app.state, "app_source", None)
    if healthy and apps is not None:
        healthy, reason = apps.health()
    return {"status": "ok" if healthy else "degraded", "reason": reason, "samples": store.sample_count(),
            "latest_sample": json_safe(store.newest_sample()),
            "job_source": jobs.state() if jobs is not None else None,
            "app_source": apps.state() if apps is not None else None,
            **json_safe(fold_state(store))}


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format 0.0.4"}})
def metrics(request: Request, caller: ClusterCaller) -> Response:
    """Prometheus text exposition of this process's own metrics (collector, store and ingest)."""
    return Response(generate_latest(request.app.state.metrics), media_type="text/plain; version=0.0.4")


@router.get("/v1/nodes", response_model=list[NodeStatus])
def nodes(caller: ReadCaller, store: StoreDep) -> list[dict]:
    """Agents that have pushed batches; `stale` after 3 intervals without one."""
    frame = store.nodes()
    now = pd.Timestamp(utc_now())
    frame["seconds_since"] = (now - pd.to_datetime(frame["last_seen"], utc=True)).dt.total_seconds()
    frame["stale"] = frame["seconds_since"] > STALE_AFTER_INTERVALS * frame["interval_s"]
    return records(frame)


@router.get("/v1/nodes/telemetry", response_model=list[TelemetryCoverage], dependencies=[CaughtUp])
def telemetry(caller: ReadCaller, store: StoreDep, minutes: float = Query(15.0, gt=0, le=1440, description="look back this far")) -> list:
    """Per node, the share of recent samples that carry each optional field: which charts can have data, and
    where profiling fields (SM activity, tensor activity) are not collected at all."""
    latest = store.latest_ts()
    if latest is None:
        return []
    return records(telemetry_coverage(store, latest + timedelta(microseconds=1), minutes))


@router.get("/v1/gpus", response_model=Gpus, dependencies=[CaughtUp])
def gpus(caller: ReadCaller, store: StoreDep, days: float = Days, end: datetime | None = End,
         bucket_minutes: int = BucketMinutes) -> dict:
    """The inventory (every GPU and who holds it now) and, per GPU and time bucket, utilisation, memory and power:
    what a heatmap of the cluster is drawn from. When the GPUs now times the window's buckets would pass
    MAX_GPU_POINTS, a coarser bucket is used and given as `bucket_minutes` (366 days at 1 minute was 43 MB)."""
    start, stop, _ = window(days, end)
    latest = store.latest_ts(before=stop)
    held = holders(store, latest + timedelta(microseconds=1)) if latest is not None else None
    series = len(held) if held is not None else 1
    if buckets_in(days, bucket_minutes) * series > MAX_GPU_POINTS:
        bucket_minutes = min(1440, fitting_bucket(days, series, MAX_GPU_POINTS))
    shown = caller.redact(records(held), ("team", "job_id", "dra_claim")) if held is not None else []
    return {"at": json_safe(latest), "holders": shown,
            "bucket_minutes": bucket_minutes, "series": records(gpu_series(store, start, stop, bucket_minutes))}
