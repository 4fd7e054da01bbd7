"""`gpuledger demo`: a simulated cluster (or a public trace), its history in a DuckDB file, live collection, API
and dashboard."""
from __future__ import annotations

import logging
import math
import os
import secrets
import shlex
import shutil
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

from gpuledger.analytics import fragmentation
from gpuledger.analytics.config import Config, Slo
from gpuledger.analytics.store import Store, StoreError
from gpuledger.analytics.store.access import AuditFiles, audited_actions
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import GpuledgerError
from gpuledger.collector.apps.simulated import MODELS, SimulatedApps
from gpuledger.collector.apps.targets import AppRead, PageRead
from gpuledger.collector.sim_scheduler import SITE_RECLAIM
from gpuledger.collector.simulator import ClusterSimulator, SimulatorSource, default_simulator
from gpuledger.deploy.app_loop import AppLoop, store_read
from gpuledger.policies.whatif import SCHEDULER_RECLAIM
from gpuledger.deploy.dashboard_proc import start_dashboard
from gpuledger.deploy.lifecycle import wait_for_stop
from gpuledger.deploy.ports import require_free
from gpuledger.deploy.server import ApiServer, Serving
from gpuledger.deploy.weekly_report import weekly_report

log = logging.getLogger(__name__)


class DemoError(GpuledgerError):
    """The demo cannot start on its database: one the demo did not make (it never overwrites one), or one that
    cannot be opened (another process holds it)."""


DEMO_MARK = "demo"  # meta key set in every database the demo builds
# the demo's latency objectives for the models its services run, unless the config sets its own: interactive chat
# models held to a tight one (the time-sliced service and the slower of the others miss it), a batch-style
# assistant to a loose one it meets with room to spare (so it can be right-sized)
DEMO_SLOS = {model: Slo(ttft_p95_s=0.25, tpot_p95_s=0.1, e2e_p95_s=15.0) for model in MODELS[::2]} | {
    MODELS[1]: Slo(ttft_p95_s=0.6, tpot_p95_s=0.25, e2e_p95_s=40.0)}
# the demo's monthly budgets, unless the config sets its own: nlp's run rate is forecast well over its budget (an
# alert a minute into the demo), vision's close to it, speech's far under
DEMO_BUDGETS = {"nlp": 40_000.0, "vision": 52_000.0, "speech": 60_000.0}


def with_demo_slos(store: Store, config: Config) -> Config:
    """`config`, with the demo's SLOs and budgets where `store` is a demo's database and the config sets none: a
    report or advice run on the demo's file afterwards judges its services as the running demo did."""
    if store.meta(DEMO_MARK) is not None:
        config.slo = config.slo or dict(DEMO_SLOS)
        config.budgets = config.budgets or dict(DEMO_BUDGETS)
    return config


def _check_is_demo_db(path: Path) -> None:
    """The demo rebuilds its file each run; refuse to do that to a database it did not create."""
    if not path.exists():
        return
    try:
        mark = Store.peek_meta(path, DEMO_MARK)
    except StoreError as exc:
        raise DemoError(f"{exc}; choose another --db") from exc
    if not mark:
        raise DemoError(f"{path} is not a gpuledger demo database; refusing to overwrite it. Use another --db.")


def _fresh_demo_store(path: Path, config: Config, echo: Callable[[str], None] = print) -> Store:
    """The demo's database rebuilt from nothing (only over a file the demo made), marked and priced. What people
    did to the old file (decisions, tokens, imports the audit log records) is named before it goes, and its audit
    key and head anchor go with it, so the new log's chain and head start together (a head left from the old log
    made the first `gpuledger audit` of the new one report a truncation)."""
    _check_is_demo_db(path)
    done = audited_actions(path) if path.exists() else {}
    if done:
        echo(f"gpuledger demo: rebuilding {path} from nothing discards what was done to it since its last run: "
             + ", ".join(f"{n} {action}" for action, n in done.items())
             + " (its audit log goes with it); give another --db to keep a file")
    for stale in (path, path.with_name(path.name + ".wal")):
        stale.unlink(missing_ok=True)
    AuditFiles.of(path).discard()
    store = Store(path)
    store.set_meta(DEMO_MARK, "true")
    config.price(store)
    return store


def build_demo_store(path: Path, config: Config, days: float, seed: int, step_s: float,
                     echo=print) -> tuple[Store, ClusterSimulator]:
    store = _fresh_demo_store(path, config, echo)  # refuses a database it did not make before simulating anything
    now = utc_now()
    sim = default_simulator(days=days, seed=seed, now=now)
    store.upsert_teams(sim.team_frame())  # the simulated site's teams, then the config's over them
    store.set_team_quotas(sim.quota_frame())
    store.set_meta(SCHEDULER_RECLAIM, SITE_RECLAIM)  # the simulated Kueue's own rule, as a scheduler would report it
    if config.teams:
        store.upsert_teams(config.team_frame())
        store.set_team_quotas(config.quota_frame())
    total = 0
    chunks = math.ceil(days)
    for i, table in enumerate(sim.history(now - timedelta(days=days), now, step_s=step_s), 1):
        total += store.append_samples(table)
        echo(f"  backfill {min(i, chunks)}/{chunks} days: {total:,} samples")
    minutes = store.fold()
    echo(f"  rollups: {minutes:,} minute(s) folded")
    store.upsert_jobs(sim.jobs_frame(now))
    rows = fragmentation.backfill(store, now - timedelta(days=days), now)
    echo(f"  fragmentation: {rows:,} node reading(s), hourly")
    # the minutes the build took, so the history runs into the live samples without a gap
    for table in sim.history(now, utc_now(), step_s=step_s):
        store.append_samples(table)
    pages = backfill_apps(store, sim, config, now - timedelta(days=days), utc_now())
    echo(f"  inference services: {pages:,} vLLM page(s) read, every {APP_BACKFILL_STEP_S / 60:g} minutes")
    return store, sim


APP_BACKFILL_STEP_S = 900.0  # the history's inference pages: every 15 minutes (live: every [apps] interval_s)
APP_BACKFILL_PAGES = 1000  # pages stored per write while backfilling (each page at its own instant)


def backfill_apps(store: Store, sim: ClusterSimulator, config: Config, start: datetime, end: datetime) -> int:
    """The simulated services' pages over [start, end), read and stored as the live loop stores them."""
    source = SimulatedApps(sim.services())
    attributor = config.attributor()
    pages: list[PageRead] = []
    stored = 0
    t = math.ceil(start.timestamp() / APP_BACKFILL_STEP_S) * APP_BACKFILL_STEP_S
    while t < end.timestamp():
        at = datetime.fromtimestamp(t, tz=timezone.utc)
        pages += [replace(page, at=page.at or at) for page in source.read(at).pages]
        t += APP_BACKFILL_STEP_S
        if len(pages) >= APP_BACKFILL_PAGES or t >= end.timestamp():  # a day's pages in one write, not 96
            store_read(store, AppRead(at=at, pages=pages), attributor, config.apps.aliases)
            stored, pages = stored + len(pages), []
    return stored


def build_trace_store(path: Path, config: Config, trace: str, data: Path | None, echo=print) -> Store:
    """A demo database holding a public trace's history instead of the simulator's."""
    from gpuledger.deploy.trace_import import import_trace
    store = _fresh_demo_store(path, config, echo)
    import_trace(store, trace, data, echo=echo)
    return store


def run_demo(db: Path, config: Config, days: float = 14.0, seed: int = 7, host: str = "127.0.0.1",
             api_port: int = 8080, dashboard_port: int = 8501, interval_s: float = 15.0,
             reports: Path = Path("gpuledger-data/reports"), dashboard: bool = True,
             duration_s: float | None = None, echo=print, trace: str | None = None,
             trace_data: Path | None = None) -> int:
    """The demo: the simulator's history and live collection, or (`trace`) a public trace's history, served."""
    require_free(host, api_port, "--api-port")  # before the minute of backfill, not after it
    if dashboard:
        require_free(host, dashboard_port, "--dashboard-port", any_port=False)
    if not config.slo:
        config.slo = dict(DEMO_SLOS)
    if not config.budgets and not trace:
        config.budgets = dict(DEMO_BUDGETS)
    if trace:
        echo(f"gpuledger demo: importing the {trace} trace into {db}")
        store, sim = build_trace_store(db, config, trace, trace_data, echo=echo), None
    else:
        echo(f"gpuledger demo: simulating {days:g} days of a 48-GPU cluster (seed {seed}) into {db}")
        store, sim = build_demo_store(db, config, days, seed, step_s=60.0, echo=echo)
    token = os.environ.get("GPULEDGER_TOKEN") or secrets.token_urlsafe(16)  # decisions (the dashboard's buttons)
    api = ApiServer(store, config, host=host, port=api_port, token=token, open_reads=True)  # a local demo
    # a trace is history only: nothing to collect live
    apps = AppLoop(SimulatedApps(sim.services()), store, config.attributor(), config.apps.interval_s,
                   config.apps.aliases) if sim else None
    serving = Serving(store, config, api, reports, SimulatorSource(sim, interval_s=interval_s) if sim else None,
                      interval_s, after_batch=(lambda: store.upsert_jobs(sim.jobs_frame(utc_now()))) if sim else None,
                      apps=apps)
    api_url, loop = serving.url, serving.loop
    try:
        files = weekly_report(store, config, reports)
    except StoreError:  # a short demo has no complete week yet: report the one in progress, marked as such
        files = weekly_report(store, config, reports, "current")
    proc = None
    if dashboard:
        proc, dash_url = start_dashboard(api_url, host=host, port=dashboard_port, token=token)
    echo("")
    echo(f"  API:            {api_url}/v1/recommendations")
    echo(f"  API docs:       {api_url}/docs")
    echo(f"  metrics:        {api_url}/metrics")
    if dashboard:
        echo(f"  dashboard:      {dash_url}")
    echo(f"  weekly report:  {files.html}")
    echo(f"  admin token:    {token} (decisions: POST /v1/recommendations/ID/decision; the dashboard has it)")
    live = f"live every {interval_s:g}s" if loop else f"the {trace} trace's history, no live collection"
    echo(f"  database:       {db} ({store.sample_count():,} samples; {live})")
    cli = command_name()
    echo(f"  then:           {cli} report --db {db}   (after Ctrl-C: DuckDB lets one process hold the file)")
    echo(f"                  {cli} recommend --db {db}; {cli} emit --target kueue --db {db}")
    echo("Press Ctrl-C to stop." if duration_s is None else f"Stopping after {duration_s:g}s.")
    wait_for_stop(duration_s)
    echo("stopping…")
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)
    serving.stop()
    echo(f"stopped; {loop.batches if loop else 0} live batch(es) collected, data kept in {db}")
    return 0


def command_name() -> str:
    """How to run gpuledger again from this shell: `gpuledger` when that is on PATH and is this install, else the
    path of this install's script (after the README's install it is `.venv/bin/gpuledger`, not on PATH)."""
    on_path = shutil.which("gpuledger")
    here = Path(sys.executable).parent / "gpuledger"
    if on_path and here.exists() and Path(on_path).resolve() == here.resolve():
        return "gpuledger"
    if here.exists():
        relative = os.path.relpath(here)
        return shlex.quote(str(here) if relative.startswith("..") else relative)
    return f"{shlex.quote(sys.executable)} -m gpuledger.deploy.cli"
