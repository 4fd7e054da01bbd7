"""Central ingest: exactly-once batches from many agents, committed in groups.

Every batch carries (node, stream, seq). Its samples and its id are committed in one DuckDB
transaction, so a batch the agent resends after a lost acknowledgement is recognised and
acknowledged again without being stored twice. Concurrent batches are queued to one
writer thread that commits whatever has gathered in a single transaction (group commit):
DuckDB pays its per-insert cost once per group, not once per node.

Rows are validated first: missing keys, timestamps too far in the future or past, and
samples already stored (same node, GPU, MIG instance and instant) are refused and counted
by reason; NaN/Inf values become NULL and are counted. Nothing is dropped silently.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc

from analytics.store import Store, StoreError, conform
from collector.samples import SAMPLE_SCHEMA
from collector.self_metrics import (BATCHES_WRITTEN, INGEST_COMMIT_SECONDS, INGEST_DUPLICATE_BATCHES,
                                    INGEST_ROWS_PER_SECOND, INGEST_ROWS_REJECTED, INGEST_VALUES_NULLED,
                                    NODE_LAST_SUCCESS, ROWS_WRITTEN)

log = logging.getLogger(__name__)
FLOAT_COLUMNS = [f.name for f in SAMPLE_SCHEMA if pa.types.is_floating(f.type)]


class InvalidBatch(ValueError):
    """The batch cannot be stored at all (wrong schema): the agent must not resend it."""


@dataclass
class IngestResult:
    status: str  # "stored" | "duplicate"
    rows: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    nulled_values: int = 0


@dataclass
class _Pending:
    node: str
    stream: str
    seq: int
    interval_s: float
    table: pa.Table
    rejected: Counter
    nulled: int
    future: Future = field(default_factory=Future)


def clean_batch(table: pa.Table, node: str, now: datetime, max_future: timedelta,
                max_age: timedelta) -> tuple[pa.Table, Counter, int]:
    """Conform to the schema, stamp the node, refuse unusable rows and null out NaN/Inf values."""
    try:
        table = conform(table, SAMPLE_SCHEMA)
    except StoreError as exc:
        raise InvalidBatch(str(exc)) from exc
    rejected: Counter = Counter()
    table = table.set_column(table.schema.get_field_index("node"), "node",
                             pa.array([node] * table.num_rows, pa.string()))
    checks = [
        ("missing_key", pc.or_(pc.is_null(table["ts"]), pc.is_null(table["gpu_uuid"]))),
        ("future_ts", pc.greater(table["ts"], pa.scalar(now + max_future, table.schema.field("ts").type))),
        ("stale_ts", pc.less(table["ts"], pa.scalar(now - max_age, table.schema.field("ts").type))),
        ("bad_interval", pc.invert(pc.greater(table["interval_s"], 0.0))),
    ]
    keep = pa.array([True] * table.num_rows)
    for reason, bad in checks:
        bad = pc.and_(pc.fill_null(bad, reason == "bad_interval"), keep)
        count = pc.sum(bad).as_py() or 0
        if count:
            rejected[reason] += count
            keep = pc.and_(keep, pc.invert(bad))
    table = table.filter(keep)
    nulled = 0
    for name in FLOAT_COLUMNS:
        column = table[name]
        bad = pc.fill_null(pc.invert(pc.is_finite(column)), False)
        count = pc.sum(bad).as_py() or 0
        if count:
            nulled += count
            table = table.set_column(table.schema.get_field_index(name), name,
                                     pc.if_else(bad, pa.scalar(None, pa.float64()), column))
    return table, rejected, nulled


class IngestWriter:
    def __init__(self, store: Store, max_future_s: float = 300.0, max_age_days: float = 30.0,
                 max_group: int = 256) -> None:
        self.store = store
        self.max_future = timedelta(seconds=max_future_s)
        self.max_age = timedelta(days=max_age_days)
        self.max_group = max_group
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._recent: deque[tuple[float, int]] = deque()
        self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
        self._thread.start()

    def submit(self, node: str, stream: str, seq: int, interval_s: float, table: pa.Table,
               timeout_s: float = 120.0) -> IngestResult:
        now = datetime.now(timezone.utc)
        cleaned, rejected, nulled = clean_batch(table, node, now, self.max_future, self.max_age)
        pending = _Pending(node, stream, seq, interval_s, cleaned, rejected, nulled)
        self._queue.put(pending)
        return pending.future.result(timeout=timeout_s)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            group = [first]
            while len(group) < self.max_group:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                group.append(item)
            try:
                results = self._commit(group)
            except Exception as exc:  # nothing of the group was stored; every agent will retry
                log.exception("ingest commit of %d batch(es) failed", len(group))
                for item in group:
                    item.future.set_exception(exc)
                continue
            for item, result in zip(group, results):
                item.future.set_result(result)

    def _commit(self, group: list[_Pending]) -> list[IngestResult]:
        started = time.perf_counter()
        now = datetime.now(timezone.utc)
        results: list[IngestResult | None] = [None] * len(group)
        with self.store.transaction() as cur:
            ids = pa.table({"node": [g.node for g in group], "stream": [g.stream for g in group],
                            "seq": pa.array([g.seq for g in group], pa.int64())})
            cur.register("incoming_ids", ids)
            known = set(cur.execute("SELECT node, stream, seq FROM ingest_batches JOIN incoming_ids "
                                    "USING (node, stream, seq)").fetchall())
            cur.unregister("incoming_ids")
            fresh: list[int] = []
            for i, item in enumerate(group):
                key = (item.node, item.stream, item.seq)
                if key in known:
                    results[i] = IngestResult("duplicate")
                    INGEST_DUPLICATE_BATCHES.inc()
                else:
                    known.add(key)
                    fresh.append(i)
            stored = self._insert_samples(cur, group, fresh) if fresh else {}
            batch_rows, node_rows = [], {}
            for i in fresh:
                item = group[i]
                rows = stored.get(i, 0)
                duplicates = item.table.num_rows - rows
                if duplicates:
                    item.rejected["duplicate_sample"] += duplicates
                results[i] = IngestResult("stored", rows, dict(item.rejected), item.nulled)
                batch_rows.append((item.node, item.stream, item.seq, rows, sum(item.rejected.values()), now))
                total = node_rows.setdefault(item.node, [0, 0, item.interval_s])
                total[0] += 1
                total[1] += rows
                total[2] = item.interval_s
            if batch_rows:
                cur.executemany("INSERT INTO ingest_batches VALUES (?, ?, ?, ?, ?, ?)", batch_rows)
                cur.executemany(
                    "INSERT INTO nodes VALUES (?, ?, ?, ?, ?) ON CONFLICT (node) DO UPDATE SET "
                    "last_seen = excluded.last_seen, interval_s = excluded.interval_s, "
                    "batches = nodes.batches + excluded.batches, rows = nodes.rows + excluded.rows",
                    [(node, now, iv, b, r) for node, (b, r, iv) in node_rows.items()])
        self._account(group, results, fresh, now, time.perf_counter() - started)
        return results  # type: ignore[return-value]

    @staticmethod
    def _insert_samples(cur, group: list[_Pending], fresh: list[int]) -> dict[int, int]:
        """Insert the fresh batches' samples minus ones already stored; returns rows stored per batch."""
        tables = [group[i].table.append_column("_req", pa.array([i] * group[i].table.num_rows, pa.int32()))
                  for i in fresh]
        incoming = pa.concat_tables(tables)
        if incoming.num_rows == 0:
            return {}
        lo, hi = pc.min(incoming["ts"]).as_py(), pc.max(incoming["ts"]).as_py()
        cur.register("incoming_batch", incoming)
        cur.execute("""
            CREATE OR REPLACE TEMP TABLE ingest_dedup AS
            SELECT b.* FROM (
                SELECT DISTINCT ON (node, gpu_uuid, coalesce(mig_instance, -1), ts) *
                FROM incoming_batch ORDER BY node, gpu_uuid, coalesce(mig_instance, -1), ts, _req
            ) b
            WHERE NOT EXISTS (
                SELECT 1 FROM samples s
                WHERE s.ts BETWEEN ? AND ? AND s.ts = b.ts AND s.node = b.node AND s.gpu_uuid = b.gpu_uuid
                  AND coalesce(s.mig_instance, -1) = coalesce(b.mig_instance, -1))""", [lo, hi])
        cur.unregister("incoming_batch")
        cur.execute("INSERT INTO samples BY NAME SELECT * EXCLUDE (_req) FROM ingest_dedup")
        counts = dict(cur.execute("SELECT _req, count(*) FROM ingest_dedup GROUP BY _req").fetchall())
        cur.execute("DROP TABLE ingest_dedup")
        return counts

    def _account(self, group: list[_Pending], results: list, fresh: list[int], now: datetime,
                 seconds: float) -> None:
        INGEST_COMMIT_SECONDS.observe(seconds)
        stored = 0
        for i in fresh:
            item, result = group[i], results[i]
            stored += result.rows
            NODE_LAST_SUCCESS.labels(node=item.node).set(now.timestamp())
            for reason, count in result.rejected.items():
                INGEST_ROWS_REJECTED.labels(reason=reason).inc(count)
            if item.nulled:
                INGEST_VALUES_NULLED.inc(item.nulled)
            if result.rejected or item.nulled:
                log.warning("batch %s/%s/%d: stored %d row(s), rejected %s, %d NaN/Inf value(s) stored as NULL",
                            item.node, item.stream[:8], item.seq, result.rows, dict(result.rejected) or "none",
                            item.nulled)
        if stored:
            BATCHES_WRITTEN.inc(len(fresh))
            ROWS_WRITTEN.inc(stored)
        clock = time.monotonic()
        self._recent.append((clock, stored))
        while self._recent and self._recent[0][0] < clock - 60:
            self._recent.popleft()
        span = max(clock - self._recent[0][0], 1.0)
        INGEST_ROWS_PER_SECOND.set(sum(r for _, r in self._recent) / span)
