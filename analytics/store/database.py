"""The DuckDB store: one file, one writer, bulk Arrow appends.

DuckDB lets one process write a database file, so the process that owns a Store (the
server or the demo) is the only writer; other readers go through its HTTP API. Within
the process, each call takes its own cursor, so the API's threads can read while the
collector thread appends.

Checkpoints (folding the write-ahead log into the file) are moved out of the write path:
DuckDB's default checkpoints whenever the WAL passes 16 MB, inside whichever commit crosses
it, which during an ingest burst more than halves throughput. The store raises that
threshold to a safety cap and writers call `checkpoint_if_due` when they are idle.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from gpuledger.analytics.store import access, deadline, dra_claims, health, lake, rollups
from gpuledger.analytics.store import topology as topology_tables
from gpuledger.analytics.store import alerts as alert_tables
from gpuledger.analytics.store import gpu_inventory
from gpuledger.analytics.store.metrics import (
    BATCHES_WRITTEN,
    CHECKPOINT_SECONDS,
    RETENTION_ROWS_DROPPED,
    ROLLUP_BEHIND,
    ROLLUP_FOLD_RATE,
    ROLLUP_FOLD_SECONDS,
    ROLLUP_WATERMARK,
    ROW_RATE,
    ROWS_WRITTEN,
)
from gpuledger.analytics.store.rates import BASE, PoolRule, RateChange, replace_card, replace_pools
from gpuledger.analytics.store.schema import (
    APP_HOUR_FOLD,
    APP_INCREASE,
    APP_SERIES,
    APP_SERIES_ID,
    DDL,
    KEYS,
    QUERY_LAYER,
    SCHEMA_VERSION,
    SINCE_EVER,
    column_migrations,
    job_column_migrations,
    table_migrations,
    without_keys,
)
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import GpuledgerError
from gpuledger.collector.jobs.classes import infer_class
from gpuledger.collector.jobs.lifecycle import DERIVED_EVENTS
from gpuledger.collector.samples import ADDED_COLUMNS, PROCESS_SCHEMA, SAMPLE_SCHEMA
from gpuledger.collector.topology import NodeTopology

log = logging.getLogger(__name__)


class StoreError(GpuledgerError):
    """The database cannot be opened or does not hold what was asked for."""


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Reorder and cast a batch to the store's schema; a missing or uncastable column is a clear error, except the
    columns added since the first agents shipped (an older agent's batch gets nulls there)."""
    present = set(table.column_names)
    for field in schema:
        if field.name not in present and field.name in ADDED_COLUMNS:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
            present.add(field.name)
    missing = [name for name in schema.names if name not in present]
    if missing:
        raise StoreError(f"batch is missing column(s) {missing}")
    table = table.select(schema.names)
    if table.schema.equals(schema):
        return table  # the common case (our own agents); a cast costs a compute call per column
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise StoreError(f"batch does not match the sample schema: {_uncastable(table, schema) or exc}") from exc


def _uncastable(table: pa.Table, schema: pa.Schema) -> str | None:
    """The first column that cannot take the schema's type, in words (only run once a whole cast has failed)."""
    for field in schema:
        column = table.column(field.name)
        try:
            column.cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return f"column {field.name!r} is {column.type}, which does not convert to {field.type}"
    return None


def default_threads() -> int:
    """All cores but one: the writing process's own threads (HTTP, the ingest writer) need a core too.

    DuckDB's default, every core, oversubscribes a small machine: on two cores ingest ran ~20%
    slower with DuckDB on both than on one (benchmarks/ingest.py).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


WAL_CAP = "256MB"  # DuckDB still checkpoints inside a commit past this: a sustained burst cannot grow the WAL forever
IDLE_CHECKPOINT_BYTES = 16 * 1024 * 1024  # DuckDB's own default threshold, applied when a writer is idle
COMPACT_EVERY_S = 24 * 3600  # row-group compaction (DuckDB's vacuum), at most this often and only when idle
VACUUM_TASKS = 100  # DuckDB's default max_vacuum_tasks, used for the compacting checkpoint
FOLD_EVERY_S = 60.0  # how often writers fold closed minutes into the rollups
FOLD_CHUNK = timedelta(hours=6)  # one fold transaction covers at most this much time (a first fold of a big store)
FOLD_MIN_CHUNK = timedelta(minutes=1)
FOLD_STEP_S = 1.0  # a fold transaction aims at about this much work, so it never holds the writer for long
CATCH_UP_LAG = timedelta(minutes=15)  # behind by more than this, a store is catching up on a backlog
NEG_INF = datetime.min.replace(tzinfo=timezone.utc)  # "nothing folded yet", as a watermark
POS_INF = datetime(9999, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Retention:
    """How long each level is kept: raw samples `raw_days` (also the oldest sample ingest accepts, so a late sample
    always finds its minute's raw rows to refold from), minute rollups `minute_days`, hour rollups forever."""
    raw_days: float = rollups.RAW_DAYS
    minute_days: float = rollups.MINUTE_DAYS

    def __post_init__(self) -> None:
        if not 1.0 <= self.raw_days <= self.minute_days:
            raise ValueError(f"raw_days must be >= 1 and <= minute_days, got raw_days={self.raw_days:g}, "
                             f"minute_days={self.minute_days:g}")


def floor_minute(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


def floor_hour(ts: datetime) -> datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


def wal_bytes(db_path: str | Path) -> int:
    """Size of a DuckDB file's write-ahead log (0 when there is none); readable while another process writes."""
    try:
        return os.path.getsize(f"{db_path}.wal")
    except OSError:
        return 0


class Store:
    def __init__(self, path: str | Path, read_only: bool = False, threads: int | None = None,
                 lake_data: str | Path | None = None) -> None:
        """`path`: a DuckDB file, or a DuckLake catalog `ducklake:postgres:<conninfo>` (analytics/store/lake.py) whose
        Parquet files go to `lake_data`. `threads`: DuckDB worker threads; by default all cores but one for a
        writer, DuckDB's own for a reader."""
        self.path = str(path)
        self.lake = lake.is_lake(self.path)
        self.read_only = read_only
        if not read_only and not self.lake:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            settings: dict[str, str | int] = {} if read_only else {"checkpoint_threshold": WAL_CAP,
                                                                   "max_vacuum_tasks": 0}
            threads = threads or (None if read_only else default_threads())
            if threads:
                settings["threads"] = threads
            if self.lake:
                self._con = lake.connect(self.path, read_only, lake_data, settings)
            else:
                self._con = duckdb.connect(self.path, read_only=read_only, config=settings)
        except duckdb.IOException as exc:
            held = "lock" in str(exc).lower()
            raise StoreError(f"cannot open {self.path}: {exc}"
                             + (" (is another gpuledger server writing to it?)" if held else "")) from exc
        self._con.execute("SET TimeZone = 'UTC'")  # day and hour buckets are UTC whatever the host's zone
        self._write_lock = threading.Lock()
        self._memo = threading.local()  # remembering(): one thread's answers within a block
        self._latest: dict[str, datetime] | None = None  # newest sample per node, loaded on first use
        self._compacted_at = time.monotonic()
        self._folded_at = 0.0  # monotonic time of the last fold
        self._fold_state: dict[str, Any] | None = None  # this writer's watermarks, as its last fold left them
        self._fold_chunk = timedelta(hours=1)  # the time one fold step covers, adapted to FOLD_STEP_S
        self._behind = False  # a bounded fold stopped with minutes left
        self.retention = Retention()
        if not read_only:
            with self._write_lock:
                here = "table_catalog = current_database()"
                tables = {row[0] for row in self._con.execute(
                    f"SELECT table_name FROM information_schema.tables WHERE {here}").fetchall()}
                self._con.execute("BEGIN TRANSACTION")
                for statement in (table_migrations(tables) + DDL + rollups.DDL + health.DDL + dra_claims.DDL
                                  + access.DDL + alert_tables.DDL + topology_tables.DDL + gpu_inventory.DDL):
                    self._con.execute(without_keys(statement) if self.lake else statement)
                self._con.execute("COMMIT")
                columns = {row[0] for row in self._con.execute(
                    f"SELECT column_name FROM information_schema.columns WHERE table_name = 'samples' AND {here}"
                ).fetchall()}
                job_columns = {row[0] for row in self._con.execute(
                    f"SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs' AND {here}"
                ).fetchall()}
                held = {row[0] for row in self._con.execute(
                    f"SELECT column_name FROM information_schema.columns WHERE table_name = 'held_samples' AND {here}"
                ).fetchall()}
                for statement in (column_migrations(columns) + job_column_migrations(job_columns) + QUERY_LAYER
                                  + rollups.MACROS + gpu_inventory.held_ddl(held)):
                    self._con.execute(statement)
                self._once(gpu_inventory.SEEDED_KEY, gpu_inventory.seed, fresh="samples" not in tables)
                self._bound_old_rollups(fresh="usage_minute" not in tables)
                self._once("app_series_counted", self._count_old_app_rows, fresh="app_samples" not in tables)
                self._set_meta(self._con, "schema_version", SCHEMA_VERSION)

    def _bound_old_rollups(self, fresh: bool) -> None:
        """Once per store: bound rollup rows folded before the fold bounded raw values (rollups.BOUND_OLD_ROLLUPS),
        so a hostile row an older server stored cannot keep a bill in the millions or an answer a 500. A store whose
        rollup tables were created just now has no such rows: it is only marked, since the fourteen updates cost
        seconds on a DuckLake catalog even when empty."""
        def bound(cur: duckdb.DuckDBPyConnection) -> None:
            for statement in rollups.BOUND_OLD_ROLLUPS:
                cur.execute(statement)
        self._once("rollups_bounded", bound, fresh)

    def _once(self, key: str, step: Callable[[duckdb.DuckDBPyConnection], None], fresh: bool) -> None:
        """Run a migration `step` once per store, in one transaction with its mark (meta `key`); a store whose
        tables were created just now has nothing to carry forward, and is only marked."""
        if self._con.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone():
            return
        self._con.execute("BEGIN TRANSACTION")
        try:
            if not fresh:
                step(self._con)
            self._set_meta(self._con, key, "1")
        except BaseException:
            self._con.execute("ROLLBACK")
            raise
        self._con.execute("COMMIT")

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor of the store's connection (on DuckLake, pointed at the lake: a cursor is a new connection)."""
        cur = self._con.cursor()
        return deadline.watched(lake.use(cur) if self.lake else cur)  # a request's read stops at its deadline

    def _replace_rows(self, cur: duckdb.DuckDBPyConnection, table: str, source: str) -> None:
        """Insert the rows of `source`, replacing stored rows with the same key (KEYS). DuckLake has no keys to
        conflict on, so there it is a delete and an insert, inside the caller's transaction."""
        if self.lake:
            key = KEYS[table]
            cur.execute(f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {source})")
            cur.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {source}")
        else:
            cur.execute(f"INSERT OR REPLACE INTO {table} BY NAME SELECT * FROM {source}")

    def _set_meta(self, cur: duckdb.DuckDBPyConnection, key: str, value: str) -> None:
        if self.lake:
            cur.execute("DELETE FROM meta WHERE key = ?", [key])
            cur.execute("INSERT INTO meta VALUES (?, ?)", [key, value])
        else:
            cur.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writes: always whole batches ---------------------------------------------------
    def _insert(self, table_name: str, batch: pa.Table | pd.DataFrame, replace: bool = False) -> int:
        if len(batch) == 0:
            return 0
        with self.transaction() as cur:
            cur.register("incoming_batch", batch)
            if replace:
                self._replace_rows(cur, table_name, "incoming_batch")
            else:
                cur.execute(f"INSERT INTO {table_name} BY NAME SELECT * FROM incoming_batch")
            cur.unregister("incoming_batch")
        return len(batch)

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor inside BEGIN/COMMIT holding the write lock; any exception rolls everything back."""
        with self._write_lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN TRANSACTION")
                try:
                    yield cur
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
                cur.execute("COMMIT")
            finally:
                cur.close()

    def wal_bytes(self) -> int:
        return wal_bytes(self.path)

    def checkpoint_if_due(self, min_wal_bytes: int = IDLE_CHECKPOINT_BYTES) -> bool:
        """Fold the WAL into the file when it has grown; skipped (False) while any other transaction runs.

        Once a day the checkpoint also drops what retention expired and compacts row groups. Every group commit
        leaves a partial row group, and DuckDB's vacuum merges neighbours at each checkpoint; after an hour-long backlog
        drain that took ~4 s (rewriting a million rows), stalling ingest at what should be a quiet
        moment. Samples are append-only, so nothing is lost by merging them once a day instead.
        """
        compact = time.monotonic() - self._compacted_at >= COMPACT_EVERY_S
        if self.wal_bytes() < min_wal_bytes and not compact:
            return False
        if compact:  # the daily quiet moment is also when expired samples and minute rollups are dropped
            self.retain()
        with self._write_lock:
            cur = self._cursor()
            try:
                started = time.perf_counter()
                if compact:
                    cur.execute(f"SET max_vacuum_tasks = {VACUUM_TASKS}")
                    self._set_meta(cur, "compacted_at", str(utc_now()))
                try:
                    cur.execute("CHECKPOINT")
                finally:
                    if compact:
                        cur.execute("SET max_vacuum_tasks = 0")
                if compact:
                    self._compacted_at = time.monotonic()
                CHECKPOINT_SECONDS.labels(kind="compact" if compact else "wal").observe(
                    time.perf_counter() - started)
                return True
            except duckdb.Error as exc:  # a reader's open transaction: try again at the next idle moment
                log.debug("checkpoint deferred: %s", exc)
                return False
            finally:
                cur.close()

    def latest_sample_ts(self, cur: duckdb.DuckDBPyConnection | None = None) -> dict[str, datetime]:
        """The newest stored sample instant per node, so ingest need only look for duplicates at or before it.

        Every path that stores samples raises these marks (note_latest), so a mark is never behind the table.
        """
        if self._latest is None:
            reader = cur or self._cursor()
            try:
                rows = reader.execute("SELECT node, max(ts) FROM samples GROUP BY node").fetchall()
            finally:
                if cur is None:
                    reader.close()
            self._latest = {node: ts for node, ts in rows if node is not None}
        return self._latest

    def note_latest(self, table: pa.Table, cur: duckdb.DuckDBPyConnection | None = None) -> None:
        if table.num_rows == 0:
            return
        latest = self.latest_sample_ts(cur)
        newest = table.select(["node", "ts"]).group_by("node", use_threads=False).aggregate([("ts", "max")])
        for node, ts in zip(newest["node"].to_pylist(), newest["ts_max"].to_pylist()):
            if node is not None and ts is not None and (node not in latest or ts > latest[node]):
                latest[node] = ts

    def append_samples(self, table: pa.Table) -> int:
        """Store samples as they are (no screening: the demo, benchmarks and the local collector), with the
        rollups of any minute they land in that is already folded; folds closed minutes when due."""
        table = conform(table, SAMPLE_SCHEMA)
        if not table.num_rows:
            return 0
        with self.transaction() as cur:
            cur.register("incoming_batch", table)
            cur.execute("INSERT INTO samples BY NAME SELECT * FROM incoming_batch")
            cur.unregister("incoming_batch")
            self.refold_late(cur, table)
            self.note_latest(table, cur)
        BATCHES_WRITTEN.inc()
        ROWS_WRITTEN.inc(table.num_rows)
        ROW_RATE.add(table.num_rows)
        self.fold_if_due()
        return table.num_rows

    # --- rollups (analytics/store/rollups.py) ----------------------------------------------
    def rollup_params(self, cur: duckdb.DuckDBPyConnection | None = None) -> dict[str, Any]:
        """The watermarks and idle threshold every rollup query passes to `usage_between` / `minute_segments`."""
        reader = cur or self._cursor()
        try:
            mwm, hwm, idle_pct = reader.execute(rollups.STATE).fetchone()
        finally:
            if cur is None:
                reader.close()
        return {"mwm": mwm or NEG_INF, "hwm": hwm or NEG_INF, "idle_pct": idle_pct}

    def query_usage(self, sql: str, params: Mapping[str, Any]) -> pd.DataFrame:
        """A query over the rollups: `sql` may use $mwm, $hwm, $idle_pct and $fine (default false)."""
        remembered = self._remembered(sql, params)
        if remembered is not None:
            return remembered
        cur = self._cursor()
        try:
            values = {"fine": False, **self.rollup_params(cur), **params}
            used = set(re.findall(r"\$(\w+)", sql))  # DuckDB refuses parameters a statement does not use
            return self._remember(sql, params, cur.execute(sql, {k: v for k, v in values.items() if k in used}).df())
        finally:
            cur.close()

    @contextmanager
    def remembering(self) -> Iterator[None]:
        """Inside this block, this thread's reads with the same statement and parameters are answered once: one
        evaluation or report asks some questions several times (who holds which GPUs, the hours covered), and at
        1,000 GPUs each answer costs a tenth of a second. The answers are the block's snapshot; each caller gets
        its own copy. Nested blocks share the outer one's."""
        if getattr(self._memo, "answers", None) is not None:
            yield
            return
        self._memo.answers = {}
        try:
            yield
        finally:
            self._memo.answers = None

    def remembered(self, key: tuple, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        """`compute()`, answered once per `key` inside a remembering() block (outside one: every time), for an
        analysis built from several reads that one evaluation asks for more than once (a service table)."""
        answers = getattr(self._memo, "answers", None)
        if answers is None:
            return compute()
        if ("computed", key) not in answers:
            answers[("computed", key)] = compute()
        return answers[("computed", key)].copy()

    def _remembered(self, sql: str, params: Any) -> pd.DataFrame | None:
        answers = getattr(self._memo, "answers", None)
        if answers is None:
            return None
        found = answers.get((sql, repr(params)))
        return found.copy() if found is not None else None

    def _remember(self, sql: str, params: Any, answer: pd.DataFrame) -> pd.DataFrame:
        answers = getattr(self._memo, "answers", None)
        if answers is not None:
            answers[(sql, repr(params))] = answer.copy()
        return answer

    @property
    def idle_util_pct(self) -> float:
        """The utilisation under which the rollups count an allocated sample as idle."""
        return float(self.rollup_params()["idle_pct"])

    def refold_late(self, cur: duckdb.DuckDBPyConnection, table: pa.Table) -> None:
        """Inside the transaction that stored `table`: rebuild, from the samples, the minute and hour rollups of
        every node and minute it touched that were already folded, so rollups always equal their samples."""
        if self._fold_state is None:  # read once per fold: a query per commit cost steady-state ingest ~20%
            self._fold_state = self.rollup_params(cur)
        state = self._fold_state
        mwm, hwm = state["mwm"], state["hwm"]
        if mwm == NEG_INF:
            return
        late = table.select(["node", "ts"]).filter(pc.less(table["ts"], pa.scalar(mwm, table.schema.field("ts").type)))
        if not late.num_rows:
            return
        spans = late.group_by("node", use_threads=False).aggregate([("ts", "min"), ("ts", "max")])
        for node, first, last in zip(*(spans[c].to_pylist() for c in ("node", "ts_min", "ts_max"))):
            lo, hi = floor_minute(first), min(floor_minute(last) + timedelta(minutes=1), mwm)
            args = {"lo": lo, "hi": hi, "node": node, "idle_pct": state["idle_pct"]}
            cur.execute(rollups.DROP_MINUTES, {k: args[k] for k in ("lo", "hi", "node")})
            cur.execute(rollups.FOLD_MINUTES, args)
            # a late reading can also be the "previous" of events up to the lookback after it
            events = {"lo": lo, "hi": min(hi + timedelta(minutes=health.LOOKBACK_MIN), mwm), "node": node}
            cur.execute(health.DROP, events)
            cur.execute(health.FOLD, events)
            claims = {**dra_claims.hours(lo, hi, mwm), "node": node}
            cur.execute(dra_claims.DROP, claims)
            cur.execute(dra_claims.FOLD, claims)
            if lo < hwm:
                hours = {"lo": floor_hour(lo), "hi": min(floor_hour(hi - timedelta(microseconds=1))
                                                         + timedelta(hours=1), hwm), "node": node}
                cur.execute(rollups.DROP_HOURS, hours)
                cur.execute(rollups.FOLD_HOURS, hours)

    def fold(self, until: datetime | None = None, progress: Callable[[datetime, datetime], None] | None = None,
             budget_s: float | None = None) -> int:
        """Fold closed minutes (up to `until`, by default the newest sample less the grace time) into the minute
        rollups and closed hours into the hour rollups; returns minutes folded.

        A backlog (a first fold, a crash part-way, a large import, agents draining an outage) is folded in steps,
        each its own transaction sized to about FOLD_STEP_S of work: the chunk of time a step covers adapts to the
        time the last one took, so no step holds the writer (and the ingest behind it) for long, and a crash loses
        at most the step under way (the watermark moves with each commit). With `budget_s`, folding stops after
        the step that passes it and the rest waits for the next call (`fold_if_due` calls again at once)."""
        marks = self.latest_sample_ts()
        if not marks:
            return 0
        latest = max(marks.values())
        until = floor_minute(until or min(utc_now(), latest) - timedelta(seconds=rollups.FOLD_GRACE_S))
        state = self.rollup_params()
        start = state["mwm"]
        if start == NEG_INF:
            start = floor_minute(self.scalar("SELECT min(ts) FROM samples"))
        folded, began = 0, time.perf_counter()
        while start < until:
            stop = min(start + self._fold_chunk, until)
            step_began = time.perf_counter()
            with self.transaction() as cur:
                state = self.rollup_params(cur)
                cur.execute(rollups.FOLD_MINUTES, {"lo": start, "hi": stop, "node": None,
                                                   "idle_pct": state["idle_pct"]})
                cur.execute(health.FOLD, {"lo": start, "hi": stop, "node": None})
                claims = {**dra_claims.hours(start, stop, stop), "node": None}
                cur.execute(dra_claims.DROP, claims)
                cur.execute(dra_claims.FOLD, claims)
                hour_from = state["hwm"] if state["hwm"] != NEG_INF else floor_hour(start)
                hour_to = floor_hour(stop)
                if hour_to > hour_from:
                    cur.execute(rollups.FOLD_HOURS, {"lo": hour_from, "hi": hour_to, "node": None})
                self._fold_state = None  # under the write lock: the next transaction reads the new marks
                cur.execute("UPDATE rollup_state SET minute_wm = $m, hour_wm = $h",
                            {"m": stop, "h": max(hour_to, hour_from)})
            took = max(time.perf_counter() - step_began, 1e-3)
            minutes = (stop - start).total_seconds() / 60
            folded += int(minutes)
            ROLLUP_FOLD_RATE.set(minutes / took)
            # the next step's chunk: scaled to the time budget, at most 4x larger or smaller at a time
            scale = min(4.0, max(0.25, FOLD_STEP_S / took))
            self._fold_chunk = min(FOLD_CHUNK, max(FOLD_MIN_CHUNK, timedelta(minutes=round(minutes * scale))))
            start = stop
            ROLLUP_WATERMARK.set(stop.timestamp())
            ROLLUP_BEHIND.set(max(0.0, (latest - stop).total_seconds()))
            if progress:
                progress(stop, until)
            if budget_s is not None and time.perf_counter() - began >= budget_s and start < until:
                log.info("folding a backlog: folded to %s, %.0f minutes behind the newest sample, %.0f minutes "
                         "per second", stop.isoformat(), (latest - stop).total_seconds() / 60, minutes / took)
                break
        if folded:
            ROLLUP_FOLD_SECONDS.observe(time.perf_counter() - began)
        self._behind = start < until
        self._folded_at = time.monotonic()
        return folded

    def fold_if_due(self) -> int:
        """Fold when the last fold is over FOLD_EVERY_S old, or at once while a backlog is left (writers call this
        after commits and when idle); one call folds about FOLD_STEP_S of work, so ingest is never held longer."""
        if not self._behind and time.monotonic() - self._folded_at < FOLD_EVERY_S:
            return 0
        self._folded_at = time.monotonic()  # also after a failure: the next try is a period later
        try:
            return self.fold(budget_s=FOLD_STEP_S)  # it says whether it left a backlog (`_behind`)
        except BaseException:
            self._behind = False  # retried a period later, not in a tight loop
            raise

    @property
    def fold_behind(self) -> bool:
        """A bounded fold left minutes to fold: the next `fold_if_due` folds at once."""
        return self._behind

    def newest_sample(self) -> datetime | None:
        """The newest sample instant: from the marks a writer keeps in memory (no scan), or asked of the store by
        a read-only one, whose marks another process moves."""
        if self.read_only:
            return self.latest_ts()
        return max(self.latest_sample_ts().values(), default=None)

    def fold_lag(self) -> tuple[datetime | None, timedelta | None]:
        """(folded until, how far that is behind the newest sample), from the marks kept in memory and the one-row
        state table: constant cost, for health checks that must answer while a backlog is folded. (None, None)
        for an empty store; the lag is the whole history before a first fold."""
        latest = self.newest_sample()
        if latest is None:
            return None, None
        mwm = self.rollup_params()["mwm"]
        if mwm == NEG_INF:
            first = self.scalar("SELECT min(ts) FROM samples")
            return None, latest - first
        return mwm, max(timedelta(0), latest - mwm)

    def note_backlog(self) -> None:
        """A writer taking over the store: a backlog over CATCH_UP_LAG is folded from its first idle moment on, in
        FOLD_STEP_S steps, and reads say they are catching up meanwhile (`fold_behind`)."""
        self._behind = self.catching_up()

    def catching_up(self) -> bool:
        """Behind the newest sample by more than CATCH_UP_LAG: a backlog is being folded."""
        lag = self.fold_lag()[1]
        return lag is not None and lag > CATCH_UP_LAG

    def folding_backlog(self) -> bool:
        """A bounded fold left minutes behind and the store is catching up: what analytic reads (the API's, the
        scheduled advice refresh) wait for, since each would aggregate every unfolded raw sample."""
        return self.fold_behind and self.catching_up()

    def rebuild_rollups(self, idle_util_pct: float | None = None) -> int:
        """Rebuild the rollups from the raw samples still kept (with a new idle threshold, when given); rollups
        older than the oldest raw sample stay as they were built. Returns minutes folded."""
        with self.transaction() as cur:
            first = cur.execute("SELECT min(ts) FROM samples").fetchone()[0]
            self._fold_state = None
            if idle_util_pct is not None:
                cur.execute("UPDATE rollup_state SET idle_util_pct = ?", [idle_util_pct])
            if first is not None:
                lo = floor_hour(first)
                cur.execute("DELETE FROM usage_minute WHERE bucket >= ?", [lo])
                cur.execute("DELETE FROM usage_hour WHERE bucket >= ?", [lo])
                cur.execute("DELETE FROM health_events WHERE ts >= ?", [lo])
                cur.execute("DELETE FROM dra_claim_hours WHERE bucket >= ?", [lo])
                cur.execute("UPDATE rollup_state SET minute_wm = $lo, hour_wm = CASE WHEN hour_wm IS NULL THEN NULL "
                            "ELSE least(hour_wm, $lo) END", {"lo": lo})
        return self.fold()

    def use_idle_threshold(self, idle_util_pct: float) -> int:
        """Make the rollups count idle as the site config says; rebuilds them when the threshold changed."""
        if self.idle_util_pct == idle_util_pct:
            return 0
        if self.read_only:  # the writer rebuilds; until then analytics say which threshold the rollups hold
            log.warning("the rollups count idle under %g%%, the config says %g%%: the writing server rebuilds them",
                        self.idle_util_pct, idle_util_pct)
            return 0
        log.warning("idle threshold changed from %g%% to %g%%: rebuilding the rollups from the raw samples kept",
                    self.idle_util_pct, idle_util_pct)
        return self.rebuild_rollups(idle_util_pct)

    def retain(self, now: datetime | None = None, retention: Retention | None = None) -> dict[str, int]:
        """Drop raw samples (and process rows) older than the retention, but only once folded, and minute rollups
        older than theirs once rolled into hours. Returns rows dropped per table."""
        retention = retention or self.retention
        now = now or utc_now()
        self.fold()
        dropped = {}
        with self.transaction() as cur:
            state = self.rollup_params(cur)
            raw_cut = min(now - timedelta(days=retention.raw_days), state["mwm"])
            minute_cut = min(now - timedelta(days=retention.minute_days), state["hwm"])
            # inference servers' own figures are kept as long as the minute rollups: their rates and quantiles
            # are read from them directly (analytics/inference.py)
            app_cut = floor_hour(now - timedelta(days=retention.minute_days))  # app_hour keeps whole hours
            for table, column, cut in (("samples", "ts", raw_cut), ("processes", "ts", raw_cut),
                                       ("usage_minute", "bucket", minute_cut), ("app_samples", "ts", app_cut),
                                       ("app_series", "ts", app_cut), ("app_hour", "hour", app_cut)):
                cur.execute(f"DELETE FROM {table} WHERE {column} < ?", [cut])
                dropped[table] = int(cur.fetchone()[0])
        for table, rows in dropped.items():
            RETENTION_ROWS_DROPPED.labels(table=table).inc(rows)
        if any(dropped.values()):
            self._latest = None  # a node whose samples were all dropped has no newest sample any more
        return dropped

    def append_fragmentation(self, rows: pd.DataFrame) -> int:
        """Per-node fragmentation at one instant (analytics/fragmentation.py records it)."""
        return self._insert("fragmentation_history", rows)

    def record_topology(self, topology: NodeTopology, at: datetime) -> bool:
        """A node's GPU topology as of `at`, kept when it changed (analytics/store/topology.py)."""
        return topology_tables.record_topology(self, topology, at)

    def append_processes(self, table: pa.Table) -> int:
        return self._insert("processes", conform(table, PROCESS_SCHEMA))

    def upsert_jobs(self, jobs: pd.DataFrame) -> int:
        """Job records (the simulator's, a trace's); a record without a workload class gets the inferred one
        (collector/jobs/classes.py infer_class) with its rule."""
        if len(jobs) and "workload_class" not in jobs:
            jobs = jobs.copy()
            classes = [infer_class(*(None if pd.isna(v) else v for v in values)) for values in zip(
                *(jobs[c] if c in jobs else [None] * len(jobs) for c in ("name", "partition", "qos")))]
            jobs["workload_class"] = [c for c, _ in classes]
            jobs["class_rule"] = [f for _, f in classes]
        return self._insert("jobs", jobs, replace=True)

    def record_jobs(self, jobs: pd.DataFrame, events: pd.DataFrame) -> int:
        """Jobs a lifecycle source read (collector/jobs), replacing the stored rows of the same ids, and their
        events, replacing what that source said of those jobs before (the events read off a job's instants; a
        `restarted` event seen between reads is kept): one transaction, so a job's row and its history always
        agree. Returns the jobs stored."""
        if not len(jobs):
            return 0
        with self.transaction() as cur:
            cur.register("incoming_jobs", jobs)
            self._replace_rows(cur, "jobs", "incoming_jobs")
            cur.execute("DELETE FROM job_events WHERE job_id IN (SELECT job_id FROM incoming_jobs) "
                        "AND source IN (SELECT DISTINCT source FROM incoming_jobs) "
                        "AND event IN (SELECT unnest($derived))", {"derived": list(DERIVED_EVENTS)})
            cur.unregister("incoming_jobs")
            if len(events):
                cur.register("incoming_events", events)
                cur.execute("INSERT INTO job_events BY NAME SELECT * FROM incoming_events")
                cur.unregister("incoming_events")
        return len(jobs)

    def record_restarts(self, jobs: pd.DataFrame, at: datetime, source: str) -> int:
        """A `restarted` event at `at` for each restart a read shows beyond the count stored (before the read's
        jobs replace theirs): how restarts get a time. Returns the restarts recorded."""
        if not len(jobs) or "restarts" not in jobs:
            return 0
        seen = jobs[["job_id", "restarts"]].dropna()
        if seen.empty:
            return 0
        with self.transaction() as cur:
            cur.register("seen_restarts", seen)
            grown = cur.execute("""SELECT s.job_id, s.restarts - j.restarts AS more FROM seen_restarts s
                                   JOIN jobs j USING (job_id) WHERE s.restarts > j.restarts""").df()
            cur.unregister("seen_restarts")
            if len(grown):
                rows = pd.DataFrame({"job_id": [j for j, n in zip(grown["job_id"], grown["more"])
                                                for _ in range(int(n))], "ts": at, "event": "restarted",
                                     "source": source})
                rows["detail"] = None
                cur.register("restart_events", rows)
                cur.execute("INSERT INTO job_events BY NAME SELECT * FROM restart_events")
                cur.unregister("restart_events")
        return int(grown["more"].sum()) if len(grown) else 0

    def close_left_queue(self, source: str, seen: Sequence[str], at: datetime, state: str) -> int:
        """Jobs of `source` stored as pending or running that a queue snapshot taken at `at` no longer lists:
        marked `state` (collector/jobs/lifecycle.py LEFT_QUEUE) and ended at `at`, so they stop counting as
        queued demand; returns how many. Their outcome comes with the next history read (sacct)."""
        where = ("WHERE source = $source AND state IN ('pending', 'running') "
                 "AND job_id NOT IN (SELECT unnest($seen::VARCHAR[]))")
        with self.transaction() as cur:
            gone = cur.execute(f"SELECT count(*) FROM jobs {where}", {"source": source, "seen": list(seen)}
                               ).fetchone()[0]
            cur.execute(f"UPDATE jobs SET state = $state, end_ts = $at {where}",
                        {"state": state, "at": at, "source": source, "seen": list(seen)})
        return int(gone)

    def record_queue_metrics(self, rows: pd.DataFrame) -> int:
        """What a scheduler said of its queues (collector/jobs/queues.py), replacing the rows of the same
        scheduler at the same instants: reading a page twice stores it once. Returns the rows stored."""
        return self._replace_read("queue_metrics", "scheduler", rows)

    def record_app_samples(self, rows: pd.DataFrame) -> int:
        """What inference servers reported (collector/apps, analytics/inference.py), replacing the rows of the same
        target at the same instants: a page read twice is stored once. Each row keeps its series (app_series), the
        read before it in that series and the increase since (schema APP_INCREASE): counted from the series' newest
        read when the page is newer, else (a late page, a re-read) by counting its targets' series again. Returns
        the rows stored."""
        if not len(rows):
            return 0
        same = " AND ".join(f"i.{c} IS NOT DISTINCT FROM l.{c}" for c in APP_SERIES)
        with self.transaction() as cur:
            cur.register("incoming_app_rows", rows)
            # the instants' bounds as constants, so only the row groups that hold them are read
            replaced = ("ts BETWEEN $lo AND $hi AND (target, ts) IN (SELECT DISTINCT target, ts FROM "
                        "incoming_app_rows)")
            bounds = {"lo": rows["ts"].min(), "hi": rows["ts"].max()}
            cur.execute("CREATE OR REPLACE TEMP TABLE app_touched AS SELECT DISTINCT series_id, utc_hour(ts) AS hour "
                        f"FROM app_samples WHERE {replaced}", bounds)  # the hours a re-read changes
            cur.execute(f"DELETE FROM app_samples WHERE {replaced}", bounds)
            late = cur.execute(f"SELECT count(*) FROM incoming_app_rows i JOIN app_series l ON {same} "
                               "AND l.ts >= i.ts").fetchone()[0]
            if late:
                cur.execute("INSERT INTO app_samples BY NAME SELECT * FROM incoming_app_rows")
                self._recount_app_series(cur, sorted({str(t) for t in rows["target"].unique()}))
            else:
                cur.execute(f"""
                    CREATE OR REPLACE TEMP TABLE app_counted AS
                    SELECT * EXCLUDE (prev_value, newest) REPLACE ({APP_INCREASE} AS increase) FROM (
                        SELECT *, lag(ts) OVER w AS prev_ts, lag(value) OVER w AS prev_value, NULL::DOUBLE AS increase
                        FROM (SELECT {", ".join(APP_SERIES)}, ts, value, true AS newest FROM app_series
                              WHERE target IN (SELECT DISTINCT target FROM incoming_app_rows)
                              UNION ALL BY NAME SELECT *, false AS newest FROM incoming_app_rows)
                        WINDOW w AS (PARTITION BY {", ".join(APP_SERIES)} ORDER BY ts))
                    WHERE NOT newest""")
                self._store_counted(cur)
            cur.unregister("incoming_app_rows")
        return len(rows)

    def _count_old_app_rows(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Once, for a store from before schema 13: its app rows' series, steps and hours (about 8 s per million
        rows on two cores; said in the log, since the server starts serving only after it)."""
        rows = cur.execute("SELECT count(*) FROM app_samples").fetchone()[0]
        if rows:
            log.info("counting the counter steps of %d inference-server rows once (store from before schema 13)",
                     rows)
        self._recount_app_series(cur, None)

    def _recount_app_series(self, cur: duckdb.DuckDBPyConnection, targets: list[str] | None) -> None:
        """Count every app row's series, previous read and increase again, for `targets` (None: all of them):
        after a late page, and once for a store from before schema 13."""
        where = "WHERE target IN (SELECT unnest($targets))" if targets is not None else ""
        params = {"targets": targets} if targets is not None else {}
        cur.execute("CREATE TEMP TABLE IF NOT EXISTS app_touched (series_id BIGINT, hour TIMESTAMPTZ)")
        cur.execute(f"INSERT INTO app_touched SELECT DISTINCT series_id, utc_hour(ts) FROM app_samples {where}", params)
        cur.execute(f"""
            CREATE OR REPLACE TEMP TABLE app_counted AS
            SELECT * EXCLUDE (prev_value, series_id) REPLACE ({APP_INCREASE} AS increase) FROM (
                SELECT * REPLACE (lag(ts) OVER w AS prev_ts), lag(value) OVER w AS prev_value FROM app_samples {where}
                WINDOW w AS (PARTITION BY {", ".join(APP_SERIES)} ORDER BY ts))
            ORDER BY ts""", params)
        cur.execute(f"DELETE FROM app_samples {where}", params)
        cur.execute(f"DELETE FROM app_series {where}", params)
        self._store_counted(cur)

    def _store_counted(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Store the counted rows of temp table app_counted: each series (APP_SERIES_ID) found in app_series or
        given the next id, its newest read kept there, and the rows with their series' id in app_samples."""
        identity = ", ".join(APP_SERIES_ID)
        same = " AND ".join(f"n.{c} IS NOT DISTINCT FROM s.{c}" for c in APP_SERIES_ID)
        series = cur.execute(f"""
            WITH n AS (SELECT {identity}, max(ts) AS ts, arg_max(value, ts) AS value FROM app_counted GROUP BY ALL)
            SELECT coalesce(s.series_id, (SELECT coalesce(max(series_id), 0) FROM app_series)
                            + row_number() OVER (PARTITION BY s.series_id IS NULL ORDER BY n.target, n.ts))
                       AS series_id,
                   n.* REPLACE (greatest(n.ts, s.ts) AS ts,
                                CASE WHEN s.ts > n.ts THEN s.value ELSE n.value END AS value),
                   s.series_id IS NOT NULL AS known
            FROM n LEFT JOIN app_series s ON {same}""").df()
        cur.register("counted_series", series)
        cur.execute("DELETE FROM app_series WHERE series_id IN (SELECT series_id FROM counted_series WHERE known)")
        cur.execute("INSERT INTO app_series BY NAME SELECT * EXCLUDE (known) FROM counted_series")
        same = " AND ".join(f"c.{col} IS NOT DISTINCT FROM s.{col}" for col in APP_SERIES_ID)
        cur.execute(f"CREATE OR REPLACE TEMP TABLE app_stored AS SELECT c.*, s.series_id FROM app_counted c "
                    f"JOIN counted_series s ON {same} ORDER BY c.ts")
        cur.unregister("counted_series")
        cur.execute("INSERT INTO app_samples BY NAME SELECT * FROM app_stored")
        # every hour of a series that gained or lost a row is folded again from its rows
        cur.execute("INSERT INTO app_touched SELECT DISTINCT series_id, utc_hour(ts) FROM app_stored")
        cur.execute("DELETE FROM app_hour WHERE (series_id, hour) IN (SELECT series_id, hour FROM app_touched)")
        cur.execute(APP_HOUR_FOLD, {"since": cur.execute("SELECT min(hour) FROM app_touched").fetchone()[0]})
        for table in ("app_counted", "app_stored", "app_touched"):
            cur.execute(f"DROP TABLE {table}")

    def _replace_read(self, table: str, source: str, rows: pd.DataFrame) -> int:
        """Store one read's rows in `table`, replacing those of the same `source` column value at the same instants
        (`table` and `source` are this class's own names, never input): one transaction. Returns the rows stored."""
        if not len(rows):
            return 0
        with self.transaction() as cur:
            cur.register("incoming_read_rows", rows)
            cur.execute(f"DELETE FROM {table} WHERE ({source}, ts) IN "
                        f"(SELECT DISTINCT {source}, ts FROM incoming_read_rows)")
            cur.execute(f"INSERT INTO {table} BY NAME SELECT * FROM incoming_read_rows")
            cur.unregister("incoming_read_rows")
        return len(rows)

    def upsert_teams(self, teams: pd.DataFrame) -> int:
        """Teams with share, quota_gpus and (optionally) parent; a team already stored is replaced."""
        columns = [c for c in ("team", "share", "quota_gpus", "parent") if c in teams]
        return self._insert("teams", teams[columns], replace=True)

    def set_team_quotas(self, quotas: pd.DataFrame) -> int:
        """Replace the stated guarantee and limit per GPU model of the teams in `quotas`
        (columns team, gpu_model, guarantee_gpus, limit_gpus)."""
        with self.transaction() as cur:
            cur.execute("DELETE FROM team_quotas WHERE team IN (SELECT unnest($teams))",
                        {"teams": sorted(set(quotas["team"]))})
            if len(quotas):
                cur.register("incoming_quotas", quotas[["team", "gpu_model", "guarantee_gpus", "limit_gpus"]])
                cur.execute("INSERT INTO team_quotas BY NAME SELECT * FROM incoming_quotas")
                cur.unregister("incoming_quotas")
        return len(quotas)

    def add_recommendations(self, rows: pd.DataFrame) -> int:
        """Store new recommendations (columns of the recommendations table; action and evidence as JSON text)."""
        return self._insert("recommendations", rows)

    def set_recommendation_status(self, ids: Sequence[str], status: str, by: str | None = None,
                                  at: datetime | None = None, note: str | None = None,
                                  cur: duckdb.DuckDBPyConnection | None = None) -> int:
        """Record a status change (a decision, or superseded) for the given recommendations; returns rows changed.
        `cur`: a transaction of the caller's (a decision commits with its audit entry), else one of its own."""
        if not ids:
            return 0
        if cur is None:
            with self.transaction() as own:
                return self.set_recommendation_status(ids, status, by, at, note, own)
        cur.execute("""UPDATE recommendations SET status = $status, decided_by = $by, decided_at = $at,
                           note = coalesce($note, note)
                       WHERE id IN (SELECT unnest($ids))""",
                    {"status": status, "by": by, "at": at, "note": note, "ids": list(ids)})
        return int(cur.fetchone()[0])

    def set_rates(self, rates: Mapping[str, float], dated: Sequence[tuple] = (),
                  basis: Mapping[tuple, str] | None = None,
                  pools: Sequence[PoolRule] | None = None) -> list[RateChange]:
        """Replace the rate card: `rates` in force since ever (the config's [rates]) and the `dated` rows
        (model, start, rate[, variant]; start None: since ever) from their starts, each with the workings of the
        cost model that derived it (`basis`, keyed by model, start (None: undated)[, variant]); and, given, the
        node pool rules. Refused whole (ClosedPeriodError) where it would re-price a closed period; returns what it
        re-prices of open time."""
        rows = [(m, SINCE_EVER, float(v), BASE) for m, v in rates.items()] + [
            (r[0], r[1] or SINCE_EVER, float(r[2]), r[3] if len(r) > 3 else BASE) for r in dated]
        keyed = {(k[0], k[1] or SINCE_EVER, k[2] if len(k) > 2 else BASE): text for k, text in (basis or {}).items()}
        with self.transaction() as cur:
            if pools is not None:
                replace_pools(cur, pools)
            return replace_card(cur, rows, keyed)

    def set_node_labels(self, labels: Mapping[str, Mapping[str, str]], at: datetime) -> None:
        """The newest labels of each node given (kube-state-metrics' kube_node_labels), replacing its older ones:
        what a node pool rule naming a label reads."""
        if not labels:
            return
        with self.transaction() as cur:
            topology_tables.record_label_changes(cur, labels, at)  # their history (a clique, a rack moved)
            cur.execute("DELETE FROM node_labels WHERE node IN (SELECT unnest($nodes))", {"nodes": list(labels)})
            cur.executemany("INSERT INTO node_labels VALUES (?, ?, ?, ?)",
                            [[node, k, v, at] for node, kv in labels.items() for k, v in kv.items()])

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as cur:
            self._set_meta(cur, key, value)

    # --- reads --------------------------------------------------------------------------
    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> pd.DataFrame:
        remembered = self._remembered(sql, params)
        if remembered is not None:
            return remembered
        cur = self._cursor()
        try:
            return self._remember(sql, params, cur.execute(sql, params or []).df())
        finally:
            cur.close()

    def scalar(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> Any:
        cur = self._cursor()
        try:
            row = cur.execute(sql, params or []).fetchone()
            return row[0] if row else None
        finally:
            cur.close()

    def sample_count(self, start: datetime | None = None, end: datetime | None = None) -> int:
        """Samples taken (within [start, end) floored to the minute, when given), counted from the rollups, so
        samples retention has dropped still count. The whole store's count adds the rollups' counts to a plain
        count of the unfolded raw rows, so it stays cheap (a health check) while a backlog is unfolded."""
        if start is None and end is None:
            return int(self.query_usage(
                "SELECT (SELECT coalesce(sum(samples), 0) FROM usage_hour WHERE bucket < $hwm)"
                " + (SELECT coalesce(sum(samples), 0) FROM usage_minute WHERE bucket >= $hwm AND bucket < $mwm)"
                " + (SELECT count(*) FROM samples WHERE ts >= $mwm) AS n", {})["n"].iloc[0])
        frame = self.query_usage("SELECT coalesce(sum(samples), 0) AS n FROM usage_between($start, $end, $fine, $mwm, "
                                 "$hwm, $idle_pct)", {"start": start or NEG_INF, "end": end or POS_INF})
        return int(frame["n"].iloc[0])

    def span_of(self, source: str) -> tuple[datetime | None, datetime | None]:
        """The oldest and newest sample of a source (an imported trace: `trace:openb`)."""
        row = self.query("SELECT min(ts) AS lo, max(ts) AS hi FROM samples WHERE source = $source",
                         {"source": source}).iloc[0]
        return (None if pd.isna(row["lo"]) else row["lo"].to_pydatetime(),
                None if pd.isna(row["hi"]) else row["hi"].to_pydatetime())

    def latest_ts_of(self, source: str) -> datetime | None:
        """The newest sample a source (the `source` column: nvml, dcgm, prometheus, ...) stored; where it resumes."""
        return self.span_of(source)[1]

    def latest_ts(self, before: datetime | None = None) -> datetime | None:
        """The newest sample instant (before `before`, when given); None for an empty store."""
        return self.scalar("SELECT max(ts) FROM samples WHERE $before IS NULL OR ts < $before", {"before": before})

    def team_table(self) -> pd.DataFrame:
        """The configured teams: share and current quota (GPUs), as the site config set them."""
        return self.query("SELECT team, share, quota_gpus, parent FROM teams ORDER BY team")

    def teams(self) -> list[str]:
        """Every team that has a share or has used a GPU, 'unattributed' included when it appears."""
        frame = self.query(
            "SELECT team FROM teams UNION SELECT DISTINCT team FROM usage_hour WHERE team IS NOT NULL "
            "UNION SELECT DISTINCT team FROM usage_minute WHERE team IS NOT NULL AND bucket >= $hwm "
            "UNION SELECT DISTINCT team FROM samples WHERE team IS NOT NULL AND ts >= $mwm ORDER BY 1",
            {k: v for k, v in self.rollup_params().items() if k in ("mwm", "hwm")})
        return frame["team"].tolist()

    def team_quotas(self) -> pd.DataFrame:
        """The stated guarantee and limit per team and GPU model."""
        return self.query("SELECT team, gpu_model, guarantee_gpus, limit_gpus FROM team_quotas ORDER BY team, gpu_model")

    def recommendations(self, statuses: Sequence[str] | None = None, team: str | None = None,
                        ids: Sequence[str] | None = None, limit: int | None = None) -> pd.DataFrame:
        """Stored recommendations, newest first, optionally narrowed by status, team or id."""
        return self.query(
            """SELECT * FROM recommendations
               WHERE ($statuses IS NULL OR list_contains($statuses, status)) AND ($team IS NULL OR team = $team)
                 AND ($ids IS NULL OR list_contains($ids, id))
               ORDER BY created DESC, id LIMIT coalesce($limit, 1000000)""",
            {"statuses": list(statuses) if statuses is not None else None, "team": team,
             "ids": list(ids) if ids is not None else None, "limit": limit})

    def rate_card(self, at: datetime | None = None) -> pd.DataFrame:
        """The rates in force at `at` (default now), one per GPU model, with the start of each
        (`effective_from`; SINCE_EVER for an undated rate): what advice about the future is priced at. The model's
        own rates: a node pool's or profile's are in `rate_history`."""
        return self.query("""SELECT gpu_model, arg_max(usd_per_gpu_hour, effective_from) AS usd_per_gpu_hour,
                                    max(effective_from) AS effective_from
                             FROM rate_versions WHERE effective_from <= $at AND variant = '' GROUP BY 1 ORDER BY 1""",
                          {"at": at or utc_now()})

    def current_rates(self) -> dict[str, float]:
        """GPU model -> USD per GPU-hour in force now."""
        card = self.rate_card()
        return dict(zip(card["gpu_model"], card["usd_per_gpu_hour"].astype(float)))

    def rate_history(self) -> pd.DataFrame:
        """Every version of every rate (a model's own, a node pool's, a MIG profile's: `variant`), oldest first,
        with the start of the next (`until`; null: open)."""
        return self.query("""SELECT gpu_model, variant, effective_from, lead(effective_from) OVER (
                                        PARTITION BY gpu_model, variant ORDER BY effective_from) AS until,
                                    usd_per_gpu_hour, rate_card_version(effective_from, variant) AS rate_card, basis
                             FROM rate_versions ORDER BY gpu_model, variant, effective_from""")

    def node_pools(self) -> pd.DataFrame:
        """Each node the rollups or labels know with its pool (null: none), as pricing resolves it."""
        return self.query("""SELECT node, pool_of(node) AS pool FROM (
                                 SELECT DISTINCT node FROM usage_hour UNION SELECT DISTINCT node FROM usage_minute
                                 UNION SELECT node FROM node_labels) WHERE node IS NOT NULL ORDER BY 1""")

    def nodes(self) -> pd.DataFrame:
        """Agents that pushed batches: last seen, interval, batches and rows stored."""
        return self.query("SELECT node, last_seen, interval_s, batches, rows FROM nodes ORDER BY node")

    def meta(self, key: str) -> str | None:
        return self.scalar("SELECT value FROM meta WHERE key = ?", [key])

    @staticmethod
    def peek_meta(path: str | Path, key: str) -> str | None:
        """A meta value of a database file without opening it for writing; None when the file has no such key
        (or no meta table at all). Raises StoreError when the file cannot be opened as a DuckDB database."""
        try:
            con = duckdb.connect(str(path), read_only=True)
        except duckdb.Error as exc:
            raise StoreError(f"{path} exists and cannot be opened ({exc})") from exc
        try:
            row = con.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        except duckdb.Error:
            row = None
        finally:
            con.close()
        return row[0] if row else None
