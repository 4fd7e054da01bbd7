"""The DuckDB store: one file, one writer, bulk Arrow appends.

DuckDB lets one process write a database file, so the process that owns a Store (the
server or the demo) is the only writer; other readers go through its HTTP API. Within
the process, each call takes its own cursor, so the API's threads can read while the
collector thread appends.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import duckdb
import pandas as pd
import pyarrow as pa

from analytics.schema import DDL, SCHEMA_VERSION, column_migrations
from collector.samples import PROCESS_SCHEMA, SAMPLE_SCHEMA
from collector.self_metrics import BATCHES_WRITTEN, ROWS_WRITTEN


class StoreError(RuntimeError):
    pass


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


class Store:
    def __init__(self, path: str | Path, read_only: bool = False) -> None:
        self.path = str(path)
        if not read_only:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._con = duckdb.connect(self.path, read_only=read_only)
        except duckdb.IOException as exc:
            raise StoreError(f"cannot open {self.path}: {exc} (is another gpuledger server writing to it?)") from exc
        self._write_lock = threading.Lock()
        if not read_only:
            with self._write_lock:
                for statement in DDL:
                    self._con.execute(statement)
                columns = {row[0] for row in self._con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = 'samples'").fetchall()}
                for statement in column_migrations(columns):
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

    def append_samples(self, table: pa.Table) -> int:
        rows = self._insert("samples", conform(table, SAMPLE_SCHEMA))
        if rows:
            BATCHES_WRITTEN.inc()
            ROWS_WRITTEN.inc(rows)
        return rows

    def append_processes(self, table: pa.Table) -> int:
        return self._insert("processes", conform(table, PROCESS_SCHEMA))

    def upsert_jobs(self, jobs: pd.DataFrame) -> int:
        return self._insert("jobs", jobs, replace=True)

    def upsert_teams(self, teams: pd.DataFrame) -> int:
        return self._insert("teams", teams[["team", "share", "quota_gpus"]], replace=True)

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

    def scalar(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        cur = self._con.cursor()
        try:
            row = cur.execute(sql, params or []).fetchone()
            return row[0] if row else None
        finally:
            cur.close()

    def sample_count(self) -> int:
        return int(self.scalar("SELECT count(*) FROM samples"))

    def teams(self) -> list[str]:
        """Every team that has a share or has used a GPU, 'unattributed' included when it appears."""
        frame = self.query(
            "SELECT team FROM teams UNION SELECT DISTINCT team FROM samples WHERE team IS NOT NULL ORDER BY 1")
        return frame["team"].tolist()

