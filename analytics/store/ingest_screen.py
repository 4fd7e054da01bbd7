"""Row checks for central ingest that need nothing from the store, so they can run ahead of the writer.

A request body is checked for shape when it arrives (`prepare`); the rows of a whole group
of requests are then screened together (`screen_group`): missing keys, timestamps too far
in the future or past, and bad intervals are refused and counted by reason; NaN/Inf values
become NULL and are counted; a sample repeated within the group is kept once. What depends
on the store (batches already stored, samples already stored, which node a GPU belongs to)
is the writer's business.

Why every value is bounded here: an agent's token lets it write rows that end up on teams'
bills. A row is a claim of `interval_s` seconds of `gpu_fraction` of a GPU, so both are held
to what a real sample can be (a part of one GPU, at most about the interval the request
declares); telemetry is held to physical ranges (a utilisation over 100%, a negative memory
reading or a 1e308 W power reading is no measurement, and summed into the rollups it turned
answers into infinities); names to the identifier rule (collector/identifiers.py), and the
bill's own buckets cannot be claimed. Each refusal is counted per batch and reason (the
answer's `rejected`, and `gpuledger_ingest_rows_rejected_total{reason}`), first reason wins.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuledger.analytics.store.database import StoreError, conform
from gpuledger.analytics.store.schema import READING_RANGES
from gpuledger.collector.gpu_catalog import UNKNOWN_MODEL
from gpuledger.collector.identifiers import SAMPLE_NAME_COLUMNS, invalid_mask
from gpuledger.collector.samples import IDLE_CAPACITY, SAMPLE_SCHEMA, UNATTRIBUTED
from gpuledger.collector.wire import SEQ
from gpuledger.collector.errors import InputError

FLOAT_COLUMNS = [f.name for f in SAMPLE_SCHEMA if pa.types.is_floating(f.type)]
# One GPU (or MIG instance) at one instant, as one holder has it. The holder is part of the key because a GPU
# shared by time-slicing (HAMi, DRA) is one row per pod at the same instant, each billed its part: keyed without
# it, the second pod was refused as a duplicate and never billed. A resent identical row still has the same key.
# Null holders (an idle GPU, nvml's one row per GPU) group together, as Arrow's and DuckDB's group-by do.
HOLDER = ["namespace", "pod", "container", "job_id"]
INSTANT = ["node", "gpu_uuid", "mig_instance", "ts"]  # a GPU (or MIG instance) at one instant, whoever holds it
KEY = [*INSTANT, *HOLDER]
BATCH = "_batch"  # the row's batch, numbered across a whole group

# --- the bounds of a row (docs/operations/security.md "what ingest refuses"; the writer's defaults are IngestWriter's) -------
# interval_s may exceed the interval the request declares by this factor plus this much (a late sampler thread,
# clock jitter); a row standing for more time than that would bill time nobody sampled
INTERVAL_SLACK_FACTOR = 2.0
INTERVAL_SLACK_S = 1.0
# inclusive physical ranges of the optional telemetry (schema.READING_RANGES, shared with the fold); a finite value
# outside is refused (`out_of_range`), NaN/Inf become NULL as before (a sensor that read nothing is not hostile)
RANGES = READING_RANGES
MEM_SLACK_MIB = 1.0  # used may exceed total by this much (the parts are rounded to MiB separately)
# how many GPUs one node may report in one batch: an 8-GPU HGX node is the common case, 64 leaves room for
# anything real (MIG instances share their GPU's UUID). IngestWriter(max_gpus_per_node=...) changes it.
MAX_GPUS_PER_NODE = 64
# the bill's buckets: no source writes IDLE_CAPACITY (unallocated rows have no team), and UNATTRIBUTED only on the
# sender's own allocated rows that no rule claims (collector/attribution.py)
RESERVED_TEAMS = (UNATTRIBUTED, IDLE_CAPACITY)


class InvalidBatch(InputError):
    """The body cannot be stored at all (wrong schema, bad _seq): the agent must not resend it (422)."""


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
    # the push's audit entry (an analytics.store.access.AuditEntry), committed with the request's batches
    audit: Any = None

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
    # each GPU each node sent, first sender first (columns gpu_uuid, node): what the writer checks against the
    # node each GPU belongs to, found here so the writer thread (ingest's bottleneck) need not group the rows
    gpus: pa.Table | None = None


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


def _any(mask: pa.Array | pa.ChunkedArray) -> bool:
    return bool(pc.any(mask).as_py())


# Names already found valid, per kind: the same nodes, GPUs, models and teams arrive in every batch, and matching
# a regex over a column costs a compile per call (12 columns: most of a small batch's screening). Cleared when
# it grows past NAMES_KEPT (a sender inventing names only makes the cache useless, never wrong).
NAMES_KEPT = 100_000
_valid_names: dict[str, set[str]] = {kind: set() for kind in SAMPLE_NAME_COLUMNS}


def _values_in(column: pa.Array | pa.ChunkedArray, kind: str) -> pa.Array | pa.ChunkedArray | None:
    """Where a name column holds a name that breaks its kind's rule; None when no value does (the usual case).

    The rule (identifiers.invalid_mask) runs over the column's distinct values not yet seen, not every row: a
    group of 200k rows holds a few hundred names, and they repeat from group to group."""
    known = _valid_names[kind]
    unseen = [v for v in pc.unique(column).to_pylist() if v is not None and v not in known]
    if not unseen:
        return None
    names = pa.array(unseen, pa.string())
    invalid = invalid_mask(kind, names)
    if len(known) + len(unseen) > NAMES_KEPT:
        known.clear()
    known.update(v for v, bad in zip(unseen, invalid.to_pylist()) if not bad)
    bad = names.filter(invalid)
    return pc.is_in(column, value_set=bad) if len(bad) else None


def _out_of_range(table: pa.Table) -> pa.Array | pa.ChunkedArray | None:
    """Finite telemetry outside its physical range (RANGES), or more memory used than the card has; None when
    no value is (found from each column's minimum and maximum, the usual case)."""
    bad = None
    for name, (lo, hi) in RANGES.items():
        column = table[name]
        if column.null_count == len(column):
            continue
        bounds = pc.min_max(column).as_py()  # NaN is skipped; +-Inf is not, and takes the full check below
        if bounds["min"] is None or (bounds["min"] >= lo and bounds["max"] <= hi):
            continue
        outside = pc.or_(pc.less(column, lo), pc.greater(column, hi))
        outside = pc.and_(outside, pc.is_finite(column))  # NaN/Inf: nulled below, not refused
        bad = outside if bad is None else pc.or_(bad, outside)
    over = pc.greater(table["mem_used_mib"], pc.add(table["mem_total_mib"], MEM_SLACK_MIB))
    if _any(over):
        bad = over if bad is None else pc.or_(bad, over)
    return None if bad is None else pc.fill_null(bad, False)


def _bad_names(table: pa.Table) -> pa.Array | pa.ChunkedArray | None:
    bad = None
    for name in SAMPLE_NAME_COLUMNS:
        found = _values_in(table[name], name)
        if found is not None:
            bad = found if bad is None else pc.or_(bad, found)
    return bad


def _reserved_team(table: pa.Table) -> pa.Array | pa.ChunkedArray | None:
    """A bill bucket named as a team: always for the idle-capacity bucket, for `unattributed` unless the row is
    the sender's own allocated, unclaimed usage (what sources write there)."""
    teams = pc.unique(table["team"])
    if not _any(pc.is_in(teams, value_set=pa.array(RESERVED_TEAMS))):
        return None
    idle = pc.equal(table["team"], IDLE_CAPACITY)
    unowned = pc.and_(pc.equal(table["team"], UNATTRIBUTED), pc.invert(pc.fill_null(table["allocated"], False)))
    return pc.fill_null(pc.or_(idle, unowned), False)


def check_rows(incoming: pa.Table, now: datetime, max_future: timedelta, max_age: timedelta,
               max_interval: pa.Array | np.ndarray | float | None = None
               ) -> tuple[pa.Table, dict[int, dict[str, int]], pa.Array | None]:
    """Refuse unusable rows (first reason wins) and null out NaN/Inf in the optional telemetry.

    `max_interval`: the longest interval_s each row may claim (per row, or one for all; by default only > 0 and
    finite). Returns the usable rows, refused rows per batch and reason, and, when any value was NaN/Inf, the
    batch number of each nulled value (None otherwise: the usual case). A NULL gpu_model is stored as "unknown":
    refusing the row would drop its GPU-hours from the bill, while "unknown" keeps them on it, unpriced until
    the rate card names it (cost.py reports them as `unpriced_gpu_hours`).
    """
    ts_type = incoming.schema.field("ts").type
    interval = incoming["interval_s"]
    fraction = incoming["gpu_fraction"]
    good_interval = pc.and_(pc.greater(interval, 0.0), pc.is_finite(interval))
    if max_interval is not None:
        limit = max_interval if isinstance(max_interval, float) else pa.array(max_interval, pa.float64())
        good_interval = pc.and_(good_interval, pc.less_equal(interval, limit))
    conditions = [
        ("missing_key", pc.or_(pc.is_null(incoming["ts"]), pc.is_null(incoming["gpu_uuid"])), False),
        ("future_ts", pc.greater(incoming["ts"], pa.scalar(now + max_future, ts_type)), False),
        ("stale_ts", pc.less(incoming["ts"], pa.scalar(now - max_age, ts_type)), False),
        ("bad_interval", pc.invert(good_interval), True),
        # a part of one GPU: more is another GPU's row, less than nothing no claim at all. Zero is kept: the DCGM
        # source's whole-GPU row of a card its MIG instances hold entirely bills nothing but carries its health
        ("bad_fraction", pc.invert(pc.and_(pc.greater_equal(fraction, 0.0), pc.less_equal(fraction, 1.0))), True),
        ("bad_name", _bad_names(incoming), False),
        ("reserved_team", _reserved_team(incoming), False),
        ("out_of_range", _out_of_range(incoming), False),
    ]
    conditions = [(name, c, null_is) for name, c, null_is in conditions if c is not None]
    flags = [_flat(pc.fill_null(c, null_is)) for _, c, null_is in conditions]
    rejected: dict[int, dict[str, int]] = {}
    usable = incoming
    anything = flags[0]
    for flag in flags[1:]:
        anything = pc.or_(anything, flag)
    if _any(anything):
        reason = pc.case_when(pa.StructArray.from_arrays(flags, names=[name for name, _, _ in conditions]),
                              *[pa.scalar(name) for name, _, _ in conditions])
        count_reasons(rejected, incoming[BATCH], reason)
        usable = incoming.filter(pc.is_null(reason))
    nulled: list[pa.Array] = []
    for name in FLOAT_COLUMNS:
        column = usable[name]
        bad = pc.fill_null(pc.invert(pc.is_finite(column)), False)
        if _any(bad):
            nulled.append(_flat(usable[BATCH].filter(bad)))
            usable = usable.set_column(usable.schema.get_field_index(name), name,
                                       pc.if_else(bad, pa.scalar(None, pa.float64()), column))
    if usable["gpu_model"].null_count:
        usable = usable.set_column(usable.schema.get_field_index("gpu_model"), "gpu_model",
                                   pc.fill_null(usable["gpu_model"], UNKNOWN_MODEL))
    return usable, rejected, pa.concat_arrays(nulled) if nulled else None


def count_reasons(rejected: dict[int, dict[str, int]], batch_of_row: pa.Array | pa.ChunkedArray,
                   reason: pa.Array | pa.ChunkedArray) -> None:
    """Add refused rows (a non-null reason) per batch and reason to `rejected`."""
    refused = pa.table({BATCH: batch_of_row, "reason": reason}).filter(pc.is_valid(reason))
    counts = refused.group_by([BATCH, "reason"]).aggregate([("reason", "count")])
    for batch, why, count in zip(counts[BATCH].to_pylist(), counts["reason"].to_pylist(),
                                 counts["reason_count"].to_pylist()):
        rejected.setdefault(batch, {})[why] = rejected.get(batch, {}).get(why, 0) + count


def gpus_of(rows: pa.Table) -> pa.Table:
    """Each distinct (GPU, node) of the rows, in the order of their first row."""
    numbered = rows.select(["gpu_uuid", "node"]).append_column(
        "_row", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    pairs = numbered.group_by(["gpu_uuid", "node"], use_threads=False).aggregate([("_row", "min")])
    return pairs.take(pc.sort_indices(pairs["_row_min"])).select(["gpu_uuid", "node"])


def too_many_gpus(rows: pa.Table, max_gpus: int, gpus: pa.Table) -> pa.Array | None:
    """Rows of GPUs past the first `max_gpus` distinct GPUs of their batch (in row order); None when no batch has
    that many (the usual case, found from each node's distinct GPUs in the whole group, `gpus`, which bound each
    of its batches')."""
    if not rows.num_rows:
        return None
    counts = gpus.group_by("node", use_threads=False).aggregate([("gpu_uuid", "count")])
    if pc.max(counts["gpu_uuid_count"]).as_py() <= max_gpus:
        return None
    numbered = rows.select([BATCH, "gpu_uuid"]).append_column(
        "_row", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    firsts = numbered.group_by([BATCH, "gpu_uuid"], use_threads=False).aggregate([("_row", "min")])
    order = pc.sort_indices(firsts, [(BATCH, "ascending"), ("_row_min", "ascending")])
    firsts = firsts.take(order)
    batches = _flat(firsts[BATCH]).to_numpy()
    starts = np.flatnonzero(np.r_[True, batches[1:] != batches[:-1]])
    rank = np.arange(len(batches)) - np.repeat(starts, np.diff(np.r_[starts, len(batches)]))
    excess = firsts.filter(pa.array(rank >= max_gpus))
    # a row is excess when its (batch, GPU) pair is: matched on a joint key, this path is rare
    key = pc.binary_join_element_wise(pc.cast(rows[BATCH], pa.string()), rows["gpu_uuid"], "\x1f")
    bad = pc.binary_join_element_wise(pc.cast(excess[BATCH], pa.string()), excess["gpu_uuid"], "\x1f")
    return _flat(pc.is_in(key, value_set=_flat(bad)))


def first_of_each_key(table: pa.Table) -> pa.Table:
    """One row per GPU, MIG instance, instant and holder: the first, in group order.

    Sharers of one GPU at one instant (a row per pod) keep their rows; when their parts add up to more than the
    whole GPU, each is scaled down in proportion (as the DCGM source does when pods' requests over-claim a card),
    so an instant of a GPU is never billed more than once over."""
    numbered = table.append_column("_row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    firsts = numbered.group_by(INSTANT, use_threads=False).aggregate([("_row", "min")])["_row_min"]
    if len(firsts) == table.num_rows:
        return table  # no GPU instant repeats within the group: the usual case, and no reordering needed
    firsts = numbered.group_by(KEY, use_threads=False).aggregate([("_row", "min")])["_row_min"]
    if len(firsts) < table.num_rows:
        table = table.take(pa.array(np.sort(_flat(firsts).to_numpy())))  # first rows, in their original order
    return _split_shared(table)


def _split_shared(table: pa.Table) -> pa.Table:
    """Scale the parts of the holders of one GPU instant down to 1.0 in all, where they claim more."""
    keyed = table.select(INSTANT[:2] + ["ts", "gpu_fraction"]).append_column(
        "_mig", pc.fill_null(table["mig_instance"], -1)).append_column(
        "_row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    parts = keyed.group_by(["node", "gpu_uuid", "_mig", "ts"], use_threads=False).aggregate([("gpu_fraction", "sum")])
    if pc.max(parts["gpu_fraction_sum"]).as_py() <= 1.0 + 1e-9:
        return table
    joined = keyed.join(parts, ["node", "gpu_uuid", "_mig", "ts"]).sort_by("_row")
    total = joined["gpu_fraction_sum"]
    scaled = pc.if_else(pc.greater(total, 1.0), pc.divide(joined["gpu_fraction"], total), joined["gpu_fraction"])
    return table.set_column(table.schema.get_field_index("gpu_fraction"), "gpu_fraction", _flat(scaled))


def screen_group(requests: list[IngestRequest], now: datetime, max_future: timedelta,
                 max_age: timedelta, max_gpus: int = MAX_GPUS_PER_NODE) -> ScreenedGroup:
    base = np.cumsum([0] + [r.count for r in requests[:-1]]).tolist()
    count = base[-1] + requests[-1].count
    incoming = pa.concat_tables([r.table for r in requests])
    if incoming.num_rows < 4096 * incoming[SEQ].num_chunks:
        incoming = incoming.combine_chunks()  # DuckDB scans a table of many tiny Arrow chunks ~40x slower
    # batch number across the group = the request's first batch number + (seq - first seq)
    shift = np.repeat([b - r.first_seq for r, b in zip(requests, base)], [r.table.num_rows for r in requests])
    batch_of_row = incoming[SEQ].to_numpy() + shift
    incoming = incoming.drop_columns([SEQ]).append_column(BATCH, pa.array(batch_of_row))
    # the longest interval a row may claim: what its request declares, with slack for a late sampler
    rows_per = [r.table.num_rows for r in requests]
    limit = np.repeat([r.interval_s * INTERVAL_SLACK_FACTOR + INTERVAL_SLACK_S for r in requests], rows_per)
    usable, rejected, nulled_batches = check_rows(incoming, now, max_future, max_age, limit)
    gpus = gpus_of(usable)
    excess = too_many_gpus(usable, max_gpus, gpus)
    if excess is not None:
        count_reasons(rejected, usable[BATCH], pc.if_else(excess, pa.scalar("too_many_gpus"),
                                                           pa.scalar(None, pa.string())))
        usable = usable.filter(pc.invert(excess))
        gpus = gpus_of(usable)
    nulled = counts_per_batch(nulled_batches, count) if nulled_batches is not None else np.zeros(count, np.int64)
    return ScreenedGroup(requests, base, count, counts_per_batch(batch_of_row, count),
                         first_of_each_key(usable) if usable.num_rows else usable, rejected, nulled, now, gpus)
