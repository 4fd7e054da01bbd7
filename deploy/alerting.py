"""The server's alert loop: conditions checked every `[alerts] every_minutes`, each alert raised once and resolved
when its condition ends (analytics/store/alerts.py), and every firing and resolution delivered by e-mail (the
`[report.email]` server: admins and the team's recipients) and to a webhook (a Slack-compatible JSON body with a
`text` line, plus the alert itself). A channel that fails is tried again `[alerts] retries` times with a growing
pause; the outcome is counted (gpuledger_alert_deliveries_total) and kept on the alert, and a delivery that
failed never stops the loop or loses the alert.
"""
from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from datetime import datetime
from email.message import EmailMessage
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from gpuledger.analytics.budgets import FORECAST, GPU_HELD, SPEND, conditions
from gpuledger.analytics.config import AlertsConfig, Config, EmailConfig
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.alerts import raise_and_resolve, record_delivery
from gpuledger.analytics.store.metrics import ALERT_DELIVERIES, ALERT_RETRIES
from gpuledger.analytics.windows import utc_now
from gpuledger.deploy.mail import MailError, send_mail

log = logging.getLogger(__name__)
PHASES = ("fired", "resolved")
CHANNELS = ("email", "webhook")
PAUSE_S = 0.5  # before the first retry; doubled each time
DELIVERY_WORKERS = 4  # alerts delivered at once
URGENT = {SPEND: 0, FORECAST: 1, GPU_HELD: 2}  # delivered first, in this order; the rest after


def _text(alert: dict[str, Any], phase: str) -> str:
    """One line: the alert's subject as it fired (a resolution says its condition ended, with what fired it)."""
    if phase == "resolved":
        return (f"[gpuledger] RESOLVED {alert['kind']}: its condition no longer holds (it fired as: "
                f"{alert['subject']})")
    return f"[gpuledger] ALERT {alert['kind']}: {alert['subject']}"


def _mail(email: EmailConfig, alert: dict[str, Any], phase: str, timeout_s: float = 10.0) -> None:
    message = EmailMessage()
    to = list(email.admins) + list(email.teams.get(alert["team"], ()))
    message["From"], message["To"], message["Subject"] = email.sender, ", ".join(to), _text(alert, phase)
    message.set_content(_text(alert, phase) + "\n\n" + json.dumps(alert.get("detail") or {}, indent=2, default=str))
    send_mail(email, [message], timeout_s)  # the report's sender: its STARTTLS and its login


def _post(url: str, alert: dict[str, Any], phase: str, timeout_s: float = 10.0) -> None:
    body = {"text": _text(alert, phase), "alert": {"id": alert["id"], "kind": alert["kind"], "team": alert["team"],
                                                    "state": phase, "subject": alert["subject"],
                                                    "detail": alert.get("detail") or {}}}
    request = urllib.request.Request(url, data=json.dumps(body, default=str).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - the site's own URL
        if not 200 <= answer.status < 300:
            raise OSError(f"webhook answered {answer.status}")


def _try(channel: str, send: Callable[[], None], retries: int) -> tuple[str, int]:
    """(outcome, tries): `send` tried once and up to `retries` more times."""
    for attempt in range(retries + 1):
        try:
            send()
            return "sent", attempt + 1
        except (OSError, MailError, urllib.error.URLError) as exc:
            log.warning("alert %s delivery failed (try %d of %d): %s", channel, attempt + 1, retries + 1, exc)
            if attempt < retries:
                ALERT_RETRIES.labels(channel).inc()
                time.sleep(PAUSE_S * 2 ** attempt)
    return "failed", retries + 1


def deliver(store: Store, alerts: AlertsConfig, email: EmailConfig | None, alert: dict[str, Any], phase: str) -> None:
    """Send one alert's `phase` message over every configured channel, counting and recording each outcome."""
    channels: dict[str, Callable[[], None]] = {}
    if email is not None and alerts.email:
        channels["email"] = lambda: _mail(email, alert, phase)
    if alerts.webhook:
        channels["webhook"] = lambda: _post(alerts.webhook, alert, phase)
    for channel, send in channels.items():
        outcome, tries = _try(channel, send, alerts.retries)
        ALERT_DELIVERIES.labels(channel, outcome).inc()
        record_delivery(store, alert["id"], phase, channel, outcome, tries)


def check_alerts(store: Store, config: Config, now: datetime | None = None) -> tuple[list[dict], list[dict]]:
    """Raise the alerts whose condition started, resolve those whose condition ended, deliver both; (raised,
    resolved). A failure is logged, never raised: a scheduled job must not die."""
    now = now or utc_now()
    try:
        if store.folding_backlog():
            return [], []
        raised, resolved = raise_and_resolve(store, conditions(store, config, now), now)
        work = [(alert, phase) for phase, found in (("fired", raised), ("resolved", resolved)) for alert in found]
        work.sort(key=lambda item: URGENT.get(item[0]["kind"], len(URGENT)))  # budgets first
        for alert, phase in work:
            log.info("%s", _text(alert, phase))
        # several at once, bounded: one slow mail server or webhook (retried with pauses) no longer holds every
        # other alert behind it
        with ThreadPoolExecutor(max_workers=DELIVERY_WORKERS, thread_name_prefix="alert") as pool:
            for done in [pool.submit(deliver, store, config.alerts, config.email, alert, phase)
                         for alert, phase in work]:
                done.result()
        return raised, resolved
    except Exception:  # noqa: BLE001 - the traceback is in the log
        log.exception("alerts not checked")
        return [], []
