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
from collections import deque
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


def split_batches(table: pa.Table, first_seq: int, count: int) -> list[tuple[int, pa.Table]]:
    """A multi-batch body carries each row's batch in a `_seq` column; one-batch bodies have none."""
    if "_seq" not in table.column_names:
        if count != 1:
            raise InvalidBatch(f"{count} batches announced but the body has no _seq column")
        return [(first_seq, table)]
    seqs = table["_seq"]
    wanted = pa.array(range(first_seq, first_seq + count), pa.int64())
    if pc.any(pc.invert(pc.is_in(seqs, value_set=wanted))).as_py():
        raise InvalidBatch(f"_seq values outside the announced {first_seq}..{first_seq + count - 1}")
    body = table.drop_columns(["_seq"])
    return [(seq, body.filter(pc.equal(seqs, seq))) for seq in range(first_seq, first_seq + count)]


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
    future: Future = field(default_factory=Future)


def conform_batch(table: pa.Table, node: str) -> pa.Table:
    """Schema check and node stamp, in the request thread; row checks happen once per group (check_rows)."""
    try:
        table = conform(table, SAMPLE_SCHEMA)
    except StoreError as exc:
        raise InvalidBatch(str(exc)) from exc
    return table.set_column(table.schema.get_field_index("node"), "node",
                            pa.array([node] * table.num_rows, pa.string()))


KEY = ["node", "gpu_uuid", "mig_instance", "ts"]


def _per_batch(table: pa.Table, column: str, agg: str) -> dict:
    """{_req: aggregate of column} over a table with a _req column."""
    if table.num_rows == 0:
        return {}
    grouped = table.group_by("_req").aggregate([(column, agg)])
    return dict(zip(grouped["_req"].to_pylist(), grouped[f"{column}_{agg}"].to_pylist()))


def _flat(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def check_rows(incoming: pa.Table, now: datetime, max_future: timedelta, max_age: timedelta
               ) -> tuple[pa.Table, dict[int, dict[str, int]], dict[int, int]]:
    """Refuse unusable rows (first reason wins) and null out NaN/Inf, once for a whole group.

    Returns the usable rows, refused rows per batch and reason, and nulled values per batch.
    """
    ts_type = incoming.schema.field("ts").type
    conditions = [
        ("missing_key", pc.or_(pc.is_null(incoming["ts"]), pc.is_null(incoming["gpu_uuid"])), False),
        ("future_ts", pc.greater(incoming["ts"], pa.scalar(now + max_future, ts_type)), False),
        ("stale_ts", pc.less(incoming["ts"], pa.scalar(now - max_age, ts_type)), False),
        ("bad_interval", pc.invert(pc.greater(incoming["interval_s"], 0.0)), True),
    ]
    reason = pc.case_when(
        pa.StructArray.from_arrays([_flat(pc.fill_null(c, null_is)) for _, c, null_is in conditions],
                                   names=[name for name, _, _ in conditions]),
        *[pa.scalar(name) for name, _, _ in conditions])
    refused = pa.table({"_req": incoming["_req"], "reason": reason}).filter(pc.is_valid(reason))
    rejected: dict[int, dict[str, int]] = {}
    if refused.num_rows:
        counts = refused.group_by(["_req", "reason"]).aggregate([("reason", "count")])
        for req, why, count in zip(counts["_req"].to_pylist(), counts["reason"].to_pylist(),
                                   counts["reason_count"].to_pylist()):
            rejected.setdefault(req, {})[why] = count
    usable = incoming.filter(pc.is_null(reason))
    nonfinite = pa.array([0] * usable.num_rows, pa.int64())
    for name in FLOAT_COLUMNS:
        column = usable[name]
        bad = pc.fill_null(pc.invert(pc.is_finite(column)), False)
        if pc.any(bad).as_py():
            nonfinite = pc.add(nonfinite, pc.cast(bad, pa.int64()))
            usable = usable.set_column(usable.schema.get_field_index(name), name,
                                       pc.if_else(bad, pa.scalar(None, pa.float64()), column))
    nulled = {k: v for k, v in _per_batch(pa.table({"_req": usable["_req"], "n": nonfinite}), "n", "sum").items()
              if v}
    return usable, rejected, nulled


def first_of_each_key(table: pa.Table) -> pa.Table:
    """One row per (node, GPU, MIG instance, instant): the one from the earliest batch of the group."""
    numbered = table.append_column("_row", pa.array(range(table.num_rows), pa.int64()))
    firsts = numbered.group_by(KEY, use_threads=False).aggregate([("_row", "min")])["_row_min"]
    return table.take(firsts)


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
        return self.submit_many(node, stream, [(seq, table)], interval_s, timeout_s)[0]

    def submit_many(self, node: str, stream: str, batches: list[tuple[int, pa.Table]], interval_s: float,
                    timeout_s: float = 120.0) -> list[IngestResult]:
        """Several batches of one agent (a spool backlog) in one request; each keeps its own id and result."""
        pending = [_Pending(node, stream, seq, interval_s, conform_batch(table, node)) for seq, table in batches]
        for item in pending:  # queued back to back so they usually share one commit
            self._queue.put(item)
        return [item.future.result(timeout=timeout_s) for item in pending]

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
            ids = pa.table({"_req": pa.array(range(len(group)), pa.int32()),
                            "node": [g.node for g in group], "stream": [g.stream for g in group],
                            "seq": pa.array([g.seq for g in group], pa.int64()),
                            "interval_s": pa.array([g.interval_s for g in group], pa.float64())})
            cur.register("incoming_ids", ids)
            known = set(cur.execute("SELECT node, stream, seq FROM ingest_batches JOIN incoming_ids "
                                    "USING (node, stream, seq)").fetchall())
            fresh: list[int] = []
            for i, item in enumerate(group):
                key = (item.node, item.stream, item.seq)
                if key in known:
                    results[i] = IngestResult("duplicate")
                    INGEST_DUPLICATE_BATCHES.inc()
                else:
                    known.add(key)
                    fresh.append(i)
            if fresh:
                stored, rejected, nulled = self._insert_samples(cur, group, fresh, now)
                for i in fresh:
                    rows = stored.get(i, 0)
                    reasons = rejected.get(i, {})
                    duplicates = group[i].table.num_rows - rows - sum(reasons.values())
                    if duplicates:
                        reasons["duplicate_sample"] = duplicates
                    results[i] = IngestResult("stored", rows, reasons, nulled.get(i, 0))
                outcome = pa.table({"_req": pa.array(fresh, pa.int32()),
                                    "rows": pa.array([results[i].rows for i in fresh], pa.int32()),
                                    "rejected": pa.array([sum(results[i].rejected.values()) for i in fresh],
                                                         pa.int32())})
                cur.register("incoming_outcome", outcome)
                cur.execute("""INSERT INTO ingest_batches
                               SELECT i.node, i.stream, i.seq, o.rows, o.rejected, ?
                               FROM incoming_ids i JOIN incoming_outcome o USING (_req)""", [now])
                cur.execute("""INSERT INTO nodes
                               SELECT i.node, ?, arg_max(i.interval_s, i._req), count(*), sum(o.rows)
                               FROM incoming_ids i JOIN incoming_outcome o USING (_req) GROUP BY i.node
                               ON CONFLICT (node) DO UPDATE SET last_seen = excluded.last_seen,
                                   interval_s = excluded.interval_s, batches = nodes.batches + excluded.batches,
                                   rows = nodes.rows + excluded.rows""", [now])
                cur.unregister("incoming_outcome")
            cur.unregister("incoming_ids")
        self._account(group, results, fresh, now, time.perf_counter() - started)
        return results  # type: ignore[return-value]

    def _insert_samples(self, cur, group: list[_Pending], fresh: list[int], now: datetime
                        ) -> tuple[dict[int, int], dict[int, dict[str, int]], dict[int, int]]:
        """Check, deduplicate and insert the fresh batches' rows: checks in Arrow, two statements in DuckDB.

        Returns rows stored, rows refused by reason, and NaN/Inf values nulled, per batch index.
        """
        tables = [group[i].table.append_column("_req", pa.array([i] * group[i].table.num_rows, pa.int32()))
                  for i in fresh]
        # one contiguous chunk: DuckDB scans a table of many tiny Arrow chunks ~40x slower
        incoming = pa.concat_tables(tables).combine_chunks()
        usable, rejected, nulled = check_rows(incoming, now, self.max_future, self.max_age)
        if usable.num_rows == 0:
            return {}, rejected, nulled
        unique = first_of_each_key(usable)
        keys = unique.select(KEY).append_column("_row", pa.array(range(unique.num_rows), pa.int64()))
        cur.register("incoming_keys", keys)
        stored_already = cur.execute("""
            SELECT k._row FROM incoming_keys k
            WHERE EXISTS (SELECT 1 FROM samples s
                          WHERE s.ts BETWEEN $lo AND $hi AND s.ts = k.ts AND s.node = k.node
                            AND s.gpu_uuid = k.gpu_uuid
                            AND coalesce(s.mig_instance, -1) = coalesce(k.mig_instance, -1))""",
                                     {"lo": pc.min(keys["ts"]).as_py(), "hi": pc.max(keys["ts"]).as_py()}
                                     ).fetchall()
        cur.unregister("incoming_keys")
        if stored_already:
            drop = pa.array([r[0] for r in stored_already], pa.int64())
            unique = unique.filter(pc.invert(pc.is_in(keys["_row"], value_set=drop)))
        cur.register("incoming_batch", unique.drop_columns(["_req"]))
        cur.execute("INSERT INTO samples BY NAME SELECT * FROM incoming_batch")
        cur.unregister("incoming_batch")
        return _per_batch(unique, "_req", "count"), rejected, nulled

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
            if result.nulled_values:
                INGEST_VALUES_NULLED.inc(result.nulled_values)
            if result.rejected or result.nulled_values:
                log.warning("batch %s/%s/%d: stored %d row(s), rejected %s, %d NaN/Inf value(s) stored as NULL",
                            item.node, item.stream[:8], item.seq, result.rows, dict(result.rejected) or "none",
                            result.nulled_values)
        if stored:
            BATCHES_WRITTEN.inc(len(fresh))
            ROWS_WRITTEN.inc(stored)
        clock = time.monotonic()
        self._recent.append((clock, stored))
        while self._recent and self._recent[0][0] < clock - 60:
            self._recent.popleft()
        span = max(clock - self._recent[0][0], 1.0)
        INGEST_ROWS_PER_SECOND.set(sum(r for _, r in self._recent) / span)
