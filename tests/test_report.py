"""Weekly report files and the APScheduler job that writes them inside the server."""
from __future__ import annotations

import csv
import os
import re
from datetime import timedelta
from email import message_from_bytes
from email.policy import default as email_policy
from pathlib import Path

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
    assert abs(team_total + idle - total) < 0.005  # to the cent: each team's CSV adds up to its summary line
    for line in summary:
        team_rows = files.team_csvs.get(line["team"])
        if team_rows is not None:
            cents = sum(round(float(r["cost_usd"]) * 100) for r in csv.DictReader(team_rows.open()))
            assert cents == round(float(line["cost_usd"]) * 100), line["team"]
    idle_line = next(r for r in summary if r["team"] == IDLE_CAPACITY)  # GPUs no job held: all of it idle
    assert float(idle_line["idle_gpu_hours"]) == float(idle_line["gpu_hours"]) > 0
    assert float(idle_line["idle_cost_usd"]) == float(idle_line["cost_usd"])
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
    utilisation = page.split("<svg")[2].split("</svg>")[0]
    assert page.count("<svg") == 2 and "cost per day by team" in svg and "<rect" in svg
    assert "GPUs present, allocated and busy" in utilisation and utilisation.count("<polyline") == 3
    assert "href" not in svg + utilisation and "src=" not in page and "<script" not in page  # nothing to fetch
    summary = list(csv.DictReader(files.summary_csv.open()))
    assert {"cost_prev_week_usd", "cost_change"} <= set(summary[0])
    efficiency = [float(r["efficiency"]) for r in summary if r["team"] == "nlp"][0]
    assert f"{efficiency:.0%}" in page  # a percentage, not a one-decimal fraction
    idle_section = page.split("Largest idle allocations")[1].split("Queue and outcomes")[0]
    rows = [row for row in idle_section.split("<tr>")[2:]]
    jobs = [row.split("</td>")[1] for row in rows]
    assert jobs and len(jobs) == len(set(jobs))  # one row per job, its GPUs counted, not a row per GPU
    if iso_week(week)[1] <= SIM_END:  # a week that is over: no advice about what runs now
        assert "reclaim" not in page.split("<h2>Recommendations</h2>")[1]


def test_each_team_gets_its_own_page_and_a_pdf_is_printed(sim_store, tmp_path):
    from gpuledger.deploy.report_delivery import CHROMIUM, render_pdf
    week = (SIM_END - timedelta(days=1)).strftime("%G-W%V")
    files = weekly_report(sim_store, Config(), tmp_path, week)
    assert set(files.team_pages) == set(files.team_csvs)
    nlp = files.team_pages["nlp"].read_text()
    assert "nlp" in nlp and "Costliest jobs" in nlp and "<svg" in nlp
    assert not re.search(r'(src|href)="https?:', nlp)  # self-contained: nothing fetched when opened
    assert "vision/" not in nlp  # another team's jobs are not on this page
    if not Path(CHROMIUM).exists() and not os.environ.get("CI"):
        pytest.skip("Debian chromium not installed (CI installs it)")
    pdf = render_pdf(files)
    assert pdf is not None and pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 10_000


def test_the_report_is_mailed_through_a_real_smtp_server(sim_store, tmp_path, monkeypatch):
    """aiosmtpd on 127.0.0.1: admins get the page, the PDF (when Chromium is here) and the summary; a team gets
    only its page and CSV; the credentials come from the environment."""
    from aiosmtpd.controller import Controller

    from gpuledger.analytics.config import load_config
    from gpuledger.deploy.report_delivery import DeliveryError, send
    from tests.procs import free_port

    received = []

    class Inbox:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's handler API
            received.append((envelope.rcpt_tos, message_from_bytes(envelope.content, policy=email_policy)))
            return "250 OK"
    port = free_port()
    controller = Controller(Inbox(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        (tmp_path / "site.toml").write_text(f"""
[report.email]
host = "127.0.0.1"
port = {port}
starttls = false
from = "gpuledger@example.org"
admins = ["admin@example.org"]
[report.email.teams]
nlp = ["nlp-lead@example.org", "nlp-finance@example.org"]
""")
        config = load_config(tmp_path / "site.toml")
        week = (SIM_END - timedelta(days=1)).strftime("%G-W%V")
        files = weekly_report(sim_store, config, tmp_path / "out", week)
        assert send(config.email, files) == 2
    finally:
        controller.stop()
    by_rcpt = {tuple(sorted(to)): msg for to, msg in received}
    admin = by_rcpt[("admin@example.org",)]
    names = {part.get_filename() for part in admin.iter_attachments()}
    assert files.html.name in names and "summary.csv" in names
    team = by_rcpt[("nlp-finance@example.org", "nlp-lead@example.org")]
    team_names = {part.get_filename() for part in team.iter_attachments()}
    assert team_names == {files.team_pages["nlp"].name, files.team_csvs["nlp"].name}
    assert "nlp" in team["Subject"] and team["From"] == "gpuledger@example.org"
    closed = tmp_path / "closed.toml"
    closed.write_text(f'[report.email]\nhost = "127.0.0.1"\nport = {free_port()}\nstarttls = false\n'
                      'admins = ["a@example.org"]\n')
    with pytest.raises(DeliveryError, match="cannot mail"):
        send(load_config(closed).email, files)
    bad = tmp_path / "bad.toml"
    bad.write_text('[report.email]\nhost = "x"\nadmins = ["not-an-address"]\n')
    with pytest.raises(Exception, match="e-mail addresses"):
        load_config(bad)
