"""Operations: health, Prometheus metrics and the agents pushing to this server."""
from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
from fastapi import APIRouter, Query, Request, Response
from prometheus_client import generate_latest

from gpuledger.analytics.fragmentation import holders
from gpuledger.analytics.records import json_safe, records
from gpuledger.analytics.usage import gpu_series, telemetry_coverage
from gpuledger.analytics.windows import buckets_in, fitting_bucket, utc_now
from gpuledger.deploy.api.access import ClusterCaller, ReadCaller
from gpuledger.deploy.api.deps import BucketMinutes, Days, End, StoreDep, window
from gpuledger.deploy.api.models import Gpus, Health, NodeStatus, TelemetryCoverage

router = APIRouter(tags=["ops"])
STALE_AFTER_INTERVALS = 3
MAX_GPU_POINTS = 200_000  # rows of /v1/gpus' series (~35 MB of JSON): 1,024 GPUs over 7 days at 60 minutes


@router.get("/healthz", response_model=Health)
def healthz(request: Request, store: StoreDep) -> dict:
    """Whether the server answers, how many samples it holds and the newest one's instant; `degraded`, with the
    reason, while the server's own collection has failed for 3 intervals or more."""
    loop = getattr(request.app.state, "collection", None)
    healthy, reason = loop.health() if loop is not None else (True, None)
    return {"status": "ok" if healthy else "degraded", "reason": reason, "samples": store.sample_count(),
            "latest_sample": json_safe(store.latest_ts())}


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


@router.get("/v1/nodes/telemetry", response_model=list[TelemetryCoverage])
def telemetry(caller: ReadCaller, store: StoreDep, minutes: float = Query(15.0, gt=0, le=1440, description="look back this far")) -> list:
    """Per node, the share of recent samples that carry each optional field: which charts can have data, and
    where profiling fields (SM activity, tensor activity) are not collected at all."""
    latest = store.latest_ts()
    if latest is None:
        return []
    return records(telemetry_coverage(store, latest + timedelta(microseconds=1), minutes))


@router.get("/v1/gpus", response_model=Gpus)
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
    return {"at": json_safe(latest), "holders": caller.redact(records(held)) if held is not None else [],
            "bucket_minutes": bucket_minutes, "series": records(gpu_series(store, start, stop, bucket_minutes))}
