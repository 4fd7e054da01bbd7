"""Every member of every closed set is served through the API, and errors answer with their class's status.

In process through FastAPI's TestClient: the routes' models and handlers are the point, not the HTTP server.
Before these tests, `consolidate`, `colocate` and `separate` advice made `GET /v1/recommendations` answer 500
(the response model allowed only quota, reclaim and resize), and an InputError raised inside analytics (the idle
threshold check under /v1/waste) answered a bare 500.
"""
from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from gpuledger.analytics.config import Config, WasteConfig
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import ConflictError, GpuledgerError, InputError, NotFoundError, UnavailableError
from gpuledger.dashboard.client import frame
from gpuledger.deploy.api import create_app
from gpuledger.policies.recommendation import DECISIONS, KINDS, PROPOSED, STORED_STATUSES, Recommendation
from gpuledger.policies.recommender import DecisionError, Evaluation, UnknownRecommendation


def _one_of_each(now) -> list[Recommendation]:
    return [Recommendation(kind=kind, team="nlp", action={"what": kind}, evidence={"measured": 1.0},
                           reason=f"a {kind} case", gpu_model="H100", job_id=None if kind == "quota" else f"job-{kind}",
                           status=PROPOSED, created=now) for kind in KINDS]


@pytest.fixture
def client(file_store):
    store = file_store
    app = create_app(store, Config(), open_reads=True)
    with TestClient(app) as c:
        yield c, app, store


def test_every_kind_of_advice_is_served(client):
    c, app, store = client
    now = utc_now()
    recs = _one_of_each(now)
    store.add_recommendations(pd.DataFrame([r.to_row() for r in recs]))
    app.state.recommender.current = lambda: (Evaluation(now, now - timedelta(days=14)), recs)
    answer = c.get("/v1/recommendations")
    assert answer.status_code == 200, answer.text
    assert sorted(r["kind"] for r in answer.json()["recommendations"]) == sorted(KINDS)
    for kind in KINDS:  # the kind filter accepts each one, and only those
        only = c.get("/v1/recommendations", params={"kind": kind})
        assert only.status_code == 200 and [r["kind"] for r in only.json()["recommendations"]] == [kind]
    assert c.get("/v1/recommendations", params={"kind": "nosuch"}).status_code == 422
    history = c.get("/v1/recommendations/history")
    assert history.status_code == 200 and sorted(r["kind"] for r in history.json()) == sorted(KINDS)
    for status in STORED_STATUSES:
        assert c.get("/v1/recommendations/history", params={"status": status}).status_code == 200


def test_the_openapi_spec_lists_each_closed_set_once(client):
    c, _, _ = client
    schemas = c.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["Recommendation"]["properties"]["kind"]["enum"] == list(KINDS)
    assert set(schemas["Decision"]["properties"]["decision"]["enum"]) == set(DECISIONS)


def test_an_input_error_inside_analytics_answers_422(client):
    c, app, store = client
    app.state.config = Config(waste=WasteConfig(idle_util_pct=store.idle_util_pct + 7))  # rollups built for another one
    answer = c.get("/v1/waste")
    assert answer.status_code == 422
    assert "rollups count idle under" in answer.json()["detail"]


@pytest.mark.parametrize("error, status", [
    (InputError("bad"), 422), (NotFoundError("none"), 404), (ConflictError("late"), 409),
    (UnavailableError("busy"), 503), (DecisionError("decided"), 409), (UnknownRecommendation("gone"), 404),
    (GpuledgerError("set-up"), 500)])
def test_each_error_class_carries_its_status(file_store, error, status):
    store = file_store
    app = create_app(store, Config(), open_reads=True)

    @app.get("/boom")
    def boom() -> None:
        raise error

    with TestClient(app, raise_server_exceptions=False) as c:
        answer = c.get("/boom")
    assert answer.status_code == status and answer.json() == {"detail": str(error)}
    assert (answer.headers.get("Retry-After") is not None) == (status == 503)


def test_dashboard_parses_instants_with_and_without_fractions():
    """The API writes a bucket's start without fractional seconds and a sample's time with them; the dashboard
    crashed on the first row of the other shape."""
    rows = [{"t": "2026-12-04T18:16:00Z"}, {"t": "2026-12-04T14:05:59.765540Z"}, {"t": "2026-12-04T14:05:59+00:00"}]
    parsed = frame(rows, ("t",))["t"]
    assert parsed.dt.tz is not None
    assert parsed.iloc[1] == pd.Timestamp("2026-12-04 14:05:59.765540", tz="UTC")
