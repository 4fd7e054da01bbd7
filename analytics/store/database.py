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
import threading
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import duckdb
import pandas as pd
import pyarrow as pa

from gpuledger.analytics.store.metrics import BATCHES_WRITTEN, CHECKPOINT_SECONDS, ROW_RATE, ROWS_WRITTEN
from gpuledger.analytics.store.schema import DDL, QUERY_LAYER, SCHEMA_VERSION, column_migrations, table_migrations
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import GpuledgerError
from gpuledger.collector.samples import PROCESS_SCHEMA, SAMPLE_SCHEMA

log = logging.getLogger(__name__)


class StoreError(GpuledgerError):
    """The database cannot be opened or does not hold what was asked for."""


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Reorder and cast a batch to the store's schema; a missing or uncastable column is a clear error."""
    present = set(table.column_names)
    missing = [name for name in schema.names if name not in present]
    if missing:
        raise StoreError(f"batch is missing column(s) {missing}")
    table = table.select(schema.names)
    if table.schema.equals(schema):
        return table  # the common case (our own agents); a cast costs a compute call per column
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise StoreError(f"batch does not match the sample schema: {exc}") from exc


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


def wal_bytes(db_path: str | Path) -> int:
    """Size of a DuckDB file's write-ahead log (0 when there is none); readable while another process writes."""
    try:
        return os.path.getsize(f"{db_path}.wal")
    except OSError:
        return 0


class Store:
    def __init__(self, path: str | Path, read_only: bool = False, threads: int | None = None) -> None:
        """`threads`: DuckDB worker threads; by default all cores but one for a writer, DuckDB's own for a reader."""
        self.path = str(path)
        if not read_only:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            settings: dict[str, str | int] = {} if read_only else {"checkpoint_threshold": WAL_CAP,
                                                                   "max_vacuum_tasks": 0}
            threads = threads or (None if read_only else default_threads())
            if threads:
                settings["threads"] = threads
            self._con = duckdb.connect(self.path, read_only=read_only, config=settings)
        except duckdb.IOException as exc:
            held = "lock" in str(exc).lower()
            raise StoreError(f"cannot open {self.path}: {exc}"
                             + (" (is another gpuledger server writing to it?)" if held else "")) from exc
        self._write_lock = threading.Lock()
        self._latest: dict[str, datetime] | None = None  # newest sample per node, loaded on first use
        self._compacted_at = time.monotonic()
        if not read_only:
            with self._write_lock:
                tables = {row[0] for row in self._con.execute(
                    "SELECT table_name FROM information_schema.tables").fetchall()}
                self._con.execute("BEGIN TRANSACTION")
                for statement in table_migrations(tables) + DDL:
                    self._con.execute(statement)
                self._con.execute("COMMIT")
                columns = {row[0] for row in self._con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = 'samples'").fetchall()}
                for statement in column_migrations(columns) + QUERY_LAYER:
                    self._con.execute(statement)
                self._con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [SCHEMA_VERSION])

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
        verb = "INSERT OR REPLACE INTO" if replace else "INSERT INTO"
        with self._write_lock:
            cur = self._con.cursor()
            try:
                cur.register("incoming_batch", batch)
                cur.execute(f"{verb} {table_name} BY NAME SELECT * FROM incoming_batch")
            finally:
                cur.close()
        return len(batch)

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor inside BEGIN/COMMIT holding the write lock; any exception rolls everything back."""
        with self._write_lock:
            cur = self._con.cursor()
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

        Once a day the checkpoint also compacts row groups. Every group commit leaves a partial row
        group, and DuckDB's vacuum merges neighbours at each checkpoint; after an hour-long backlog
        drain that took ~4 s (rewriting a million rows), stalling ingest at what should be a quiet
        moment. Samples are append-only, so nothing is lost by merging them once a day instead.
        """
        compact = time.monotonic() - self._compacted_at >= COMPACT_EVERY_S
        if self.wal_bytes() < min_wal_bytes and not compact:
            return False
        with self._write_lock:
            cur = self._con.cursor()
            try:
                started = time.perf_counter()
                if compact:
                    cur.execute(f"SET max_vacuum_tasks = {VACUUM_TASKS}")
                    cur.execute("INSERT OR REPLACE INTO meta VALUES ('compacted_at', ?)", [str(utc_now())])
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
            reader = cur or self._con.cursor()
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
        table = conform(table, SAMPLE_SCHEMA)
        with self._write_lock:
            self.note_latest(table)
        rows = self._insert("samples", table)
        if rows:
            BATCHES_WRITTEN.inc()
            ROWS_WRITTEN.inc(rows)
            ROW_RATE.add(rows)
        return rows

    def append_processes(self, table: pa.Table) -> int:
        return self._insert("processes", conform(table, PROCESS_SCHEMA))

    def upsert_jobs(self, jobs: pd.DataFrame) -> int:
        return self._insert("jobs", jobs, replace=True)

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
                                  at: datetime | None = None, note: str | None = None) -> int:
        """Record a status change (a decision, or superseded) for the given recommendations; returns rows changed."""
        if not ids:
            return 0
        with self.transaction() as cur:
            cur.execute("""UPDATE recommendations SET status = $status, decided_by = $by, decided_at = $at,
                               note = coalesce($note, note)
                           WHERE id IN (SELECT unnest($ids))""",
                        {"status": status, "by": by, "at": at, "note": note, "ids": list(ids)})
            return int(cur.fetchone()[0])

    def set_rates(self, rates: Mapping[str, float]) -> int:
        frame = pd.DataFrame({"gpu_model": list(rates), "usd_per_gpu_hour": [float(v) for v in rates.values()]})
        return self._insert("rate_card", frame, replace=True)

    def set_meta(self, key: str, value: str) -> None:
        with self._write_lock:
            self._con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])

    # --- reads --------------------------------------------------------------------------
    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> pd.DataFrame:
        cur = self._con.cursor()
        try:
            return cur.execute(sql, params or []).df()
        finally:
            cur.close()

    def scalar(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> Any:
        cur = self._con.cursor()
        try:
            row = cur.execute(sql, params or []).fetchone()
            return row[0] if row else None
        finally:
            cur.close()

    def sample_count(self, start: datetime | None = None, end: datetime | None = None) -> int:
        """Samples stored (within [start, end) when given)."""
        return int(self.scalar("SELECT count(*) FROM samples WHERE ($start IS NULL OR ts >= $start) "
                               "AND ($end IS NULL OR ts < $end)", {"start": start, "end": end}))

    def latest_ts(self, before: datetime | None = None) -> datetime | None:
        """The newest sample instant (before `before`, when given); None for an empty store."""
        return self.scalar("SELECT max(ts) FROM samples WHERE $before IS NULL OR ts < $before", {"before": before})

    def team_table(self) -> pd.DataFrame:
        """The configured teams: share and current quota (GPUs), as the site config set them."""
        return self.query("SELECT team, share, quota_gpus, parent FROM teams ORDER BY team")

    def teams(self) -> list[str]:
        """Every team that has a share or has used a GPU, 'unattributed' included when it appears."""
        frame = self.query(
            "SELECT team FROM teams UNION SELECT DISTINCT team FROM samples WHERE team IS NOT NULL ORDER BY 1")
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

    def rate_card(self) -> pd.DataFrame:
        return self.query("SELECT gpu_model, usd_per_gpu_hour FROM rate_card ORDER BY gpu_model")

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
