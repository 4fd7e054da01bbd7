"""Weekly report files and the APScheduler job that writes them inside the server."""
from __future__ import annotations

import csv
from datetime import timedelta

import pytest

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import StoreError
from gpuledger.analytics.windows import iso_week
from gpuledger.collector.samples import IDLE_CAPACITY
from gpuledger.deploy.server import WEEKLY_REPORT_JOB, start_report_scheduler, weekly_report
from tests.conftest import SIM_END


def test_weekly_report_html_and_csv_per_team_add_up(sim_store, tmp_path):
    week = (SIM_END - timedelta(days=1)).strftime("%G-W%V")
    files = weekly_report(sim_store, Config(), tmp_path, week)
    assert files.label == week and files.html.exists()
    page = files.html.read_text()
    assert f"week {week}" in page and "idle capacity" in page and "<table>" in page
    summary = list(csv.DictReader(files.summary_csv.open()))
    total = sum(float(r["cost_usd"]) for r in summary)
    assert f"${total:,.2f}" in page
    team_total = 0.0
    for team, path in files.team_csvs.items():
        rows = list(csv.DictReader(path.open()))
        assert rows and {r["team"] for r in rows} == {team} and rows[0]["week"] == week
        team_total += sum(float(r["cost_usd"]) for r in rows)
    idle = sum(float(r["cost_usd"]) for r in summary if r["team"] == IDLE_CAPACITY)
    assert team_total + idle == pytest.approx(total)
    assert set(files.team_csvs) == {r["team"] for r in summary} - {IDLE_CAPACITY}


def test_scheduler_runs_the_report_every_monday(sim_store, tmp_path, caplog):
    scheduler = start_report_scheduler(sim_store, Config(), tmp_path)
    try:
        job = scheduler.get_job(WEEKLY_REPORT_JOB)
        fire = job.next_run_time
        assert fire.weekday() == 0 and (fire.hour, fire.minute) == (1, 0) and fire.utcoffset() == timedelta(0)
        job.func(*job.args)  # what the scheduler will call
        start, end, label = iso_week()
        written = (tmp_path / label / f"gpuledger-{label}.html").exists()
        assert written == (sim_store.sample_count(start, end) > 0)  # the 3 simulated days may not reach last week
        if not written:
            assert f"weekly report not written: no samples in week {label}" in caplog.text
    finally:
        scheduler.shutdown(wait=False)


def test_a_week_without_samples_is_refused(sim_store, tmp_path):
    with pytest.raises(StoreError, match="no samples in week 2030-W01"):
        weekly_report(sim_store, Config(), tmp_path, "2030-W01")
    assert not list(tmp_path.iterdir())


def test_report_has_a_chart_week_over_week_and_idle_rows_per_job(sim_store, tmp_path):
    week = (SIM_END - timedelta(days=1)).strftime("%G-W%V")
    files = weekly_report(sim_store, Config(), tmp_path, week)
    page = files.html.read_text()
    svg = page.split("<svg")[1].split("</svg>")[0]
    assert page.count("<svg") == 1 and "cost per day by team" in svg and "<rect" in svg
    assert "href" not in svg and "src=" not in page and "<script" not in page  # nothing to fetch, nothing to run
    summary = list(csv.DictReader(files.summary_csv.open()))
    assert {"cost_prev_week_usd", "cost_change"} <= set(summary[0])
    efficiency = [float(r["efficiency"]) for r in summary if r["team"] == "nlp"][0]
    assert f"{efficiency:.0%}" in page  # a percentage, not a one-decimal fraction
    idle_section = page.split("Largest idle allocations")[1].split("Recommendations")[0]
    rows = [row for row in idle_section.split("<tr>")[2:]]
    jobs = [row.split("</td>")[1] for row in rows]
    assert jobs and len(jobs) == len(set(jobs))  # one row per job, its GPUs counted, not a row per GPU
    if iso_week(week)[1] <= SIM_END:  # a week that is over: no advice about what runs now
        assert "reclaim" not in page.split("<h2>Recommendations</h2>")[1]
