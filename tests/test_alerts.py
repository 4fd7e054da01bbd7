"""Budgets, forecasts and alerts: each alert raised once per channel (a real SMTP server and a real webhook receiver
on 127.0.0.1) and resolved when its condition ends; the shipped Prometheus rules checked and unit-tested by
promtool (Debian's prometheus package)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from gpuledger.analytics.budgets import budget_status, conditions
from gpuledger.analytics.config import AlertsConfig, Config, ConfigError, EmailConfig, TeamConfig, load_config
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import Role, create_token
from gpuledger.analytics.store.alerts import alerts, set_budget
from gpuledger.analytics.store.metrics import REGISTRY
from gpuledger.deploy import alerting
from gpuledger.deploy.alerting import check_alerts
from gpuledger.deploy.api.live_metrics import BUDGET_GAUGES, TEAM_GAUGES
from tests.helpers import api_client, gpu_rows, table
from tests.procs import free_port

UTC = timezone.utc
ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "gpuledger-alerts.yml"
DEC = datetime(2026, 12, 1, tzinfo=UTC)
NOW = DEC + timedelta(days=2, hours=12)


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's prometheus package (it ships promtool)")
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    return found


def test_the_shipped_rules_pass_promtool_and_fire_only_when_they_should():
    promtool = _promtool()
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and "SUCCESS: 4 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = subprocess.run([promtool, "test", "rules", "gpuledger-alerts.test.yml"], cwd=ROOT / "tests" / "data",
                            capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    exported = {name for _, name, _ in BUDGET_GAUGES + TEAM_GAUGES}
    used = set(__import__("re").findall(r"gpuledger_[a-z_]+", RULES.read_text()))
    assert used <= exported, used - exported  # every series the rules read is one /metrics exports


class Receiver:
    """A webhook receiver on 127.0.0.1: keeps each POSTed JSON body."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def inbox():
    from aiosmtpd.controller import Controller
    received = []

    class Inbox:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's handler API
            received.append((sorted(envelope.rcpt_tos), envelope.content.decode(errors="replace")))
            return "250 OK"
    port = free_port()
    controller = Controller(Inbox(), hostname="127.0.0.1", port=port)
    controller.start()
    yield port, received
    controller.stop()


@pytest.fixture
def receiver():
    hook = Receiver()
    yield hook
    hook.close()


def _busy_team(store: Store) -> Store:
    """Team a's job on one H100 since November 25 (busy), through NOW."""
    store.set_rates(Config().rates)
    start = DEC - timedelta(days=6)
    store.append_samples(table(gpu_rows("n1", 0, "H100", int((NOW - start).total_seconds() / 60), step_s=600,
                                        start=start, util=60.0, job="a/1", team="a")))
    store.fold()
    return store


def _site(port: int, hook: str, **alerts) -> Config:
    return replace(Config(), teams={"a": TeamConfig(share=1.0), "b": TeamConfig(share=1.0)}, budgets={"a": 1000.0},
                   email=EmailConfig(host="127.0.0.1", port=port, starttls=False, admins=("finance@example.org",),
                                     teams={"a": ("lead-a@example.org",)}),
                   alerts=AlertsConfig(warn_at=1.0, alert_at=1.0, webhook=hook, **alerts))


def test_a_budget_crossing_fires_one_alert_per_channel_and_resolves(file_store, inbox, receiver):
    """Done when: a budget crossing fires exactly one alert per channel, and resolves."""
    store = _busy_team(file_store)
    port, mails = inbox
    config = _site(port, receiver.url)
    status = budget_status(store, config, NOW)[0]
    # December so far: 60 hours of one H100; the forecast runs the week's shape to December 31
    assert status["spend_usd"] == pytest.approx(60 * 6.88, abs=0.01)
    assert status["forecast_usd"] == pytest.approx(31 * 24 * 6.88, rel=0.01)
    assert status["forecast_share"] > 1.0 > status["spend_share"]
    raised, resolved = check_alerts(store, config, NOW)
    assert [a["kind"] for a in raised] == ["budget forecast"] and resolved == []
    assert check_alerts(store, config, NOW + timedelta(minutes=5)) == ([], [])  # still holding: not again
    assert len(mails) == 1 and len(receiver.bodies) == 1
    rcpt, body = mails[0]
    assert rcpt == ["finance@example.org", "lead-a@example.org"] and "ALERT budget forecast" in body
    hook = receiver.bodies[0]
    assert hook["text"].startswith("[gpuledger] ALERT budget forecast: a is forecast to spend $5,118.72")
    assert hook["alert"]["state"] == "fired" and hook["alert"]["team"] == "a"
    set_budget(store, "a", 100_000.0, "finance", NOW, None)  # the budget raised: the forecast is under it
    raised, resolved = check_alerts(store, config, NOW + timedelta(minutes=10))
    assert raised == [] and [a["kind"] for a in resolved] == ["budget forecast"]
    assert len(mails) == 2 and "RESOLVED budget forecast" in mails[1][1]
    assert len(receiver.bodies) == 2 and receiver.bodies[1]["alert"]["state"] == "resolved"
    assert "no longer holds" in receiver.bodies[1]["text"]
    stored = alerts(store)
    assert len(stored) == 1 and stored["resolved_at"].notna().all()
    with api_client(store, config, open_reads=True) as api:
        listed = api.get("/v1/alerts").json()
    assert listed[0]["detail"]["threshold"] == 1.0 and listed[0]["deliveries"]["fired email"]["outcome"] == "sent"
    deliveries = json.loads(stored["deliveries"].iloc[0])
    assert {k: v["outcome"] for k, v in deliveries.items()} == {
        "fired email": "sent", "fired webhook": "sent", "resolved email": "sent", "resolved webhook": "sent"}


def test_a_webhook_that_does_not_answer_is_retried_counted_and_recorded(file_store, inbox, monkeypatch):
    monkeypatch.setattr(alerting, "PAUSE_S", 0.0)
    store = _busy_team(file_store)
    config = _site(inbox[0], f"http://127.0.0.1:{free_port()}/nobody", retries=2)

    def count(outcome: str) -> float:
        return REGISTRY.get_sample_value("gpuledger_alert_deliveries_total",
                                         {"channel": "webhook", "outcome": outcome}) or 0.0
    failed = count("failed")
    retried = REGISTRY.get_sample_value("gpuledger_alert_delivery_retries_total", {"channel": "webhook"}) or 0.0
    raised, _ = check_alerts(store, config, NOW)
    assert len(raised) == 1 and len(inbox[1]) == 1  # the e-mail still went
    assert count("failed") == failed + 1
    assert REGISTRY.get_sample_value("gpuledger_alert_delivery_retries_total", {"channel": "webhook"}) == retried + 2
    deliveries = json.loads(alerts(store)["deliveries"].iloc[0])
    assert deliveries["fired webhook"] == {"outcome": "failed", "tries": 3}
    assert deliveries["fired email"]["outcome"] == "sent"


def test_a_job_holding_gpus_idle_past_the_limit_alerts_and_resolves_when_it_works(file_store):
    store = file_store
    store.set_rates(Config().rates)
    start = NOW - timedelta(hours=5)
    store.append_samples(table(gpu_rows("n2", 0, "H100", 300, start=start, util=0.0, job="b/9", team="b"),
                               gpu_rows("n2", 1, "H100", 300, start=start, util=0.0, job="b/9", team="b")))
    store.fold()
    config = replace(Config(), alerts=AlertsConfig(idle_hours=4.0))
    found = [c for c in conditions(store, config, NOW) if c["kind"] == "idle job"]
    assert len(found) == 1 and found[0]["key"] == "idle job:b/9" and "2 GPU(s) idle for 5.0 h" in found[0]["subject"]
    assert not [c for c in conditions(store, replace(config, alerts=AlertsConfig(idle_hours=6.0)), NOW)
                if c["kind"] == "idle job"]
    raised, _ = check_alerts(store, config, NOW)
    assert [a["key"] for a in raised] == ["idle job:b/9"]
    store.append_samples(table(gpu_rows("n2", 0, "H100", 30, start=NOW, util=90.0, job="b/9", team="b"),
                               gpu_rows("n2", 1, "H100", 30, start=NOW, util=90.0, job="b/9", team="b")))
    store.fold()
    _, resolved = check_alerts(store, config, NOW + timedelta(minutes=30))
    assert [a["key"] for a in resolved] == ["idle job:b/9"]


def test_budgets_through_the_api_and_the_metrics(stack, file_store):
    store = _busy_team(file_store)
    config = replace(Config(), teams={"a": TeamConfig(share=1.0)}, budgets={"a": 1000.0})
    store.upsert_teams(pd.DataFrame({"team": ["b"], "share": [1.0], "quota_gpus": [None]}))
    _, team_b = create_token(store, "lead-b", Role.parse("team:b"), "test")
    client = stack.enter_context(api_client(store, config, token="root"))
    admin = {"Authorization": "Bearer root"}
    listed = client.get("/v1/budgets", headers=admin).json()
    assert [(b["team"], b["budget_usd"], b["source"]) for b in listed] == [("a", 1000.0, "config")]
    put = client.put("/v1/budgets/a", headers=admin, json={"usd": 5000})
    assert put.status_code == 200 and put.json()["budget_usd"] == 5000 and put.json()["source"].startswith("API")
    assert client.put("/v1/budgets/nobody", headers=admin, json={"usd": 5}).status_code == 404
    for bad in (-5, 0, True, "5000", 25000.555, 1e13):
        assert client.put("/v1/budgets/a", headers=admin, json={"usd": bad}).status_code == 422, bad
    for raw in (b'{"usd": NaN}', b'{"usd": Infinity}', b'{"usd": 1e400}'):  # Python's JSON reads these
        answer = client.put("/v1/budgets/a", headers={**admin, "Content-Type": "application/json"}, content=raw)
        assert answer.status_code == 422, (raw, answer.text)
    assert client.put("/v1/budgets/a", headers={"Authorization": f"Bearer {team_b}"},
                      json={"usd": 5}).status_code == 403
    assert client.get("/v1/budgets", headers={"Authorization": f"Bearer {team_b}"}).json() == []  # not its team's
    metrics = client.get("/metrics", headers=admin).text
    assert 'gpuledger_team_budget_usd{team="a"} 5000.0' in metrics
    assert 'gpuledger_team_period_spend_usd{team="a"}' in metrics


def test_a_budget_or_alert_setting_that_cannot_be_used_is_refused_at_load(tmp_path):
    def load(text: str) -> Config:
        path = tmp_path / "c.toml"
        path.write_text(text)
        return load_config(path)

    assert load("[teams.nlp]\nshare = 1\n[budgets]\nnlp = 5000\n").budgets == {"nlp": 5000.0}
    for text, message in [
        ("[budgets]\nghost = 100\n", "unknown team"),
        ("[teams.nlp]\nshare = 1\n[budgets]\nnlp = -1\n", "must be a number >= 0.01"),
        ("[alerts]\nwebhook = \"ftp://x\"\n", "http:// or https://"),
        ("[alerts]\nwarn_at = 1.5\nalert_at = 1.0\n", "above alert_at"),
        ("[alerts]\nidle_hour = 3\n", "did you mean 'idle_hours'"),
        ("[alerts]\nemail = \"yes\"\n", "true or false"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load(text)


def test_alert_mail_logs_in_where_the_server_requires_it(file_store, receiver, monkeypatch):
    """An SMTP server that requires AUTH (530 without it): the alert mail logs in with [report.email]'s
    credentials exactly as the weekly report does, and is delivered."""
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    received, logins = [], []

    class Inbox:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's handler API
            received.append(sorted(envelope.rcpt_tos))
            return "250 OK"

    def authenticator(server, session, envelope, mechanism, auth_data):
        logins.append(auth_data.login)
        return AuthResult(success=auth_data.login == b"alerts" and auth_data.password == b"s3cret")

    port = free_port()
    controller = Controller(Inbox(), hostname="127.0.0.1", port=port, authenticator=authenticator,
                            auth_required=True, auth_require_tls=False)
    controller.start()
    try:
        store = _busy_team(file_store)
        monkeypatch.setenv("GL_SMTP_USER", "alerts")
        monkeypatch.setenv("GL_SMTP_PASSWORD", "s3cret")
        config = _site(port, receiver.url)
        config = replace(config, email=replace(config.email, username_env="GL_SMTP_USER",
                                               password_env="GL_SMTP_PASSWORD"))
        raised, _ = check_alerts(store, config, NOW)
        assert raised and received == [["finance@example.org", "lead-a@example.org"]] and logins == [b"alerts"]
        deliveries = json.loads(store.scalar("SELECT deliveries FROM alerts"))
        assert deliveries["fired email"] == {"outcome": "sent", "tries": 1}
    finally:
        controller.stop()


def test_a_node_sending_another_nodes_gpus_alerts_the_admins_once(file_store, inbox, receiver):
    """Rows held because node-0001 sent node-0000's GPUs raise one "gpu held" alert for the admins (mail and
    webhook), named by node and reason, that stays one alert however often the loop checks."""
    from gpuledger.analytics.store.ingest_writer import IngestWriter
    from gpuledger.collector.simulator import cluster_of
    store = file_store
    store.set_rates(Config().rates)
    writer = IngestWriter(store, idle_checkpoint_s=600)
    at = datetime.now(timezone.utc).replace(microsecond=0)
    frame = cluster_of(1).frame([(at - timedelta(minutes=2)).timestamp()], 10.0)
    try:
        writer.submit("node-0000", "s", 0, 1, 10.0, frame)
        later = cluster_of(1).frame([(at - timedelta(minutes=1)).timestamp()], 10.0)
        writer.submit("node-0001", "s", 0, 1, 10.0, later)
    finally:
        writer.stop()
    port, mails = inbox
    config = _site(port, receiver.url)
    raised, _ = check_alerts(store, config, at)
    held = [a for a in raised if a["kind"] == "gpu held"]
    assert len(held) == 1 and held[0]["team"] == ""
    assert "node node-0001 sent 8 GPU(s) registered to node-0000: 8 row(s) held" in held[0]["subject"]
    assert check_alerts(store, config, at + timedelta(minutes=5)) == ([], [])
    assert any("ALERT gpu held" in body for _, body in mails)
    assert any("gpu held" in json.dumps(b) for b in receiver.bodies)


def test_alerts_of_one_kind_for_one_team_are_capped():
    from gpuledger.analytics.budgets import MAX_PER_TEAM_AND_KIND, capped
    found = [{"key": f"idle job:j{i}", "kind": "idle job", "team": "vision", "subject": f"job j{i} idle"}
             for i in range(32)] + [{"key": "idle job:k", "kind": "idle job", "team": "nlp", "subject": "job k idle"}]
    kept = capped(found)
    vision = [c for c in kept if c["team"] == "vision"]
    assert len(vision) == MAX_PER_TEAM_AND_KIND and vision[-1]["kind"] == "more alerts"
    assert vision[-1]["detail"]["count"] == 32 - (MAX_PER_TEAM_AND_KIND - 1)
    assert [c["key"] for c in kept if c["team"] == "nlp"] == ["idle job:k"]  # another team's alerts untouched
