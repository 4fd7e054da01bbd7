"""The HTTP API: recommendations for schedulers, usage/cost/waste/fairshare for the dashboard.

The API process owns the DuckDB file (DuckDB admits one writer), so the dashboard and any
other reader go through these read-only endpoints rather than opening the file.
"""
from __future__ import annotations

import asyncio
import secrets
from datetime import datetime, timedelta
from typing import Any

import pandas as pd
from fastapi import FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import generate_latest

from analytics.config import Config
from analytics.cost import cost_by_team, cost_by_team_and_model
from analytics.fairshare import fairshare_history
from analytics.ingest import IngestWriter, InvalidBatch
from analytics.store import Store
from analytics.usage import cluster_utilization, team_usage, team_usage_series
from analytics.waste import idle_runs, oversized_jobs, waste_by_team
from analytics.windows import as_utc, utc_now
from collector.self_metrics import REGISTRY
from collector.wire import CONTENT_TYPE, WireError, decode
from policies.recommender import json_safe, recommend

API_VERSION = "v1"
MAX_BATCH_BYTES = 64 * 1024 * 1024
STALE_AFTER_INTERVALS = 3


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return json_safe(frame.to_dict(orient="records"))


def window(days: float, end: datetime | None) -> tuple[datetime, datetime]:
    stop = as_utc(end) if end else utc_now()
    return stop - timedelta(days=days), stop


Days = Query(7.0, gt=0, le=366, description="Window length in days, ending at `end`")
End = Query(None, description="Window end (ISO 8601); default now")


def _check_token(expected: str | None, authorization: str | None) -> None:
    """Every write needs the server's bearer token; a server started without one accepts no writes."""
    if not expected:
        raise HTTPException(status_code=403, detail="this server accepts no writes: start it with --token")
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(status_code=401, detail="missing or wrong bearer token",
                            headers={"WWW-Authenticate": "Bearer"})


def create_app(store: Store, config: Config, ingest: IngestWriter | None = None,
               token: str | None = None) -> FastAPI:
    app = FastAPI(
        title="gpuledger",
        version="0.1.0",
        description="GPU usage, cost, waste and fairshare, and quota/placement recommendations for schedulers.",
    )

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, Any]:
        latest = store.scalar("SELECT max(ts) FROM samples")
        return {"status": "ok", "samples": store.sample_count(), "latest_sample": json_safe(latest)}

    @app.get("/metrics", tags=["ops"], response_class=Response)
    def metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type="text/plain; version=0.0.4")

    @app.post("/v1/ingest", tags=["ingest"])
    async def ingest_batch(
        request: Request,
        authorization: str | None = Header(None),
        x_gpuledger_node: str = Header(..., min_length=1, max_length=253, pattern=r"^[A-Za-z0-9._:-]+$"),
        x_gpuledger_stream: str = Header(..., min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$"),
        x_gpuledger_seq: int = Header(..., ge=0),
        x_gpuledger_interval: float = Header(..., gt=0, le=86400),
        x_gpuledger_batches: int = Header(1, ge=1, le=10_000),
    ) -> JSONResponse:
        """Store agent batches (Arrow IPC stream) exactly once; resending an acknowledged batch is harmless.

        One batch per request, answered with its `status` ("stored" or "duplicate"), `rows` stored, rows
        `rejected` by reason and `nulled_values` (NaN/Inf stored as NULL). Or `X-Gpuledger-Batches: N`
        consecutive batches from `X-Gpuledger-Seq`, each row's batch in a `_seq` column (how an agent drains a
        backlog), answered with `first_seq`, `batches`, `rows` (a list, per batch), `duplicates` (seqs already
        stored), and `rejected` and `nulled_values` keyed by seq for the batches that had any.
        """
        _check_token(token, authorization)
        if ingest is None:
            raise HTTPException(status_code=503, detail="ingest is not enabled on this server")
        if request.headers.get("content-type", "").split(";")[0] != CONTENT_TYPE:
            raise HTTPException(status_code=415, detail=f"send {CONTENT_TYPE}")
        body = await request.body()
        if len(body) > MAX_BATCH_BYTES:
            raise HTTPException(status_code=413, detail=f"batch over {MAX_BATCH_BYTES} bytes")
        try:
            pending = ingest.enqueue(x_gpuledger_node, x_gpuledger_stream, x_gpuledger_seq, x_gpuledger_batches,
                                     x_gpuledger_interval, decode(body))
        except (WireError, InvalidBatch) as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
        results = await asyncio.wrap_future(pending)  # the writer thread answers; no thread waits here
        return JSONResponse(results.answer())

    @app.get("/v1/nodes", tags=["ops"])
    def nodes() -> list[dict[str, Any]]:
        """Agents that have pushed batches; `stale` after 3 intervals without one."""
        frame = store.query("SELECT * FROM nodes ORDER BY node")
        now = pd.Timestamp(utc_now())
        frame["seconds_since"] = (now - pd.to_datetime(frame["last_seen"], utc=True)).dt.total_seconds()
        frame["stale"] = frame["seconds_since"] > STALE_AFTER_INTERVALS * frame["interval_s"]
        return records(frame)

    @app.get("/v1/teams", tags=["usage"])
    def teams() -> list[dict[str, Any]]:
        known = store.query("SELECT team, share, quota_gpus FROM teams")
        seen = pd.DataFrame({"team": store.teams()})
        return records(seen.merge(known, on="team", how="left"))

    @app.get("/v1/teams/{team}/usage", tags=["usage"])
    def usage(team: str, days: float = Days, end: datetime | None = End,
              bucket_minutes: int = Query(60, ge=1, le=1440)) -> dict[str, Any]:
        if team not in store.teams():
            raise HTTPException(status_code=404, detail=f"unknown team {team!r}; see /v1/teams")
        start, stop = window(days, end)
        totals = team_usage(store, start, stop, team)
        models = cost_by_team_and_model(store, start, stop, team)
        row = totals.iloc[0].to_dict() if not totals.empty else {
            "team": team, "allocated_gpu_hours": 0.0, "used_gpu_hours": 0.0, "jobs": 0, "efficiency": 0.0}
        row["cost_usd"] = float(models["cost_usd"].sum()) if not models.empty else 0.0
        return {"team": team, "window": {"start": start.isoformat(), "end": stop.isoformat()},
                "totals": json_safe(row), "by_model": records(models),
                "series": records(team_usage_series(store, start, stop, team, bucket_minutes))}

    @app.get("/v1/cluster/utilization", tags=["usage"])
    def utilization(days: float = Query(1.0, gt=0, le=366), end: datetime | None = End,
                    bucket_minutes: int = Query(60, ge=1, le=1440)) -> list[dict[str, Any]]:
        start, stop = window(days, end)
        return records(cluster_utilization(store, start, stop, bucket_minutes))

    @app.get("/v1/costs", tags=["cost"])
    def costs(days: float = Days, end: datetime | None = End) -> dict[str, Any]:
        start, stop = window(days, end)
        frame = cost_by_team(store, start, stop)
        return {"window": {"start": start.isoformat(), "end": stop.isoformat()},
                "rates": records(store.query("SELECT * FROM rate_card ORDER BY gpu_model")),
                "teams": records(frame), "total_usd": float(frame["cost_usd"].sum()) if not frame.empty else 0.0}

    @app.get("/v1/waste", tags=["cost"])
    def waste(days: float = Days, end: datetime | None = End, limit: int = Query(50, ge=1, le=1000)) -> dict[str, Any]:
        start, stop = window(days, end)
        over = oversized_jobs(store, start, stop, config.oversized_mem_fraction)
        return {
            "window": {"start": start.isoformat(), "end": stop.isoformat()},
            "thresholds": {"idle_minutes": config.idle_minutes, "idle_util_pct": config.idle_util_pct,
                           "oversized_mem_fraction": config.oversized_mem_fraction},
            "by_team": records(waste_by_team(store, start, stop, config.idle_minutes, config.idle_util_pct,
                                             config.oversized_mem_fraction)),
            "idle_runs": records(idle_runs(store, start, stop, config.idle_minutes, config.idle_util_pct).head(limit)),
            "oversized_jobs": records(over.head(limit)),
        }

    @app.get("/v1/fairshare", tags=["fairness"])
    def fairshare(days: float = Query(14.0, gt=0, le=366), end: datetime | None = End) -> dict[str, Any]:
        start, stop = window(days, end)
        frame = fairshare_history(store, start, stop, config.half_life_days)
        return {"half_life_days": config.half_life_days, "history": records(frame)}

    @app.get("/v1/recommendations", tags=["recommendations"])
    def recommendations(days: float = Days, end: datetime | None = End,
                        kind: str | None = Query(None, pattern="^(quota|reclaim|resize)$"),
                        team: str | None = None) -> dict[str, Any]:
        start, stop = window(days, end)
        recs = [r.to_dict() for r in recommend(store, config, start, stop)
                if (kind is None or r.kind == kind) and (team is None or r.team == team)]
        return {"generated_at": utc_now().isoformat(),
                "window": {"start": start.isoformat(), "end": stop.isoformat()}, "recommendations": recs}

    return app
