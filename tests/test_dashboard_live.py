"""The dashboard over a demo-like store after live data has arrived (issue 20): the history folded, then live
samples at wall-clock instants with fractional seconds, and one piece of advice of every kind. Every page must
render without an exception (Streamlit shows one inside the page, `data-testid="stException"`, which the console
does not see), and the charts must show what the API answered."""
from __future__ import annotations

import io
import json
import os
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

import gpuledger.deploy.demo as demo
from gpuledger.analytics import fragmentation
from gpuledger.analytics.config import Config
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.simulator import SimulatorSource
from gpuledger.dashboard import charts
from gpuledger.deploy.dashboard_proc import APP, start_dashboard
from gpuledger.deploy.server import ApiServer
from gpuledger.policies.recommendation import KINDS, PROPOSED, Recommendation
from tests.browser import CHROMIUM, CHROMIUM_FLAGS, needs_chromium
from tests.procs import free_port
from tests.test_dashboard import PAGES

LIVE_MINUTES = 12


def advice_of_every_kind(now) -> list[Recommendation]:
    """One piece of advice of each kind, shaped as policies/ makes them, worth the most so each is shown first."""
    shapes = {
        "quota": ({"guarantee_gpus": 4.0, "limit_gpus": 10.0, "current_guarantee_gpus": None},
                  {"p95_busy_gpus": 5.2, "queued_gpus": 0.0, "effect_usd_per_week": 9000.0}),
        "reclaim": ({"reclaim_gpus": ["GPU-a", "GPU-b"], "node": "dgx-h100-01", "gpus": 2},
                    {"idle_minutes": 95.0, "idle_gpu_hours": 3.1, "effect_usd_per_week": 8000.0,
                     "idle_since": "2026-12-04 10:00:00+00:00"}),
        "resize": ({"move_to": "1g.10gb", "target_kind": "mig", "from": "A100-80GB", "gpus": 1, "per_gpu": True,
                    "target_gpu_fraction": 0.125, "gpus_freed": 0.875},
                   {"peak_mem_mib": 6000.0, "mem_total_mib": 81920.0, "effect_usd_per_week": 7000.0}),
        "consolidate": ({"node": "dgx-h100-02", "frees_gpus": 8,
                         "move": [{"job_id": "nlp/job-1", "gpus": 2, "to_node": "dgx-h100-01"}]},
                        {"waiting_job": "nlp/big", "gpus_needed": 8, "waited_minutes": 42.0,
                         "job_teams": {"nlp/big": "nlp"}, "effect_usd_per_week": 6000.0}),
        "colocate": ({"node": "dgx-h100-01", "gpus": 4, "island": 0},
                     {"gpus_per_node": {"dgx-h100-01": 2, "dgx-h100-02": 2}, "cross_node_gbytes_s_per_gpu": 20.0,
                      "time_share_saved": 0.18, "target_basis": "measured", "effect_usd_per_week": 5000.0}),
        "separate": ({"from_gpu": "GPU-c", "node": "l4-01", "to_node": None},
                     {"shares_gpu_with": ["vision/job-9"], "share_held": 0.5, "latency_sensitive": ["inference/"],
                      "effect_usd_per_week": 4000.0}),
        "efficiency": ({"bottleneck": "input_pipeline_bound", "do": "add data-loader workers", "gpus": 8},
                       {"mean_util_pct": 97.0, "sm_active": 0.08, "profiling_coverage": 1.0, "signal": "sm_active",
                        "effect_usd_per_week": 3000.0}),
    }
    assert set(shapes) == set(KINDS)  # a new kind of advice gets a case here
    return [Recommendation(kind=kind, team="nlp", action=action, evidence=evidence, reason=f"a {kind} case",
                           gpu_model="H100", job_id=None if kind == "quota" else f"nlp/{kind}-job",
                           status=PROPOSED, created=now) for kind, (action, evidence) in shapes.items()]


def build_live_store(path: Path, days: float = 2.0):
    """The demo's store (deploy/demo.py) with its history ending LIVE_MINUTES ago, folded; then the live
    collection since, as the demo's SimulatorSource reads it: a sample every 15 s at wall-clock instants with
    fractional seconds, folded as the server does, the job table and a fragmentation reading after it."""
    history_end = utc_now() - timedelta(minutes=LIVE_MINUTES)
    real_now = demo.utc_now
    demo.utc_now = lambda: history_end
    try:
        store, sim = demo.build_demo_store(path, Config(), days, 7, 300.0, echo=lambda _: None)
    finally:
        demo.utc_now = real_now
    instants = iter([history_end + timedelta(seconds=15 * k + 0.123457 * (k % 7) + 0.5)
                     for k in range(LIVE_MINUTES * 4 - 1)])
    source = SimulatorSource(sim, interval_s=15.0, clock=lambda: next(instants))
    for _ in range(LIVE_MINUTES * 4 - 1):
        store.append_samples(source.collect())
    store.fold()
    store.upsert_jobs(sim.jobs_frame(utc_now()))
    fragmentation.record(store, utc_now())
    return store


@pytest.fixture(scope="module")
def live_api(tmp_path_factory):
    import requests
    store = build_live_store(tmp_path_factory.mktemp("live") / "demo.duckdb")
    server = ApiServer(store, Config(), port=0, open_reads=True)
    url = server.start()
    try:
        requests.get(f"{url}/v1/recommendations", timeout=60).raise_for_status()  # the server's own advice first
        store.add_recommendations(pd.DataFrame([r.to_row() for r in advice_of_every_kind(utc_now())]))
        kinds = {r["kind"] for r in requests.get(f"{url}/v1/recommendations", timeout=60).json()["recommendations"]}
        assert set(KINDS) <= kinds
        yield url
    finally:
        server.stop()
        store.close()


def test_the_live_store_mixes_instants_with_and_without_fractions(live_api):
    """The case the old client broke on: one column holding `...:00Z` and `...:59.5Z`."""
    import requests
    jobs = requests.get(f"{live_api}/v1/jobs", params={"days": 7, "limit": 1000}, timeout=60).json()
    shapes = {"." in j["last_ts"] for j in jobs}
    assert shapes == {True, False}


def app_on(monkeypatch, url: str, page: str) -> AppTest:
    monkeypatch.setenv("GPULEDGER_API", url)
    st.cache_data.clear()
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    at.session_state["page"] = page
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def vega_charts(at: AppTest) -> list[tuple[dict, pd.DataFrame]]:
    """Every vega-lite chart on the page: its spec and the data the page passed it."""
    out = []
    for chart in at.get("vega_lite_chart"):
        proto = chart.proto
        raw = proto.data.data if proto.HasField("data") else b""
        data = pa.ipc.open_stream(io.BytesIO(raw)).read_pandas() if raw else pd.DataFrame()
        out.append((json.loads(proto.spec), data))
    return out


def test_heatmap_cells_span_their_own_bucket(monkeypatch, live_api):
    at = app_on(monkeypatch, live_api, "Nodes")
    spec, cells = next((s, d) for s, d in vega_charts(at) if s.get("mark", {}).get("type") == "rect")
    assert spec["encoding"]["x2"]["field"] == "bucket_end"
    start = pd.to_datetime(cells["bucket"], utc=True, format="ISO8601")
    width = pd.to_datetime(cells["bucket_end"], utc=True, format="ISO8601") - start
    assert set(width) == {pd.Timedelta(minutes=60)}  # /v1/gpus is called with 60-minute buckets here
    per_gpu = cells.groupby("gpu").agg(buckets=("bucket", "nunique"), cells=("bucket", "size"),
                                       values=("util_pct", "nunique"))
    assert (per_gpu["buckets"] == per_gpu["cells"]).all() and (per_gpu["buckets"] > 24).all()  # a cell per hour
    assert (per_gpu["values"] > 1).mean() > 0.5  # most GPUs change colour over the window, not one flat colour


def test_overview_labels_the_partial_days(monkeypatch, live_api):
    at = app_on(monkeypatch, live_api, "Overview")
    spec, bars = next((s, d) for s, d in vega_charts(at) if "label" in d)
    days = bars.drop_duplicates("label").sort_values("day")
    # today is not over: partial; the days between are whole. The history starts two days before the live minutes,
    # on a whole hour: mid-day, except when the test runs in the first hour or so after midnight UTC, when its first
    # day is whole (this test failed then, as a time-of-day flake): partial exactly when under 24 hours, below
    assert days["partial"].iloc[-1] and not days["partial"].iloc[1:-1].any()
    assert days["partial"].iloc[0] == (days["hours"].iloc[0] < 24)
    assert days.loc[days["partial"], "label"].str.endswith("(partial)").all()
    assert (days.loc[days["partial"], "hours"] < 24).all() and (days.loc[~days["partial"], "hours"] == 24).all()
    assert any("not a whole day" in c.value for c in at.caption)
    assert spec["encoding"]["color"]["scale"]["range"][:1] == [charts.PALETTE[0]]


def test_one_colour_per_team_on_every_page(monkeypatch, live_api):
    colours = {}
    overview = app_on(monkeypatch, live_api, "Overview")
    spec, _ = next((s, d) for s, d in vega_charts(overview) if "label" in d)
    scale = spec["encoding"]["color"]["scale"]
    colours["overview"] = dict(zip(scale["domain"], scale["range"]))
    cost = app_on(monkeypatch, live_api, "Cost & waste")
    scale = next(s for s, _ in vega_charts(cost))["encoding"]["color"]["scale"]
    colours["cost"] = dict(zip(scale["domain"], scale["range"]))
    fair = app_on(monkeypatch, live_api, "Fairshare")
    scale = next(s for s, _ in vega_charts(fair))["layer"][0]["encoding"]["color"]["scale"]
    colours["fairshare"] = dict(zip(scale["domain"], scale["range"]))
    assert colours["overview"] == {t: colours["cost"][t] for t in colours["overview"]}
    assert colours["fairshare"] == {t: colours["cost"][t] for t in colours["fairshare"]}
    assert colours["cost"]["idle capacity"] == charts.SHARED_COLOURS["idle capacity"]
    teams = sorted(t for t in colours["cost"] if t not in charts.SHARED_COLOURS)
    assert [colours["cost"][t] for t in teams] == list(charts.PALETTE[:len(teams)])


def test_daily_bars_count_the_hours_of_the_window_and_of_the_data():
    start, end = pd.Timestamp("2026-12-01T06:30:00Z"), pd.Timestamp("2026-12-04T12:00:00Z")
    days = [pd.Timestamp(f"2026-12-0{d}T00:00:00Z") for d in (1, 2, 3, 4)]
    daily = pd.DataFrame({"day": days, "team": "nlp", "cost_usd": [1.0, 2.0, 3.0, 4.0]})
    covered = pd.Series(pd.date_range("2026-12-01T10:00:00Z", end, freq="60min", inclusive="left"))  # data from 10:00
    bars = charts.daily_bars(daily, start, end, covered, 60)
    assert bars["hours"].tolist() == [14.0, 24.0, 24.0, 12.0]
    assert bars["label"].tolist() == ["Dec 01 · 10:00–24:00 · (partial)", "Wed Dec 02", "Thu Dec 03",
                                      "Dec 04 · 00:00–12:00 · (partial)"]
    assert charts.daily_bars(daily, start, end)["hours"].tolist() == [17.5, 24.0, 24.0, 12.0]  # the window alone


def test_per_model_chart_leaves_gaps_and_zeros_only_where_reported():
    start = pd.Timestamp("2026-12-01T00:00:00Z")
    end = start + pd.Timedelta(hours=6)
    buckets = [start + pd.Timedelta(hours=h) for h in range(6)]
    covered = pd.Series([buckets[0], buckets[1], buckets[2], buckets[4], buckets[5]])  # hour 3: no data at all
    per_model = pd.DataFrame({"bucket": [buckets[0], buckets[4]], "allocated_gpus": [2.0, 3.0]})  # 1, 2, 5: none
    line = charts.model_gaps(per_model, covered, start, end, 60)
    assert line["allocated_gpus"].tolist()[:3] == [2.0, 0.0, 0.0] and pd.isna(line["allocated_gpus"][3])
    assert line["allocated_gpus"].tolist()[4:] == [3.0, 0.0]
    assert line["segment"].iloc[0] == line["segment"].iloc[2] != line["segment"].iloc[4]  # no line over the gap
    spec = charts.model_spec("H100", {"guarantee": 4.0})
    assert spec["layer"][0]["encoding"]["detail"]["field"] == "segment"


def test_teams_page_per_model_chart(monkeypatch, live_api):
    at = app_on(monkeypatch, live_api, "Teams")
    next(b for b in at.selectbox if b.label == "Team").set_value("nlp").run()
    models = next(b for b in at.selectbox if b.label == "GPU model")
    for model in models.options:
        models.set_value(model).run()
        assert not at.exception, [e.message for e in at.exception]
    charts_on_page = [d for s, d in vega_charts(at) if "segment" in d]
    assert charts_on_page and charts_on_page[0]["allocated_gpus"].notna().any()


def test_every_kind_of_advice_reads_in_words(monkeypatch, live_api):
    at = app_on(monkeypatch, live_api, "Recommendations")
    labels = [e.label for e in at.expander]
    for kind in KINDS:
        assert any(label == f"{kind}: a {kind} case" for label in labels), kind
    table = next(d.value for d in at.dataframe if "change" in d.value.columns)
    mine = table[table["reason"].str.startswith("a ")].set_index("kind")
    assert mine.loc["consolidate", "change"].startswith("move 1 job(s) off dgx-h100-02")
    assert mine.loc["colocate", "change"] == "run all 4 GPUs on dgx-h100-01, inside NVLink island 0"
    assert mine.loc["separate", "change"].endswith("no free GPU now")
    assert mine.loc["quota", "job"] == charts.BLANK  # no None cell
    # the consolidation and the co-location both want dgx-h100-01's free GPUs (with the server's own advice
    # there): one group, ranked by dollars, so the consolidation ($6,000/week) before the co-location ($5,000)
    placed = {kind: mine.loc[kind, "alternatives"].replace(",", "").split(" ") for kind in ("colocate", "consolidate")}
    assert placed["colocate"][4] == placed["consolidate"][4] and placed["colocate"][4].startswith("alt-")
    assert int(placed["consolidate"][0]) < int(placed["colocate"][0])
    assert mine.loc["quota", "alternatives"] == charts.BLANK
    savings = next(m for m in at.metric if m.label == "Potential savings")
    assert savings.value.startswith("$") and savings.value.endswith("per week")
    evidence = " ".join(c.value for c in at.caption if c.value.startswith("Evidence"))
    assert "dgx\\-h100\\-01\\: 2" in evidence  # a mapping in words, Markdown-escaped


def test_tables_have_readable_labels_and_no_none(monkeypatch, live_api):
    for page in ("Jobs", "Workloads", "Inference", "Cost & waste", "Nodes", "Recommendations"):
        at = app_on(monkeypatch, live_api, page)
        assert at.dataframe and all(not t.value.empty for t in at.dataframe[:1]), page  # something to check
        for table in at.dataframe:
            frame = table.value
            text = frame.select_dtypes("object")
            assert not text.isna().any().any(), (page, list(frame.columns))
            config = json.loads(table.proto.columns) if table.proto.columns else {}
            for column in frame.columns:
                if "_" in str(column):
                    assert config.get(column, {}).get("label"), (page, column)
            floats = frame.select_dtypes("float")
            assert (floats.round(3).fillna(0) == floats.fillna(0)).all().all(), page


def test_the_busy_header_is_the_threshold_count_the_advice_uses(monkeypatch, live_api):
    """'Busy' in the header is what /metrics and the quota advice count (GPUs at or over the idle threshold), from
    the API's busy_gpus; the utilisation-weighted share is its own figure, labelled as such."""
    import requests
    at = app_on(monkeypatch, live_api, "Overview")
    metrics = {m.label: m for m in at.metric}
    end = pd.Timestamp.now(tz="UTC").floor("min").isoformat()
    series = pd.DataFrame(requests.get(f"{live_api}/v1/cluster/utilization", timeout=60,
                                       params={"days": 7, "bucket_minutes": 60, "end": end}).json())
    busy = series["busy_gpus"].dropna().mean() / series["total_gpus"].mean()
    used = series["used_gpus"].dropna().mean() / series["total_gpus"].mean()
    assert abs(busy - used) > 0.01  # the two figures differ on this store, so the check below can tell them apart
    assert metrics["GPUs busy"].value == f"{busy:.0%}" and "idle threshold" in metrics["GPUs busy"].help
    assert metrics["Utilisation-weighted"].value == f"{used:.0%}"
    assert "not the busy count" in metrics["Utilisation-weighted"].help


def test_every_table_shows_the_blank_mark_for_missing_numbers(monkeypatch, live_api):
    """A missing number (no utilisation reading, no rate) is the blank mark the table's help explains, not
    Streamlit's grey 'None'."""
    for page in ("Jobs", "Workloads", "Inference", "Cost & waste", "Nodes", "Recommendations", "GPU health",
                 "Fairshare"):
        at = app_on(monkeypatch, live_api, page)
        assert at.dataframe, page
        assert all(table.proto.placeholder == charts.BLANK for table in at.dataframe), page


@needs_chromium
def test_every_page_renders_without_an_exception_in_chromium(live_api, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("GPULEDGER_SHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    proc, url = start_dashboard(live_api, port=free_port())
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            errors: list[str] = []
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.goto(url)
            page.get_by_text("Cluster utilization over time").wait_for(timeout=60_000)
            every_page = {"Overview": "Cost per day by team", "Teams": "Cost by GPU model", "Jobs": "Search job id",
                          "Workloads": "Waiting now", "Inference": "Services against their SLOs",
                          "Cost & waste": "Budgets and alerts",
                          "Fairshare": "Fairshare factor per team",
                          "Recommendations": "Decision history", "What-if": "Utilisation, proposal",
                          "GPU health": "GPU health events",
                          "Nodes": "Agents pushing to this server"}
            assert list(every_page) == PAGES
            failed = {}
            for tab, text in every_page.items():
                page.get_by_role("tab", name=tab).click()
                # the page's last text, or the exception that stopped it short of it
                page.get_by_text(text).or_(page.get_by_test_id("stException")).first.wait_for(
                    state="visible", timeout=30_000)
                page.get_by_test_id("stStatusWidget").wait_for(state="hidden", timeout=30_000)  # the run is over
                shown = page.locator('[data-testid="stException"]:visible')  # this page's, not a hidden tab's
                # a table React cannot draw shows its error as page text, not as Streamlit's exception element
                broken = page.get_by_text("Minified React error")
                if shown.count() or page.get_by_text("Traceback").count() or broken.count():
                    failed[tab] = (shown.first.inner_text()[:500] if shown.count() else
                                   broken.first.inner_text()[:500] if broken.count() else "Traceback")
                page.screenshot(path=str(shots / f"{tab.split()[0].lower()}.png"), full_page=True)
            browser.close()
        assert not failed, failed
        assert not errors, errors
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_every_instant_the_dashboard_parses_is_read_as_iso_8601():
    """The API's instants come with and without fractional seconds: no parse in the dashboard infers one format."""
    import re

    from gpuledger.dashboard import client
    sources = {p.name: p.read_text() for p in Path(client.__file__).parent.glob("*.py")}
    calls = [(name, m.group(0)) for name, text in sources.items()
             for m in re.finditer(r"to_datetime\([^)]*\)", text)]
    assert calls and all('format="ISO8601"' in call for _, call in calls), calls
    mixed = [{"t": "2026-12-04T18:16:00Z"}, {"t": "2026-12-04T14:05:59.765540Z"}]
    assert client.frame(mixed, ("t",))["t"].iloc[1] == pd.Timestamp("2026-12-04 14:05:59.765540", tz="UTC")
