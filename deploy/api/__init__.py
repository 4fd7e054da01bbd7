"""The HTTP API, one router per area: ops, ingest, usage, cost, fairness, recommendations, GPU health,
fragmentation and placement, and administration (tokens, audit log). Who may call what: deploy/api/access.py.

The server process owns the DuckDB file (DuckDB admits one writer), so the dashboard and any
other reader go through these endpoints rather than opening the file.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from typing import Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry

from gpuledger.analytics.config import Config
from gpuledger.analytics.records import json_safe, rounded
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import AuditLog
from gpuledger.analytics.store.ingest_writer import IngestWriter
from gpuledger.analytics.store.metrics import REGISTRY as STORE_METRICS
from gpuledger.collector.metrics import REGISTRY as COLLECTOR_METRICS
from gpuledger.collector.errors import GpuledgerError
from gpuledger.collector.metrics import exported
from gpuledger.deploy.api import (admin, allocation, budgets, cost, efficiency, fairness, gpu_health, inference,
                                  ingest, ledger, ops, placement, recommendations, topology, usage, whatif,
                                  workloads)
from gpuledger.deploy.api import capacity, catalogue, compaction, inventory, job_records, reports, slurm_reads, users
from gpuledger.analytics.store.deadline import INTERRUPTED
from gpuledger.deploy.api.read_limits import ReadLimits, answer_interrupted
from gpuledger.deploy.api.access import Gate, audit_writes, trusted_networks
from gpuledger.deploy.api.limits import RequestLimits
from gpuledger.deploy.api.query_check import known_query_only
from gpuledger.deploy.api.live_metrics import StoreGauges
from gpuledger.policies.recommender import RecommendationService

ASSETS = "/static/swagger-ui"


class RoundedJSON(JSONResponse):
    """Every JSON answer with its floats rounded where they leave the server (analytics/records.py `rounded`):
    amounts to the cent, quantities to six decimals, so a caller reads `2226.425`, not `2226.4250000001957`."""

    def render(self, content: object) -> bytes:
        return super().render(rounded(content))


def _version() -> str:
    try:
        return version("gpuledger")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "0+unknown"


def create_app(store: Store, config: Config, ingest_writer: IngestWriter | None = None,
               token: str | None = None, metrics: CollectorRegistry | None = None, open_reads: bool = False,
               trusted_proxies: Sequence[str] | None = None) -> FastAPI:
    """The API over `store`. `token`: the bootstrap admin token (never stored); other tokens live in the store.
    Agents may push when an ingest writer is given; reads need a token unless `open_reads`. `trusted_proxies`:
    CIDRs whose X-Forwarded-For the audit log believes (default $GPULEDGER_TRUSTED_PROXIES, else none)."""
    app = FastAPI(
        title="gpuledger",
        version=_version(),
        description="GPU usage, cost, waste and fairshare, and quota/placement recommendations for schedulers.",
        docs_url=None, redoc_url=None,  # served below from the Swagger UI files shipped with the package
        default_response_class=RoundedJSON,
        dependencies=[Depends(known_query_only)],  # a misspelt filter is refused, not ignored (query_check.py)
    )
    _offline_docs(app)
    app.state.store = store
    app.state.config = config
    app.state.ingest = ingest_writer
    app.state.gate = Gate(store, token, open_reads)
    app.state.trusted_proxies = trusted_networks(trusted_proxies)
    app.state.metrics = metrics or exported(COLLECTOR_METRICS, STORE_METRICS, StoreGauges(store, config))
    app.state.recommender = RecommendationService(store, config)
    app.state.audit = None if store.read_only else AuditLog(store)
    if ingest_writer is not None:  # a push's entry commits with its batches (analytics/store/ingest_writer.py)
        ingest_writer.audit = app.state.audit
    audit_writes(app, app.state.audit)
    app.add_middleware(ReadLimits)  # reads in flight bounded below the worker pool (deploy/api/read_limits.py)
    app.add_middleware(RequestLimits, open_reads=open_reads)  # outermost: bodies bounded before anything
    app.add_exception_handler(GpuledgerError, _answer_error)
    app.add_exception_handler(RequestValidationError, _answer_invalid)
    app.add_exception_handler(INTERRUPTED, answer_interrupted)  # a read stopped at its deadline: 503
    for area in (admin, ops, ingest, usage, cost, fairness, recommendations, gpu_health, placement, workloads,
                 efficiency, inference, ledger, allocation, budgets, whatif, topology, capacity, inventory,
                 job_records, slurm_reads, reports, compaction, catalogue, users):
        app.include_router(area.router)
    return app


async def _answer_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A request that fails validation answers 422 with what failed, its input echoed as JSON allows: a NaN or
    Infinity in a body (which Python's JSON reads) made the echo itself fail, answering 500."""
    return JSONResponse({"detail": json_safe(jsonable_encoder(exc.errors()))}, status_code=422)


async def _answer_error(request: Request, exc: Exception) -> JSONResponse:
    """Every error gpuledger raises on purpose answers with its class's status and its message (collector/errors.py),
    wherever in analytics or policies it was raised: never a bare 500 for a caller's mistake."""
    status = getattr(exc, "http_status", 500)
    retry = getattr(exc, "retry_after_s", None)
    return JSONResponse({"detail": str(exc)}, status_code=status,
                        headers={"Retry-After": str(retry)} if retry and status == 503 else None)


def _offline_docs(app: FastAPI) -> None:
    """/docs from the Swagger UI 5 assets the fastapi-offline package ships, so it works with no network
    (FastAPI's default loads them from a CDN; Swagger UI 4 cannot read the OpenAPI 3.1 FastAPI writes), and `/`
    leading there."""
    app.mount(ASSETS, StaticFiles(directory=str(files("fastapi_offline") / "static")), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title="gpuledger API",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon.png")

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/docs")


__all__ = ["create_app"]
