"""The dashboard against the real API: Streamlit's AppTest, then the real page in headless Chromium."""
from __future__ import annotations

from contextlib import contextmanager
import socket
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.collector.dcgm_source import DcgmPageConverter
from gpuledger.dashboard.charts import BLANK
from gpuledger.dashboard.escape import md
from gpuledger.deploy.dashboard_proc import APP, start_dashboard
from gpuledger.deploy.server import ApiServer
from tests.helpers import gpu_rows
from tests.helpers import table as sample_table
from tests.browser import CHROMIUM, CHROMIUM_FLAGS, needs_chromium
from tests.procs import free_port, wait_until
from tests.test_dcgm_pages import SHARED_PAGES



def app_against(monkeypatch, url: str) -> AppTest:
    monkeypatch.setenv("GPULEDGER_API", url)
    st.cache_data.clear()  # each test sees the API as it is now, not a previous test's cached answers
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    return at


PAGES = ["Overview", "Teams", "Jobs", "Workloads", "Inference", "Cost & waste", "Fairshare", "Recommendations",
         "What-if", "GPU health", "Nodes"]


def show(at: AppTest, page: str) -> AppTest:
    """Open a page: pages are lazy tabs, only the one shown runs."""
    at.session_state["page"] = page
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    return at


def test_app_shows_cost_utilization_fairshare_and_recommendations(monkeypatch, api_url):
    at = app_against(monkeypatch, api_url)
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "gpuledger" in at.title[0].value
    metrics = {m.label: m.value for m in at.metric}
    assert set(metrics) == {"Cost of GPUs present", "Idle capacity (no job) cost", "GPUs allocated", "GPUs busy",
                            "Utilisation-weighted"}  # the header
    assert metrics["Cost of GPUs present"].startswith("$") and float(metrics["Cost of GPUs present"][1:].replace(",", "")) > 0
    assert [t.label for t in at.tabs] == PAGES
    assert "Cluster utilization over time" in [s.value for s in at.subheader]
    assert "Cost per team" not in [s.value for s in at.subheader]  # another page: not run, not fetched
    show(at, "Cost & waste")
    subheaders = [s.value for s in at.subheader]
    assert {"Cost per team", "Waste per team"} <= set(subheaders)
    cost_table = next(d.value for d in at.dataframe if {"team", "cost_usd"} <= set(d.value.columns)
                      and "idle capacity" in set(d.value["team"]))
    assert "nlp" in set(cost_table["team"])
    show(at, "Recommendations")
    assert {"Recommendations", "Decision history"} <= {s.value for s in at.subheader}
    assert any(exp.label.startswith(("quota:", "reclaim:", "resize:")) for exp in at.expander)
    show(at, "Nodes")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Stranded capacity cost"].startswith("$") and "of" in metrics["Fragmented GPUs"]


def test_overview_teams_and_jobs_pages(monkeypatch, api_url):
    at = app_against(monkeypatch, api_url)
    assert not at.exception
    assert "Cost per day by team" in [s.value for s in at.subheader]
    deltas = {m.label: m.delta for m in at.metric}
    assert deltas["Cost of GPUs present"] is not None  # against the previous period (the simulated store has 3 days)
    show(at, "Jobs")
    jobs = next(d.value for d in at.dataframe if "job_id" in d.value.columns and "idle_share" in d.value.columns)
    assert len(jobs) > 0 and jobs["waste"].dtype == bool and (jobs["cost_usd"].diff().dropna() <= 1e-9).all()
    users = next(d.value for d in at.dataframe if "user" in d.value.columns and "flagged_jobs" in d.value.columns)
    # the same jobs by user (a window ending now: its start moves between the two reads, so not to the cent)
    assert len(users) > 0 and users["cost_usd"].sum() == pytest.approx(jobs["cost_usd"].sum(), rel=1e-3)
    at.text_input[0].set_value("no-such-job").run()
    assert not at.exception and any("No job matches" in i.value for i in at.info)
    show(at, "Teams")
    next(b for b in at.selectbox if b.label == "Team").set_value("nlp").run()  # the team drill-down
    assert not at.exception
    assert {"Cost", "GPU-hours allocated", "Efficiency", "Jobs"} <= {m.label for m in at.metric}
    team_jobs = next(d.value for d in at.dataframe if "job_id" in d.value.columns)
    assert set(team_jobs["team"]) == {"nlp"}


def page_figures(at: AppTest) -> list:
    """What a page shows below the header: its dataframes' sizes and numeric totals, its own metrics, captions."""
    figures = [m.value for m in at.metric[4:]] + [c.value for c in at.caption]
    for table in at.dataframe:
        numbers = table.value.select_dtypes("number")
        figures.append((len(table.value), round(float(numbers.to_numpy().sum()), 3) if not numbers.empty else 0))
    return figures


@pytest.mark.parametrize("page", ["Overview", "Teams", "Jobs", "Workloads", "Cost & waste", "Fairshare", "What-if",
                                  "GPU health", "Nodes"])
def test_the_window_slider_changes_every_view(monkeypatch, api_url, page):
    """Every page follows the sidebar's window (Recommendations come from the policy window on purpose)."""
    at = show(app_against(monkeypatch, api_url), page)
    week = page_figures(at)
    at.sidebar.slider[0].set_value(1).run()
    assert not at.exception and not at.error
    assert page_figures(at) != week, page


def test_the_teams_page_compares_each_models_quota_with_usage(monkeypatch, api_url):
    at = show(app_against(monkeypatch, api_url), "Teams")
    next(b for b in at.selectbox if b.label == "Team").set_value("nlp").run()
    models = next(b for b in at.selectbox if b.label == "GPU model")
    assert "H100" in models.options
    models.set_value("H100").run()
    assert not at.exception and any("Quota vs usage per GPU model" in m.value for m in at.markdown)


def test_the_nodes_page_has_the_gpu_inventory_and_a_heatmap(monkeypatch, api_url):
    at = show(app_against(monkeypatch, api_url), "Nodes")
    assert "GPUs" in [s.value for s in at.subheader]
    inventory = next(d.value for d in at.dataframe if "gpu_uuid" in d.value.columns and "fraction" in d.value.columns)
    assert inventory["gpu_uuid"].nunique() == 48 and inventory["team"].map(type).eq(str).all()  # "free" when no job
    heatmap = [s for s in at.selectbox if "utilisation (%)" in s.options]
    assert heatmap, "the heatmap's metric choice"
    for metric in ("power_w", "temp_c"):
        heatmap[0].set_value(metric).run()
        assert not at.exception and not at.warning


def test_a_decision_button_records_a_decision(monkeypatch, sim_store):
    """With the server's token the Recommendations tab accepts advice through the API, as an admin would."""
    from gpuledger.policies.recommendation import stored
    from tests.conftest import SITE
    server = ApiServer(sim_store, SITE, port=0, token="t0k", open_reads=True)
    url = server.start()
    try:
        monkeypatch.setenv("GPULEDGER_TOKEN", "t0k")
        at = show(app_against(monkeypatch, url), "Recommendations")
        accept = [b for b in at.button if b.label == "Accept"]
        if not accept:
            pytest.skip("no proposed recommendation on the simulated cluster to decide")
        rec_id = accept[0].key.split("-", 1)[1]
        accept[0].click().run()
        assert not at.exception
        decided = {r.id: r for r in stored(sim_store)}
        assert decided[rec_id].status == "accepted" and decided[rec_id].decided_by == "dashboard"
    finally:
        server.stop()


WHATIF_FIGURES = ("wait p50 (min)", "wait p95 (min)", "completion p95 (h)", "GPU-hours", "preemptions",
                  "still waiting")


def whatif_editor(at: AppTest, name: str):
    """The What-if page's quota or capacity editor."""
    return next(e for e in at.data_editor if e.key and e.key.startswith(f"whatif-{name}-"))


def whatif_teams(at: AppTest):
    """The What-if page's per-team table, current -> proposed."""
    return next(d.value for d in at.dataframe if "wait p50 (min): current" in d.value.columns)


def edit(at: AppTest, editor, rows: dict[int, dict]) -> AppTest:
    """Edit cells of a keyed data editor, as a person would in the browser, and rerun the page."""
    at.session_state[editor.key] = {"edited_rows": rows, "added_rows": [], "deleted_rows": []}
    at.run()
    return at


def test_the_what_if_page_replays_the_window_under_both_configurations(monkeypatch, api_url):
    at = show(app_against(monkeypatch, api_url), "What-if")
    assert "What-if: the window's jobs replayed under other quotas" in [s.value for s in at.subheader]
    quotas, capacity = whatif_editor(at, "quotas"), whatif_editor(at, "capacity")
    assert {"nlp", "research"} <= set(quotas.value["team"]) and quotas.editing_mode == "fixed"
    assert dict(zip(capacity.value["gpu_model"], capacity.value["gpus"]))["H100"] == 16
    teams = whatif_teams(at)
    assert teams["team"].iloc[-1] == "all teams" and {"nlp", "recsys"} <= set(teams["team"])
    for figure in WHATIF_FIGURES:
        for side in ("current", "proposed"):
            column = teams[f"{figure}: {side}"]
            assert column.dtype.kind in "if" and column.notna().any(), (figure, side)
    nlp = teams.set_index("team").loc["nlp"]
    assert nlp["jobs"] > 0 and nlp["GPU-hours: current"] > 0 and nlp["wait p95 (min): current"] >= 0
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Utilisation, quotas in force"].endswith("%") and metrics["Utilisation, proposal"].endswith("%")
    assert any("What the replay assumed" in m.value for m in at.markdown)
    assert not any(c.value.startswith("Edited:") for c in at.caption)  # nothing edited: the seed is the answer


def test_a_what_if_capacity_edit_is_replayed(monkeypatch, api_url):
    at = show(app_against(monkeypatch, api_url), "What-if")
    capacity = whatif_editor(at, "capacity")
    h100 = list(capacity.value["gpu_model"]).index("H100")
    edit(at, capacity, {h100: {"gpus": 32}})
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any(c.value.startswith("Edited: 0 quota(s) and 1 GPU model(s)") for c in at.caption)
    assert any(f"{md('H100')} 16 → 32" in c.value for c in at.caption)
    assert len(whatif_teams(at)) > 1


def test_a_what_if_edit_the_api_refuses_shows_its_reason(monkeypatch, api_url):
    """A guarantee above its limit is a proposal no scheduler could run: the API answers 422 with the reason, the
    page shows it as an error, keeps the editors, and raises nothing."""
    at = show(app_against(monkeypatch, api_url), "What-if")
    quotas = whatif_editor(at, "quotas")
    nlp = list(quotas.value["team"]).index("nlp")
    edit(at, quotas, {nlp: {"proposed_guarantee_gpus": 1000.0}})
    assert not at.exception
    errors = [e.value for e in at.error]
    assert errors and "422" in errors[0] and "above its limit" in errors[0] and md("nlp's") in errors[0], errors
    assert whatif_editor(at, "quotas") and not [d for d in at.dataframe if "wait p50 (min): current" in d.value]


def test_what_if_figures_the_replay_could_not_give_stay_blank(monkeypatch, api_url):
    """A null figure (no job ended, no GPU present) is missing in the table and 'unknown' as a metric, never 0."""
    from gpuledger.dashboard import client
    real = client.post_json

    def answer_with_nulls(*args, **kwargs):
        answer = real(*args, **kwargs)
        answer["configurations"]["proposed"]["teams"]["nlp"]["completion_p95_hours"] = None
        answer["configurations"]["proposed"]["utilisation"] = None
        return answer

    monkeypatch.setattr(client, "post_json", answer_with_nulls)
    at = show(app_against(monkeypatch, api_url), "What-if")
    table = next(d for d in at.dataframe if "wait p50 (min): current" in d.value.columns)
    nlp = table.value.set_index("team").loc["nlp"]
    assert pd.isna(nlp["completion p95 (h): proposed"]) and nlp["completion p95 (h): current"] > 0
    assert table.proto.placeholder == BLANK
    metrics = {m.label: m for m in at.metric}
    assert metrics["Utilisation, proposal"].value == "unknown" and not metrics["Utilisation, proposal"].delta


def test_what_if_edits_carry_only_the_numbers_changed():
    from gpuledger.dashboard.client import capacity_changes, quota_edits
    seeded = [{"team": "nlp", "gpu_model": "H100", "proposed_guarantee_gpus": 4.0, "proposed_limit_gpus": 8.0},
              {"team": "cv", "gpu_model": "L4", "proposed_guarantee_gpus": None, "proposed_limit_gpus": 2.0},
              {"team": "cv", "gpu_model": "H100", "proposed_guarantee_gpus": 1.0, "proposed_limit_gpus": 4.0}]
    edited = pd.DataFrame(seeded)
    assert quota_edits(seeded, edited) == {}
    edited.loc[0, "proposed_limit_gpus"] = 12.0
    edited.loc[1, "proposed_guarantee_gpus"] = 1.0
    edited.loc[2, "proposed_guarantee_gpus"] = None  # emptied: no edit
    assert quota_edits(seeded, edited) == {"nlp": {"H100": {"limit": 12.0}}, "cv": {"L4": {"guarantee": 1.0}}}
    present = {"H100": 16, "A100": 8}
    table = pd.DataFrame({"gpu_model": ["H100", "A100"], "gpus": [16.0, 8.0]})
    assert capacity_changes(present, table) == {}
    more = pd.DataFrame({"gpu_model": ["H100", "H200", None], "gpus": [24.0, 16.0, 3.0]})
    assert capacity_changes(present, more) == {"H100": 24, "H200": 16, "A100": 0}  # a deleted row is retired


def test_post_json_answers_the_apis_reason(api_url):
    from gpuledger.dashboard.client import ApiUnavailable, post_json
    with pytest.raises(ApiUnavailable, match=r"\(422\): edits\.nlp\.H100\.guarantee: Input should be greater"):
        post_json(api_url, "/v1/whatif", {"edits": {"nlp": {"H100": {"guarantee": -1}}}})
    with pytest.raises(ApiUnavailable, match=r"\(422\): unknown team 'nobody'"):
        post_json(api_url, "/v1/whatif", {"edits": {"nobody": {"H100": {"guarantee": 1}}}})


def test_gpu_health_tab_lists_sick_gpus_and_the_jobs_they_hit(monkeypatch, api_url, sim_store):
    sim_store.fold()  # events are derived as minutes are folded
    at = show(app_against(monkeypatch, api_url), "GPU health")
    assert "GPU health events" in [s.value for s in at.subheader]
    tables = [d.value for d in at.dataframe]
    gpus = next(t for t in tables if "Last XID" in t.columns)
    assert len(gpus) > 0 and gpus["Thermal throttle"].sum() > 0
    assert any("Jobs hit" in t.columns for t in tables) and any("XID codes" in t.columns for t in tables)


def test_nodes_without_profiling_fields_are_named(monkeypatch, tmp_path):
    """A real L4 page (dcgm-exporter's default counters: no SM activity) stored as a server would: the Nodes tab
    says the profiling fields are not collected there instead of showing empty charts."""
    page = (SHARED_PAGES / "k8s-ai-conformance-kops-L4.txt").read_text()
    with Store(tmp_path / "l4.duckdb") as store:
        now = datetime.now(timezone.utc)
        for k in range(3):
            store.append_samples(DcgmPageConverter().convert(page, now - timedelta(seconds=30 * k), 30.0))
        server = ApiServer(store, Config(), port=0, open_reads=True)
        url = server.start()
        try:
            at = show(app_against(monkeypatch, url), "Nodes")
            note = [i.value for i in at.info if "profiling fields" in i.value]
            assert note and md("i-030791dc5a37cd257") in note[0]
        finally:
            server.stop()


def test_window_slider_changes_the_numbers(monkeypatch, api_url):
    at = app_against(monkeypatch, api_url)
    week = at.metric[0].value
    at.sidebar.slider[0].set_value(1).run()
    assert not at.exception
    assert at.metric[0].value != week  # one day costs less than seven


def test_stale_agent_nodes_are_flagged(monkeypatch, api_url, sim_store):
    with sim_store.transaction() as cur:
        cur.execute("INSERT OR REPLACE INTO nodes VALUES ('gpu-node-9', now() - INTERVAL 10 MINUTE, 30, 5, 40), "
                    "('gpu-node-1', now(), 30, 9, 72)")
    try:
        at = app_against(monkeypatch, api_url)
        assert not at.exception
        warning = at.warning[0].value if at.warning else ""
        assert md("gpu-node-9") in warning and md("gpu-node-1") not in warning  # names shown Markdown-escaped
        show(at, "Nodes")
        table = next(d.value for d in at.dataframe if "stale" in d.value.columns)
        assert dict(zip(table["node"], table["stale"])) == {"gpu-node-1": False, "gpu-node-9": True}
    finally:
        with sim_store.transaction() as cur:
            cur.execute("DELETE FROM nodes")


def test_unreachable_api_is_a_clear_message(monkeypatch):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    at = app_against(monkeypatch, f"http://127.0.0.1:{port}")
    assert not at.exception
    assert "cannot reach the gpuledger API" in at.error[0].value


@needs_chromium
def test_dashboard_in_headless_chromium(api_url, tmp_path):
    from playwright.sync_api import sync_playwright

    proc, url = start_dashboard(api_url, port=free_port())
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000},
                                    user_agent="gpuledger-test")
            errors: list[str] = []
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.goto(url)
            page.get_by_text("Cluster utilization over time").wait_for(timeout=90_000)
            page.get_by_text("Cost of GPUs present").first.wait_for(state="visible", timeout=30_000)
            page.get_by_text("Idle capacity (no job) cost").first.wait_for(state="visible", timeout=30_000)
            every_page = {"Overview": "Cost per day by team", "Teams": "Cost by GPU model", "Jobs": "Search job id",
                          "Cost & waste": "Waste per team", "Fairshare": "Fairshare factor per team",
                          "Recommendations": "Decision history", "GPU health": "GPU health events",
                          "Nodes": "Fragmentation: idle GPU"}
            for tab, text in every_page.items():
                page.get_by_role("tab", name=tab).click()
                page.get_by_text(text).first.wait_for(state="visible", timeout=30_000)
                page.screenshot(path=str(tmp_path / f"{tab.split()[0].lower()}.png"), full_page=True)
            assert not page.get_by_text("Traceback").count()
            assert not errors, errors
            browser.close()
        for tab in every_page:
            assert (tmp_path / f"{tab.split()[0].lower()}.png").stat().st_size > 10_000
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@contextmanager
def advice_page(store, config, token: str):
    """A real server over `store`, the dashboard against it (with the server's token) and a headless Chromium page
    opened at the Recommendations tab, where the browser tests of advice start; all of it stopped after."""
    from playwright.sync_api import sync_playwright
    server = ApiServer(store, config, port=0, token=token, open_reads=True)
    url = server.start()
    proc, dash = start_dashboard(url, port=free_port(), token=token)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(dash)
            page.get_by_role("tab", name="Recommendations").click(timeout=90_000)
            page.get_by_text("Decision history").wait_for(state="visible", timeout=60_000)
            yield page
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        server.stop()


@needs_chromium
def test_an_admin_accepts_advice_in_headless_chromium(tmp_path):
    """The Accept button in a real browser records the decision through the API with the server's token. On a
    store of its own holding one proposed quota change (the shared simulated store's advice is decided by other
    tests, and non-quota advice with no evidence behind it is superseded at the first refresh)."""
    import pandas as pd

    from gpuledger.analytics.windows import utc_now
    from gpuledger.policies.recommendation import stored
    from tests.test_dashboard_live import advice_of_every_kind
    with Store(tmp_path / "accept.duckdb") as store:
        store.set_rates(Config().rates)
        store.upsert_teams(pd.DataFrame({"team": ["nlp"], "share": [1.0], "quota_gpus": [4]}))
        start = utc_now().replace(second=0, microsecond=0) - timedelta(hours=2)
        store.append_samples(sample_table(*[gpu_rows("n1", g, "H100", 120, step_s=60.0, start=start, util=50.0,
                                              job="nlp/train", team="nlp") for g in range(4)]))
        (quota,) = [r for r in advice_of_every_kind(utc_now()) if r.kind == "quota"]
        store.add_recommendations(pd.DataFrame([quota.to_row()]))
        def accepted() -> bool:
            (now,) = stored(store, ids=[quota.id])
            return now.status == "accepted"

        with advice_page(store, Config(), "browser-t0k") as page:
            advice = page.get_by_test_id("stExpander")
            assert advice.count() >= 1
            # a click that lands while the page is still rerunning (two loaded workers on CI's two cores) can be
            # dropped by Streamlit, as a person would see: they click again. Each try waits for the store itself.
            for _ in range(3):
                if not page.get_by_role("button", name="Accept").first.is_visible():
                    advice.first.locator("summary").click()
                button = page.get_by_role("button", name="Accept")
                button.first.wait_for(state="visible", timeout=30_000)
                button.first.click()
                try:
                    wait_until(accepted, 40, "the decision to be stored", step_s=0.5)
                    break
                except AssertionError:
                    continue
        (after,) = stored(store, ids=[quota.id])
        assert after.status == "accepted" and after.decided_by == "dashboard"


@needs_chromium
def test_behind_the_sites_proxy_a_user_sees_what_their_token_allows(sim_store, tmp_path):
    """Reads closed; the proxy names the user in a header, the dashboard maps that user to a team token: the team
    lead sees their team only, someone the map does not know is asked to sign in."""
    import requests
    from playwright.sync_api import sync_playwright

    from tests.conftest import SITE
    server = ApiServer(sim_store, SITE, port=0, token="proxy-boot")
    url = server.start()
    made = requests.post(f"{url}/v1/tokens", json={"name": "nlp-lead", "role": "team:nlp"}, timeout=30,
                         headers={"Authorization": "Bearer proxy-boot"}).json()
    (tmp_path / "users.toml").write_text(f'"lead@example.org" = "{made["token"]}"\n')
    proc, dash = start_dashboard(url, port=free_port(), env={"GPULEDGER_TRUSTED_HEADER": "X-Forwarded-Email",
                                                               "GPULEDGER_USER_TOKENS": str(tmp_path / "users.toml")})
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            lead = browser.new_page(extra_http_headers={"X-Forwarded-Email": "lead@example.org"})
            lead.goto(dash)
            lead.get_by_text("(team:nlp) for lead@example.org").wait_for(state="visible", timeout=90_000)
            lead.get_by_role("tab", name="Jobs").click()  # pages load with the team's token (tests/test_access.py:
            lead.get_by_text("Search job id").first.wait_for(state="visible", timeout=60_000)  # what it may see)
            assert not lead.get_by_text("Sign in with a token").count()
            stranger = browser.new_page(extra_http_headers={"X-Forwarded-Email": "who@example.org"})
            stranger.goto(dash)
            stranger.get_by_text("Sign in with a token in the sidebar").first.wait_for(state="visible",
                                                                                      timeout=90_000)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        server.stop()


@needs_chromium
def test_api_docs_render_offline_in_headless_chromium(api_url):
    """This machine reaches no CDN, so /docs rendering proves its assets are served by gpuledger itself."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page()
        errors: list[str] = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.goto(api_url + "/")  # redirects to /docs
        page.locator(".swagger-ui .info .title").wait_for(timeout=30_000)
        assert "gpuledger" in page.locator(".swagger-ui .info .title").inner_text()
        page.get_by_text("/v1/recommendations", exact=True).first.wait_for(timeout=30_000)
        browser.close()
    assert errors == []


def test_the_nodes_page_shows_islands_from_a_shared_page_and_from_nvml(monkeypatch, tmp_path):
    """Topology from a real dcgm-exporter page (8 H100 SXM: one island, inferred, with its rule) and from NVML (two
    8-GPU boards, measured) stored as a server stores them, shown on the Nodes page without an exception."""
    from gpuledger.collector.nvml_source import NvmlSource
    from gpuledger.deploy.collect_loop import CollectLoop
    from tests.test_topology import two_boards
    page = (SHARED_PAGES / "nvidia-aicr-conformance-h100x8-pods.txt").read_text()
    with Store(tmp_path / "topo.duckdb") as store:
        now = datetime.now(timezone.utc)
        converter = DcgmPageConverter()
        store.append_samples(converter.convert(page, now - timedelta(seconds=30), 30.0))
        for found in converter.topology.topologies():
            store.record_topology(found, now - timedelta(seconds=30))
        nvml, _ = two_boards()
        CollectLoop(NvmlSource(nvml=nvml, node="hgx-b200-01"), store, 30.0).collect_once()
        server = ApiServer(store, Config(), port=0, open_reads=True)
        url = server.start()
        try:
            at = show(app_against(monkeypatch, url), "Nodes")
            assert not at.exception
            assert "Topology: NVLink islands" in [s.value for s in at.subheader]
            table = next(d.value for d in at.dataframe if "GPUs per island" in d.value.columns)
            shown = dict(zip(table["Node"], zip(table["GPUs per island"], table["Basis"])))
            assert shown == {"gpu-node-1": ("8", "inferred"), "hgx-b200-01": ("8 + 8", "measured")}
            assert any("inferred from the model" in m.value for m in at.markdown)
        finally:
            server.stop()
