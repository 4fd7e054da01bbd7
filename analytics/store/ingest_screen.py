"""Row checks for central ingest that need nothing from the store, so they can run ahead of the writer.

A request body is checked for shape when it arrives (`prepare`); the rows of a whole group
of requests are then screened together (`screen_group`): missing keys, timestamps too far
in the future or past, and bad intervals are refused and counted by reason; NaN/Inf values
become NULL and are counted; a sample repeated within the group is kept once. What depends
on the store (batches already stored, samples already stored) is the writer's business.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuledger.analytics.store.database import StoreError, conform
from gpuledger.collector.samples import SAMPLE_SCHEMA
from gpuledger.collector.wire import SEQ

FLOAT_COLUMNS = [f.name for f in SAMPLE_SCHEMA if pa.types.is_floating(f.type)]
KEY = ["node", "gpu_uuid", "mig_instance", "ts"]
BATCH = "_batch"  # the row's batch, numbered across a whole group


class InvalidBatch(ValueError):
    """The body cannot be stored at all (wrong schema, bad _seq): the agent must not resend it."""


@dataclass
class IngestRequest:
    """One request body: `count` consecutive batches of one agent stream."""
    node: str
    stream: str
    first_seq: int
    count: int
    interval_s: float
    table: pa.Table  # sample schema plus _seq
    future: Future = field(default_factory=Future)

    @property
    def key(self) -> tuple[str, str]:
        return self.node, self.stream


@dataclass
class ScreenedGroup:
    """A group of requests with every batch numbered 0..count-1 across the group."""
    requests: list[IngestRequest]
    base: list[int]  # number of each request's first batch
    count: int
    received: np.ndarray  # rows per batch as sent
    rows: pa.Table  # usable rows, each key once, with a _batch column
    rejected: dict[int, dict[str, int]]  # refused rows per batch and reason
    nulled: np.ndarray  # NaN/Inf values stored as NULL, per batch
    now: datetime


def prepare(table: pa.Table, node: str, first_seq: int, count: int) -> pa.Table:
    """Schema check, node stamp and _seq check for one request body, in the request's thread.

    A one-batch body may omit `_seq`; a multi-batch body must give every row a `_seq` within
    first_seq .. first_seq + count - 1.
    """
    if SEQ in table.column_names:
        seqs = table[SEQ]
        if seqs.null_count or not pa.types.is_integer(seqs.type):
            raise InvalidBatch("_seq must be a non-null integer column")
        if table.num_rows:
            bounds = pc.min_max(seqs).as_py()
            if bounds["min"] < first_seq or bounds["max"] > first_seq + count - 1:
                raise InvalidBatch(f"_seq values outside the announced {first_seq}..{first_seq + count - 1}")
        seqs = seqs.cast(pa.int64())
    elif count == 1:
        seqs = pa.array(np.full(table.num_rows, first_seq, np.int64))
    else:
        raise InvalidBatch(f"{count} batches announced but the body has no _seq column")
    try:
        table = conform(table, SAMPLE_SCHEMA)
    except StoreError as exc:
        raise InvalidBatch(str(exc)) from exc
    table = table.set_column(table.schema.get_field_index("node"), "node",
                             pa.repeat(pa.scalar(node, pa.string()), table.num_rows))
    return table.append_column(SEQ, seqs)


def _flat(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def counts_per_batch(batch_of_row: pa.Array | pa.ChunkedArray | np.ndarray, batches: int) -> np.ndarray:
    values = batch_of_row if isinstance(batch_of_row, np.ndarray) else _flat(batch_of_row).to_numpy(
        zero_copy_only=False)
    return np.bincount(values, minlength=batches) if len(values) else np.zeros(batches, np.int64)


def check_rows(incoming: pa.Table, now: datetime, max_future: timedelta, max_age: timedelta
               ) -> tuple[pa.Table, dict[int, dict[str, int]], pa.Array | None]:
    """Refuse unusable rows (first reason wins) and null out NaN/Inf.

    Returns the usable rows, refused rows per batch and reason, and, when any value was
    NaN/Inf, the batch number of each nulled value (None otherwise: the usual case).
    """
    ts_type = incoming.schema.field("ts").type
    conditions = [
        ("missing_key", pc.or_(pc.is_null(incoming["ts"]), pc.is_null(incoming["gpu_uuid"])), False),
        ("future_ts", pc.greater(incoming["ts"], pa.scalar(now + max_future, ts_type)), False),
        ("stale_ts", pc.less(incoming["ts"], pa.scalar(now - max_age, ts_type)), False),
        ("bad_interval", pc.invert(pc.greater(incoming["interval_s"], 0.0)), True),
    ]
    flags = [_flat(pc.fill_null(c, null_is)) for _, c, null_is in conditions]
    rejected: dict[int, dict[str, int]] = {}
    usable = incoming
    if pc.any(pc.or_(pc.or_(flags[0], flags[1]), pc.or_(flags[2], flags[3]))).as_py():
        reason = pc.case_when(pa.StructArray.from_arrays(flags, names=[name for name, _, _ in conditions]),
                              *[pa.scalar(name) for name, _, _ in conditions])
        refused = pa.table({BATCH: incoming[BATCH], "reason": reason}).filter(pc.is_valid(reason))
        counts = refused.group_by([BATCH, "reason"]).aggregate([("reason", "count")])
        for batch, why, count in zip(counts[BATCH].to_pylist(), counts["reason"].to_pylist(),
                                     counts["reason_count"].to_pylist()):
            rejected.setdefault(batch, {})[why] = count
        usable = incoming.filter(pc.is_null(reason))
    nulled: list[pa.Array] = []
    for name in FLOAT_COLUMNS:
        column = usable[name]
        bad = pc.fill_null(pc.invert(pc.is_finite(column)), False)
        if pc.any(bad).as_py():
            nulled.append(_flat(usable[BATCH].filter(bad)))
            usable = usable.set_column(usable.schema.get_field_index(name), name,
                                       pc.if_else(bad, pa.scalar(None, pa.float64()), column))
    return usable, rejected, pa.concat_arrays(nulled) if nulled else None


def first_of_each_key(table: pa.Table) -> pa.Table:
    """One row per (node, GPU, MIG instance, instant): the first, in group order."""
    numbered = table.append_column("_row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    firsts = numbered.group_by(KEY, use_threads=False).aggregate([("_row", "min")])["_row_min"]
    if len(firsts) == table.num_rows:
        return table  # no key repeats within the group: the usual case, and no reordering needed
    return table.take(pa.array(np.sort(_flat(firsts).to_numpy())))  # first rows, in their original order


def screen_group(requests: list[IngestRequest], now: datetime, max_future: timedelta,
                 max_age: timedelta) -> ScreenedGroup:
    base = np.cumsum([0] + [r.count for r in requests[:-1]]).tolist()
    count = base[-1] + requests[-1].count
    incoming = pa.concat_tables([r.table for r in requests])
    if incoming.num_rows < 4096 * incoming[SEQ].num_chunks:
        incoming = incoming.combine_chunks()  # DuckDB scans a table of many tiny Arrow chunks ~40x slower
    # batch number across the group = the request's first batch number + (seq - first seq)
    shift = np.repeat([b - r.first_seq for r, b in zip(requests, base)], [r.table.num_rows for r in requests])
    batch_of_row = incoming[SEQ].to_numpy() + shift
    incoming = incoming.drop_columns([SEQ]).append_column(BATCH, pa.array(batch_of_row))
    usable, rejected, nulled_batches = check_rows(incoming, now, max_future, max_age)
    nulled = counts_per_batch(nulled_batches, count) if nulled_batches is not None else np.zeros(count, np.int64)
    return ScreenedGroup(requests, base, count, counts_per_batch(batch_of_row, count),
                         first_of_each_key(usable) if usable.num_rows else usable, rejected, nulled, now)
