"""The long-running server: HTTP API in a uvicorn thread plus the weekly report job.

uvicorn runs in a thread (not a subprocess) so the API and the collector share one DuckDB
connection, which is what lets a single process be the file's only writer.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import uvicorn
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from gpuledger.analytics import fragmentation
from gpuledger.analytics.config import Config
from gpuledger.analytics.ledger import close_due
from gpuledger.analytics.report import ReportFiles
from gpuledger.analytics.store import Store, StoreError
from gpuledger.analytics.store.ingest_writer import IngestWriter
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import GpuledgerError
from gpuledger.collector.source import Source
from gpuledger.deploy.alerting import check_alerts
from gpuledger.deploy.api import create_app
from gpuledger.deploy.collect_loop import CollectLoop
from gpuledger.deploy.app_loop import AppLoop
from gpuledger.deploy.job_loop import JobLoop
from gpuledger.deploy.connections import ConnectionLimits, guarded_protocol
from gpuledger.deploy.report_delivery import deliver
from gpuledger.deploy import server_file
from gpuledger.deploy.weekly_report import weekly_report
from gpuledger.policies.recommender import RecommendationService

log = logging.getLogger(__name__)
WEEKLY_REPORT_JOB = "weekly-cost-report"
FRAGMENTATION_EVERY_MIN = 10  # how often the server records the cluster's fragmentation


class ApiServer:
    def __init__(self, store: Store, config: Config, host: str = "127.0.0.1", port: int = 8080,
                 token: str | None = None, open_reads: bool = False, tls: tuple[Path, Path] | None = None,
                 trusted_proxies: Sequence[str] | None = None, limits: ConnectionLimits | None = None) -> None:
        """`token`: the bootstrap admin token; `open_reads`: reads without a token; `tls`: (certificate, key) files
        to serve HTTPS with; `trusted_proxies`: CIDRs whose X-Forwarded-For the audit log believes; `limits`:
        connections per client, head and body deadlines (deploy/connections.py)."""
        config.apply_to(store)  # retention (the oldest sample ingest accepts) and the idle threshold of the rollups
        self.ingest = None if store.read_only else IngestWriter(store, **config.ingest.writer_options(),
                                                                 pool_teams=config.pool_teams)
        self.app = create_app(store, config, ingest_writer=self.ingest, token=token, open_reads=open_reads,
                              trusted_proxies=trusted_proxies)
        cert, key = tls or (None, None)
        self.limits = limits or ConnectionLimits()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=port, log_level="warning",
                                                    access_log=False, ssl_certfile=cert, ssl_keyfile=key,
                                                    proxy_headers=False,  # the API decides whom to believe
                                                    http=guarded_protocol(self.limits),
                                                    timeout_keep_alive=self.limits.keep_alive_s,
                                                    backlog=self.limits.backlog))
        self.scheme = "https" if tls else "http"
        self.thread = threading.Thread(target=self.server.run, name="api", daemon=True)
        self.host = host
        self.port = port

    def start(self, timeout_s: float = 20.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise GpuledgerError(f"API server failed to start on {self.host}:{self.port} (port in use?)")
            if time.monotonic() > deadline:
                raise GpuledgerError("API server did not start in time")
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"{self.scheme}://{self.host}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        if self.ingest is not None:
            self.ingest.stop()
        if self.app.state.audit is not None:
            self.app.state.audit.close()


def scheduled_weekly_report(store: Store, config: Config, out_dir: str | Path) -> ReportFiles | None:
    """The Monday job: the last complete week's report, as PDF too, mailed when `[report.email]` says where; or
    a warning when that week has no samples."""
    try:
        files = weekly_report(store, config, out_dir)
    except StoreError as exc:
        log.warning("weekly report not written: %s", exc)
        return None
    deliver(config.email, files)
    return files


def record_fragmentation(store: Store) -> int:
    """The cluster's fragmentation now, per node, into its history (a failure is logged, never raised)."""
    try:
        return fragmentation.record(store, utc_now())
    except Exception:  # noqa: BLE001 - a scheduled job must not die; the traceback is in the log
        log.exception("fragmentation not recorded")
        return 0


def refresh_advice(service: RecommendationService, store: Store) -> None:
    """The scheduled refresh of the open advice (made only when `[quota] refresh_minutes` have passed), skipped
    while the server folds a backlog (the API refuses analytic reads then too); a failure is logged, never raised."""
    try:
        if not store.folding_backlog():
            service.current()
    except Exception:  # noqa: BLE001 - a scheduled job must not die; the traceback is in the log
        log.exception("advice not refreshed")


def close_periods(store: Store, config: Config) -> list[str]:
    """The ledger's periods whose grace has passed, closed (their statements stored); a problem is logged, never
    raised (a ledger whose period kind changed says so here until the config is put back)."""
    try:
        closed = close_due(store, config.ledger, by="gpuledger server")
    except GpuledgerError as exc:
        log.warning("ledger periods not closed: %s", exc)
        return []
    except Exception:  # noqa: BLE001 - a scheduled job must not die; the traceback is in the log
        log.exception("ledger periods not closed")
        return []
    for period in closed:
        log.info("ledger period %s closed: its statement is stored and final", period)
    return closed


def start_report_scheduler(store: Store, config: Config, out_dir: str | Path) -> BackgroundScheduler:
    """Every Monday 01:00 UTC, report the ISO week that just ended; every FRAGMENTATION_EVERY_MIN minutes,
    record the cluster's fragmentation."""
    scheduler = BackgroundScheduler(timezone="UTC")
    scheduler.add_job(scheduled_weekly_report, CronTrigger(day_of_week="mon", hour=1, minute=0, timezone="UTC"),
                      args=[store, config, out_dir], id=WEEKLY_REPORT_JOB, name="weekly cost report",
                      misfire_grace_time=6 * 3600, coalesce=True)
    scheduler.add_job(record_fragmentation, IntervalTrigger(minutes=FRAGMENTATION_EVERY_MIN), args=[store],
                      id="fragmentation", name="fragmentation history", coalesce=True, max_instances=1)
    scheduler.start()
    return scheduler


class Serving:
    """A running server as `serve` and `demo` both run it: the API, the scheduled jobs (weekly report,
    fragmentation) and, with a source, the collect loop; started in one order and stopped in the reverse one, so
    neither command assembles or tears it down on its own."""

    def __init__(self, store: Store, config: Config, api: ApiServer, reports: str | Path,
                 source: Source | None = None, interval_s: float = 30.0,
                 after_batch: Callable[[], None] | None = None, jobs: JobLoop | None = None,
                 apps: AppLoop | None = None) -> None:
        self.store = store
        self.api = api
        self.url = api.start()
        # commands run on this machine against the file find the server by this note (deploy/server_file.py)
        self.note = None if store.lake or store.read_only else server_file.announce(store.path, self.url)
        self.scheduler = start_report_scheduler(store, config, reports)
        # the open advice is refreshed here when due, so a dashboard's request does not wait for an evaluation
        self.scheduler.add_job(refresh_advice, IntervalTrigger(minutes=1), args=[api.app.state.recommender, store],
                               id="advice", name="advice refresh", next_run_time=utc_now(), coalesce=True,
                               max_instances=1)
        # budget and idle-job alerts, raised once and resolved when their condition ends (deploy/alerting.py)
        self.scheduler.add_job(check_alerts, IntervalTrigger(minutes=config.alerts.every_minutes), args=[store, config],
                               id="alerts", name="alerts", next_run_time=utc_now(), coalesce=True, max_instances=1)
        # periods whose grace has passed are closed at start and then every hour
        self.scheduler.add_job(close_periods, IntervalTrigger(hours=1), args=[store, config], id="ledger",
                               name="ledger periods", next_run_time=utc_now(), coalesce=True, max_instances=1)
        self.loop = CollectLoop(source, store, interval_s, after_batch=after_batch) if source else None
        if self.loop:
            api.app.state.collection = self.loop  # /healthz reports degraded while it keeps failing
            self.loop.start()
        self.jobs = jobs  # the schedulers' job lifecycle and queues (deploy/job_loop.py), when read
        if self.jobs:
            api.app.state.job_source = self.jobs  # /healthz says how its reads go and what Prometheus lacks
            self.jobs.start()
        self.apps = apps  # inference servers' own metrics (deploy/app_loop.py), when read
        if self.apps:
            api.app.state.app_source = self.apps  # /healthz says what its reads skipped and could not reach
            self.apps.start()

    def stop(self) -> None:
        if self.apps:
            self.apps.stop()
            self.apps.join(timeout=10)
        if self.jobs:
            self.jobs.stop()
            self.jobs.join(timeout=10)
        if self.loop:
            self.loop.stop()
            self.loop.join(timeout=10)
        self.scheduler.shutdown(wait=False)
        if self.note is not None:
            server_file.withdraw(self.store.path)
        self.api.stop()
        self.store.close()
