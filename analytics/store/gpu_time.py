"""GPU-time is conserved: no instant of a GPU (or MIG instance) is billed twice, whoever claims it.

Why here and not per row: every row of a batch is bounded on its own (ingest_screen.py: a part of one GPU, about
the interval its request declares), but rows were never bounded against each other in time. One agent token sent
6,000 rows of one real GPU 0.1 s apart, each claiming an honest 15 s, and billed 51.7 GPU-hours in 10 minutes; an
agent whose clock stepped back 5 minutes billed the repeated minutes twice. A sample stands for
`[ts, ts + interval_s)` (analytics/store/rollups.py bills `interval_s * gpu_fraction`), so the rule is about
those spans: for one (node, GPU, MIG instance) no two stored instants may overlap.

How: the rows of one instant (the sharers of a GPU at one `ts` are one instant; their parts are held to one GPU
by ingest_screen._split_shared) are taken in time order. An instant's span starts no earlier than the end of
every instant before it, stored or earlier in the group, and ends no later than the next stored instant's start.
What is left of it is kept, its `interval_s` cut to that length (`clipped`: an agent's late sampler thread or a
restart overlapping its last sample by a few seconds), unless less than `MIN_KEPT_SHARE` of the interval is left:
then the instant is refused (`overlaps_stored`), since a row standing for a sliver of its own interval is a repeat,
not a measurement. Only instants near or before what is stored can meet a stored one: the store is asked about
those alone (agents send in time order, so in steady state only the first interval or so of a group).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

OVERLAPS = "overlaps_stored"
# the longest sampling interval a push may declare by default ([ingest] max_interval_s): agents sample every 10 to
# 60 s; a row stands for about its request's interval, so this bounds what the last row before a silence claims
MAX_DECLARED_INTERVAL_S = 300.0
MIN_KEPT_SHARE = 0.5  # an instant keeps at least this share of its interval, or is refused as a repeat
_US = 1_000_000


@dataclass
class Conserved:
    """The rows left after the rule, how many of them were clipped and by how many seconds in all, and per row
    of the input whether it was refused (None when none was: the usual case)."""
    rows: pa.Table
    refused: np.ndarray | None
    clipped_rows: int = 0
    clipped_seconds: float = 0.0


def stored_neighbours(cur, instants: pd.DataFrame, max_interval_s: float) -> pd.DataFrame:
    """For each instant given (node, gpu, mig, ts µs; index kept), the end (µs) of the stored instants of that GPU
    and MIG instance at or before it and the start of the first one after it (NaN: none within reach). From any
    node: a GPU is billed from one node at a time (analytics/store/gpu_inventory.py), so rows another node stored
    of it (before an admin moved it) are the same GPU's time. A stored instant at the same `ts` counts as before
    it: a second holder of an instant already billed adds nothing to it."""
    keys = instants[["node", "gpu", "mig", "ts"]].assign(_i=instants.index.to_numpy())
    reach = int(max_interval_s * _US) + _US
    lo, hi = int(keys["ts"].min()) - reach, int(keys["ts"].max()) + reach
    cur.register("incoming_instants", keys)
    try:
        found = cur.execute("""
            SELECT k._i,
                   max(epoch_us(s.ts) + CAST(s.interval_s * 1000000 AS BIGINT))
                       FILTER (WHERE epoch_us(s.ts) <= k.ts) AS prev_end,
                   min(epoch_us(s.ts)) FILTER (WHERE epoch_us(s.ts) > k.ts) AS next_ts
            FROM incoming_instants k
            JOIN samples s ON s.gpu_uuid = k.gpu AND coalesce(s.mig_instance, -1) = k.mig
                          AND epoch_us(s.ts) BETWEEN k.ts - $reach AND k.ts + $reach
            WHERE s.ts BETWEEN to_timestamp($lo / 1000000) AND to_timestamp($hi / 1000000)
            GROUP BY k._i""", {"reach": reach, "lo": lo, "hi": hi}).df()
    finally:
        cur.unregister("incoming_instants")
    return found.set_index("_i").reindex(instants.index)


def conserve(rows: pa.Table, cur=None, near: np.ndarray | None = None, max_interval_s: float = 300.0,
             latest_end: np.ndarray | None = None) -> Conserved:
    """Hold `rows` (one group, screened, exact repeats of stored rows already removed) to the rule above.

    `cur`: the writer's transaction, to ask the store about the rows flagged in `near` (rows whose instant may
    meet a stored one: at or before, or within `max_interval_s` after, their node's newest stored sample); without
    it only the group's own rows are held to each other. `latest_end` (µs, per row): no span ends later (time that
    has not passed is billed no further ahead than one interval). In numpy over the rows sorted by instance and time: a
    backlog group of 245,760 rows costs ~40 ms (pandas' group-by cost 170-250)."""
    n = rows.num_rows
    if not n:
        return Conserved(rows, None)
    gpu = pc.dictionary_encode(rows["gpu_uuid"]).combine_chunks().indices.to_numpy(zero_copy_only=False)
    node = pc.dictionary_encode(rows["node"]).combine_chunks().indices.to_numpy(zero_copy_only=False)
    mig = pc.fill_null(rows["mig_instance"], -1).to_numpy(zero_copy_only=False).astype(np.int64)
    ts = pc.cast(rows["ts"], pa.int64()).to_numpy(zero_copy_only=False)
    end = ts + (rows["interval_s"].to_numpy(zero_copy_only=False) * _US).astype(np.int64)
    order = np.lexsort((ts, mig, gpu, node))  # by instance (node, GPU, MIG instance), then time
    key = np.stack([node[order], gpu[order], mig[order]])
    new_key = np.r_[True, (key[:, 1:] != key[:, :-1]).any(axis=0)]
    sts, send = ts[order], end[order]
    new_instant = new_key | np.r_[True, sts[1:] != sts[:-1]]
    starts = np.flatnonzero(new_instant)
    inst_ts = sts[starts]
    inst_end = np.maximum.reduceat(send, starts)  # an instant's rows (its sharers) share its longest span
    inst_new_key = new_key[starts]
    # within the group: the latest end of the instants before each one of its instance (a cumulative maximum that
    # starts again at each instance: each instance's ends are lifted above every earlier instance's)
    base = int(inst_ts.min())
    lift = int(inst_end.max()) - base + 1
    rank = np.cumsum(inst_new_key) - 1
    lifted = np.maximum.accumulate((inst_end - base) + rank * lift)
    before = np.where(inst_new_key, np.iinfo(np.int64).min, np.r_[0, lifted[:-1] - rank[1:] * lift + base])
    start = np.maximum(inst_ts, before)
    stop = inst_end.copy()
    if latest_end is not None:
        stop = np.minimum(stop, np.minimum.reduceat(latest_end[order], starts))
    if cur is not None and near is not None and near.any():
        asked = np.unique(np.searchsorted(starts, np.flatnonzero(near[order]), side="right") - 1)
        first = order[starts[asked]]  # a row of each instant asked about
        stored = stored_neighbours(cur, pd.DataFrame({
            "node": rows["node"].take(pa.array(first)).to_numpy(zero_copy_only=False),
            "gpu": rows["gpu_uuid"].take(pa.array(first)).to_numpy(zero_copy_only=False),
            "mig": mig[first], "ts": inst_ts[asked]}, index=asked), max_interval_s)
        prev_end = stored["prev_end"].to_numpy(dtype=float)
        next_ts = stored["next_ts"].to_numpy(dtype=float)
        has_prev, has_next = ~np.isnan(prev_end), ~np.isnan(next_ts)
        start[asked[has_prev]] = np.maximum(start[asked[has_prev]], prev_end[has_prev].astype(np.int64))
        stop[asked[has_next]] = np.minimum(stop[asked[has_next]], next_ts[has_next].astype(np.int64))
    kept = stop - start
    interval = inst_end - inst_ts
    refuse = kept < np.maximum(MIN_KEPT_SHARE * interval, 1)
    clip = ~refuse & (kept < interval)
    if not refuse.any() and not clip.any():
        return Conserved(rows, None)
    instant_of_sorted = np.cumsum(new_instant) - 1
    instant_of_row = np.empty(n, np.int64)
    instant_of_row[order] = instant_of_sorted
    # each row keeps what of its own span lies in its instant's kept span (a sharer may declare less than the
    # instant's longest interval: it never gains time by being clipped)
    row_kept = np.minimum(end, stop[instant_of_row]) - np.maximum(ts, start[instant_of_row])
    own = end - ts
    refused_rows = refuse[instant_of_row] | (row_kept <= 0)
    clipped_rows = ~refused_rows & (row_kept < own)
    intervals = rows["interval_s"].to_numpy(zero_copy_only=False)
    new_intervals = np.where(clipped_rows, row_kept / _US, intervals)
    clipped_seconds = float((intervals - new_intervals)[clipped_rows].sum())
    if clipped_rows.any():
        rows = rows.set_column(rows.schema.get_field_index("interval_s"), "interval_s",
                               pa.array(new_intervals, pa.float64()))
    if refused_rows.any():
        rows = rows.filter(pa.array(~refused_rows))
    return Conserved(rows, refused_rows if refused_rows.any() else None, int(clipped_rows.sum()), clipped_seconds)
