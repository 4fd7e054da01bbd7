"""Per-model demand forecast (issue 25): the weekly busy + queued GPU-hours of a real DuckDB store, their trend and
the weeks to saturation checked against arithmetic done here, the basis when utilisation or the queue is unknown,
too short a history, and the whole path (CLI, API, its token)."""
from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from gpuledger.analytics.config import Config, TeamConfig
from gpuledger.analytics.forecast import (HOURS_PER_WEEK, MIN_WEEKS, STATUSES, WEEK, demand_forecast,
                                          model_forecast, t80)
from gpuledger.analytics.records import json_safe
from gpuledger.analytics.store import Store
from gpuledger.collector.errors import InputError
from gpuledger.collector.jobs.lifecycle import events_of, jobs_frame
from gpuledger.collector.simulator import ClusterSimulator
from gpuledger.dashboard.client import forecast_frames
from gpuledger.dashboard.escape import md
from gpuledger.deploy.api.models import ModelForecast
from tests.helpers import api_client, gpu_rows, table
from tests.procs import GPULEDGER, TOKEN

WEEKS = 5
# the history ends at the last whole hour: the dashboard asks for the forecast to now
END = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
START = END - WEEKS * WEEK
# busy GPU-hours per week: H100 grows, A100 is flat (slightly falling); L4 has no utilisation reading at all
H100_BUSY = [200, 330, 420, 560, 610]
A100_BUSY = [310, 300, 300, 290, 300]
L4_ALLOCATED = [50, 80, 110, 140, 170]
H100_IDLE_HELD = 50  # GPU-hours a week an H100 is held at 0% utilisation: allocated, never busy
QUEUED = {3: 40.0, 4: 10.0}  # week -> H100 GPU-hours waited (the week-4 job names no model: nlp's home is H100)


def _held(node: str, gpus: int, model: str, per_week: list[float], team: str, util: float | None,
          first_gpu: int = 0) -> list[dict]:
    """Hourly samples of `gpus` GPUs over the weeks: each week the GPUs are held (util `util`) for `per_week[w]`
    GPU-hours in all, filling GPU after GPU from the week's start, and free the rest of the week."""
    rows = []
    for week, hours in enumerate(per_week):
        start = START + week * WEEK
        for g in range(gpus):
            held = int(min(HOURS_PER_WEEK, max(0, hours - HOURS_PER_WEEK * g)))
            gpu = first_gpu + g
            if held:
                rows += gpu_rows(node, gpu, model, held * 60, step_s=3600, start=start, util=util,
                                 job=f"{node}-{week}-{g}", team=team)
            if held < HOURS_PER_WEEK:
                rows += gpu_rows(node, gpu, model, (HOURS_PER_WEEK - held) * 60, step_s=3600,
                                 start=start + timedelta(hours=held), util=0.0 if util is not None else None)
    return rows


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """Five whole weeks: 8 H100 (busy demand growing, one GPU also held idle, jobs waiting in weeks 3 and 4),
    4 A100 (flat) and 2 L4 (allocation growing, no utilisation reading)."""
    path = tmp_path_factory.mktemp("forecast") / "forecast.duckdb"
    config = Config(teams={"nlp": TeamConfig(share=1), "vision": TeamConfig(share=1), "infra": TeamConfig(share=1)})
    with Store(path) as store:
        store.upsert_teams(config.team_frame())
        rows = _held("h", 4, "H100", H100_BUSY, "nlp", 80.0)
        rows += _held("h", 1, "H100", [H100_IDLE_HELD] * WEEKS, "nlp", 0.0, first_gpu=4)
        rows += _held("h", 3, "H100", [0] * WEEKS, "nlp", 0.0, first_gpu=5)
        rows += _held("a", 4, "A100", A100_BUSY, "vision", 70.0)
        rows += _held("l", 2, "L4", L4_ALLOCATED, "infra", None)
        store.append_samples(table(rows))
        store.fold()
        week3, week4 = START + 3 * WEEK, START + 4 * WEEK
        records = [
            {"job_id": "q1", "team": "nlp", "gpu_model": "H100", "gpus": 2, "submit_ts": week3 + timedelta(hours=10),
             "start_ts": week3 + timedelta(hours=30), "end_ts": week3 + timedelta(hours=40), "state": "completed",
             "source": "test"},
            {"job_id": "q2", "team": "nlp", "gpu_model": None, "gpus": 1, "submit_ts": week4 + timedelta(hours=5),
             "start_ts": week4 + timedelta(hours=15), "end_ts": week4 + timedelta(hours=20), "state": "completed",
             "source": "test"}]
        frame = jobs_frame(records)
        store.record_jobs(frame, events_of(frame))
    yield path, config


def by_model(answer: dict) -> dict[str, dict]:
    return {m["gpu_model"]: m for m in answer["models"]}


def line(ys: list[float]) -> tuple[float, float, float]:
    """(slope, intercept, slope standard error) of the least-squares line through weeks 0.. of `ys`."""
    x = np.arange(len(ys), dtype=float)
    slope, intercept = np.polyfit(x, np.asarray(ys, dtype=float), 1)
    residual = np.asarray(ys) - (slope * x + intercept)
    return slope, intercept, float(np.sqrt((residual ** 2).sum() / (len(ys) - 2) / ((x - x.mean()) ** 2).sum()))


def test_a_growing_model_saturates_when_the_arithmetic_says_and_a_flat_one_does_not(grown):
    path, config = grown
    with Store(path) as store:
        answer = demand_forecast(store, END, weeks=WEEKS, idle_util_pct=config.waste.idle_util_pct)
    models = by_model(answer)
    assert set(models) == {"H100", "A100", "L4"} and answer["queue_known"]
    h100 = models["H100"]
    demand = [b + QUEUED.get(w, 0.0) for w, b in enumerate(H100_BUSY)]  # the GPU held idle is not busy
    weekly = [w["demand_gpu_hours"] for w in h100["weeks"]]
    assert weekly == pytest.approx(demand)
    assert [w["allocated_gpu_hours"] for w in h100["weeks"]] == pytest.approx([b + H100_IDLE_HELD for b in H100_BUSY])
    # the weeks before the first job record (q1, week 3) have an unknown queue: null, never 0 GPU-hours queued
    assert [w["queued_gpu_hours"] for w in h100["weeks"]][:3] == [None, None, None]
    assert [w["queued_gpu_hours"] for w in h100["weeks"]][3:] == pytest.approx([QUEUED[3], QUEUED[4]])
    assert h100["basis"] == "busy + queued" and h100["basis_reason"] is None
    assert h100["gpus"] == 8 and h100["capacity_gpu_hours_per_week"] == 8 * 168

    slope, intercept, stderr = line(demand)
    level = intercept + slope * (WEEKS - 1)
    assert h100["status"] == "forecast" and h100["growth_gpu_hours_per_week"] > 0
    assert h100["growth_gpu_hours_per_week"] == pytest.approx(slope)
    assert h100["growth_stderr"] == pytest.approx(stderr)
    assert h100["demand_now_gpu_hours_per_week"] == pytest.approx(level)
    assert h100["weeks_to_saturation"] == pytest.approx((8 * 168 - level) / slope)
    low, high = slope - t80(WEEKS - 2) * stderr, slope + t80(WEEKS - 2) * stderr
    assert h100["growth_80_low"] == pytest.approx(low) and h100["growth_80_high"] == pytest.approx(high)
    assert h100["weeks_to_saturation_80_low"] == pytest.approx((8 * 168 - level) / high)
    assert h100["weeks_to_saturation_80_low"] <= h100["weeks_to_saturation"]
    if low > 0:  # the slowest growth the range allows still saturates: the range is closed
        assert h100["weeks_to_saturation_80_high"] == pytest.approx((8 * 168 - level) / low)
        assert h100["weeks_to_saturation"] <= h100["weeks_to_saturation_80_high"]
    else:
        assert h100["weeks_to_saturation_80_high"] is None
    assert h100["saturates_around"] == END + h100["weeks_to_saturation"] * WEEK

    a100 = models["A100"]
    flat_slope = line(A100_BUSY)[0]
    assert flat_slope < 0 and a100["growth_gpu_hours_per_week"] == pytest.approx(flat_slope)
    assert a100["status"] == "not_saturating"
    assert a100["weeks_to_saturation"] is None and a100["saturates_around"] is None
    assert "not saturating at the current trend" in a100["reason"]
    assert a100["growth_80_low"] <= a100["growth_gpu_hours_per_week"] <= a100["growth_80_high"]


def test_a_model_without_utilisation_readings_is_forecast_on_allocation_and_says_so(grown):
    path, config = grown
    with Store(path) as store:
        l4 = by_model(demand_forecast(store, END, weeks=WEEKS))["L4"]
    assert l4["basis"] == "allocated + queued" and "no utilisation reading for L4" in l4["basis_reason"]
    assert [w["busy_gpu_hours"] for w in l4["weeks"]] == [None] * WEEKS  # unknown, never 0
    assert [w["demand_gpu_hours"] for w in l4["weeks"]] == pytest.approx(L4_ALLOCATED)
    assert l4["growth_gpu_hours_per_week"] == pytest.approx(30.0) and l4["status"] == "forecast"
    assert l4["weeks_to_saturation"] == pytest.approx((2 * 168 - 170) / 30)


def test_a_window_longer_than_the_history_fits_only_its_whole_weeks(grown):
    """Eight weeks asked, five held: the three before the history are shown without figures and not fitted; a
    window ending mid-week leaves its partly covered weeks out of the trend."""
    path, _ = grown
    with Store(path) as store:
        h100 = by_model(demand_forecast(store, END))["H100"]
        assert h100["whole_weeks"] == WEEKS and len(h100["weeks"]) == 8
        assert [w["demand_gpu_hours"] for w in h100["weeks"][:3]] == [None] * 3
        assert not any(w["fitted"] for w in h100["weeks"][:3])
        assert h100["growth_gpu_hours_per_week"] == pytest.approx(line(
            [b + QUEUED.get(w, 0.0) for w, b in enumerate(H100_BUSY)])[0])
        shifted = by_model(demand_forecast(store, END - timedelta(days=3, minutes=20), weeks=WEEKS))["H100"]
        assert shifted["whole_weeks"] == WEEKS - 1 and shifted["status"] == "forecast"
        assert not shifted["weeks"][0]["fitted"] and shifted["weeks"][0]["covered_hours"] < 168
        short = by_model(demand_forecast(store, START + 2 * WEEK, weeks=MIN_WEEKS))["H100"]
        assert short["status"] == "insufficient_data" and "2 whole week(s)" in short["reason"]
        assert short["growth_gpu_hours_per_week"] is None and short["weeks_to_saturation"] is None
        with pytest.raises(InputError, match="3 to 104 weeks"):
            demand_forecast(store, END, weeks=2)


@pytest.fixture(scope="module")
def demo_sized(tmp_path_factory):
    """Fourteen days of the simulated cluster to the last whole hour, as `gpuledger demo` keeps (at a coarser
    step), with its job records."""
    sim = ClusterSimulator(start=END - timedelta(days=14), end=END + timedelta(days=1), seed=5)
    path = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    with Store(path) as store:
        store.upsert_teams(sim.team_frame())
        store.set_team_quotas(sim.quota_frame())
        for batch in sim.history(END - timedelta(days=14), END, step_s=1800):
            store.append_samples(batch)
        store.fold()
        store.upsert_jobs(sim.jobs_frame(END))
    return path


def test_a_demo_sized_history_has_insufficient_data_with_the_reason(demo_sized):
    """Fourteen days hold two whole weeks: no trend, no weeks to saturation, and the reason says how many weeks
    there are."""
    with Store(demo_sized) as store:
        answer = demand_forecast(store, END)
    assert answer["models"] and answer["queue_known"]
    for model in answer["models"]:
        assert model["status"] == "insufficient_data", model["gpu_model"]
        assert "2 whole week(s)" in model["reason"] and f"at least {MIN_WEEKS}" in model["reason"]
        assert model["weeks_to_saturation"] is None and model["growth_gpu_hours_per_week"] is None
        assert sum(w["fitted"] for w in model["weeks"]) == 2


def test_the_capacity_command_prints_the_review_and_its_json(grown):
    path, _ = grown
    text = subprocess.run([GPULEDGER, "capacity", "--db", str(path), "--end", END.isoformat(), "--weeks", "5"],
                          capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    assert "H100" in text.stdout and "saturates in" in text.stdout and "not saturating" in text.stdout
    as_json = subprocess.run([GPULEDGER, "capacity", "--db", str(path), "--end", END.isoformat(), "--weeks", "5",
                              "--json"], capture_output=True, text=True, timeout=120)
    assert as_json.returncode == 0, as_json.stderr
    models = by_model(json.loads(as_json.stdout))
    assert models["H100"]["status"] == "forecast" and models["A100"]["status"] == "not_saturating"
    bad = subprocess.run([GPULEDGER, "capacity", "--db", str(path), "--weeks", "1"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "3 to 104 weeks" in bad.stderr


def test_the_forecast_route_answers_a_reader_and_refuses_without_a_token(grown):
    path, config = grown
    with Store(path) as store, api_client(store, config, token=TOKEN) as client:
        params = {"weeks": WEEKS, "end": END.isoformat()}
        assert client.get("/v1/capacity/forecast", params=params).status_code == 401
        answer = client.get("/v1/capacity/forecast", params=params, headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert {"start", "end", "weeks", "models", "notes", "queue_known"} <= set(body)
        h100 = by_model(body)["H100"]
        assert h100["status"] == "forecast" and h100["weeks_to_saturation"] > 0 and len(h100["weeks"]) == WEEKS
        assert {"week_start", "demand_gpu_hours", "busy_gpu_hours", "queued_gpu_hours"} <= set(h100["weeks"][0])
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert client.get("/v1/capacity/forecast", params={"weeks": 1}, headers=auth).status_code == 422
        assert client.get("/v1/capacity/forecast", params={"end": "0001-01-01"}, headers=auth).status_code == 422


def what_if_page(monkeypatch, path, config: Config):
    """The dashboard's What-if page (Streamlit's AppTest) against a real API server over the store at `path`;
    asserts it raised nothing and showed no error."""
    from gpuledger.deploy.server import ApiServer
    from tests.test_dashboard_live import app_on
    with Store(path) as store:
        server = ApiServer(store, config, port=0, open_reads=True)
        url = server.start()
        try:
            return app_on(monkeypatch, url, "What-if")
        finally:
            server.stop()


def test_the_what_if_page_shows_each_models_weeks_to_saturation(grown, monkeypatch):
    path, config = grown
    at = what_if_page(monkeypatch, path, config)
    assert "Capacity: weeks until each GPU model is full" in [s.value for s in at.subheader]
    table = next(d.value for d in at.dataframe if "weeks to saturation" in d.value.columns).set_index("GPU model")
    assert table.loc["H100", "status"] == "saturates" and table.loc["H100", "weeks to saturation"] > 0
    assert table.loc["A100", "status"] == "not saturating" and pd.isna(table.loc["A100", "weeks to saturation"])
    assert table.loc["L4", "demand counts"] == "allocated + queued"
    weekly = next(d.value for d in at.dataframe if "in the trend" in d.value.columns)
    assert len(weekly) == 3 * 8 and weekly["in the trend"].sum() == 3 * WEEKS  # the default 8 weeks, 5 held
    assert any("no utilisation reading for L4" in c.value for c in at.caption)


def test_the_what_if_page_shows_why_a_short_history_has_no_forecast(demo_sized, monkeypatch):
    at = what_if_page(monkeypatch, demo_sized, Config())
    table = next(d.value for d in at.dataframe if "weeks to saturation" in d.value.columns)
    assert set(table["status"]) == {"insufficient data"} and table["weeks to saturation"].isna().all()
    assert any(md("2 whole week(s)") in i.value for i in at.info)  # the reason, shown as text (escaped)


def test_the_dashboards_tables_keep_unknown_figures_missing():
    models, weeks = forecast_frames({"models": [{
        "gpu_model": "H100", "status": "not_saturating", "gpus": 8, "weeks_to_saturation": None,
        "saturates_around": None, "growth_gpu_hours_per_week": -3.0,
        "weeks": [{"week_start": "2026-11-02T00:00:00Z", "busy_gpu_hours": None, "demand_gpu_hours": 5.0,
                   "fitted": True}]}]})
    assert models["weeks_to_saturation"].isna().all() and models["growth_gpu_hours_per_week"].iloc[0] == -3.0
    assert models["saturates_around"].isna().all() and weeks["busy_gpu_hours"].isna().all()
    assert weeks["demand_gpu_hours"].iloc[0] == 5.0 and str(weeks["week_start"].dt.tz) == "UTC"


def test_a_model_already_over_capacity_is_saturated_and_every_status_is_a_valid_answer():
    """The trend's demand at or over capacity now is `saturated` (0 weeks); without job records the basis says the
    queue is unknown. Every status and basis passes the API's response model (a closed set served whole)."""
    def weeks_of(busy: list[float], queued: float = 0.0) -> pd.DataFrame:
        return pd.DataFrame([{"gpu_model": "X", "week": w, "covered_hours": 168.0, "allocated": b, "measured": b,
                              "busy": b, "queued": queued} for w, b in enumerate(busy)])
    start = END - 4 * WEEK
    full = model_forecast("X", 1.0, weeks_of([150, 160, 170, 180], queued=20.0), start, END, 4, True)
    assert full["status"] == "saturated" and full["weeks_to_saturation"] == 0.0
    assert full["demand_now_gpu_hours_per_week"] == pytest.approx(200.0) and "already saturated" in full["reason"]
    unknown_queue = model_forecast("X", 2.0, weeks_of([10, 20, 30, 40]), start, END, 4, False)
    assert unknown_queue["basis"] == "busy only" and "queued demand is unknown" in unknown_queue["basis_reason"]
    assert [w["queued_gpu_hours"] for w in unknown_queue["weeks"]] == [None] * 4
    # job records in weeks 2 and 3 only: the first two weeks' queue is unknown (null), not 0 GPU-hours queued
    partly = model_forecast("X", 2.0, weeks_of([10, 20, 30, 40]), start, END, 4, True, frozenset({2, 3}))
    assert [w["queued_gpu_hours"] for w in partly["weeks"]] == [None, None, 0.0, 0.0]
    answers = [full, unknown_queue,
               model_forecast("X", 2.0, weeks_of([40, 30, 20, 10]), start, END, 4, True),
               model_forecast("X", 2.0, weeks_of([40, 400]), start, END, 4, True)]
    assert {a["status"] for a in answers} == set(STATUSES)
    # too short for a trend, but what was seen is said: the last week asked more than the 336 GPU-hours there are
    assert "the last whole week's demand, 400 GPU-hours, was already at or over the capacity" in answers[3]["reason"]
    for answer in answers:
        ModelForecast.model_validate(json_safe(answer))
