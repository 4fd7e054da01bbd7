"""The HTTP API, one router per area: ops, ingest, usage, cost, fairness, recommendations.

The server process owns the DuckDB file (DuckDB admits one writer), so the dashboard and any
other reader go through these endpoints rather than opening the file.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.ingest_writer import IngestWriter
from gpuledger.analytics.store.metrics import REGISTRY as STORE_METRICS
from gpuledger.collector.metrics import REGISTRY as COLLECTOR_METRICS
from gpuledger.collector.metrics import exported
from gpuledger.deploy.api import cost, fairness, ingest, ops, recommendations, usage
from gpuledger.policies.recommender import RecommendationService


def _version() -> str:
    try:
        return version("gpuledger")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "0+unknown"


def create_app(store: Store, config: Config, ingest_writer: IngestWriter | None = None,
               token: str | None = None, metrics: CollectorRegistry | None = None) -> FastAPI:
    """The API over `store`; agents may push only when both an ingest writer and a token are given."""
    app = FastAPI(
        title="gpuledger",
        version=_version(),
        description="GPU usage, cost, waste and fairshare, and quota/placement recommendations for schedulers.",
    )
    app.state.store = store
    app.state.config = config
    app.state.ingest = ingest_writer
    app.state.token = token
    app.state.metrics = metrics or exported(COLLECTOR_METRICS, STORE_METRICS)
    app.state.recommender = RecommendationService(store, config)
    for area in (ops, ingest, usage, cost, fairness, recommendations):
        app.include_router(area.router)
    return app


__all__ = ["create_app"]
