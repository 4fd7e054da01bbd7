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


def _instants(rows: pa.Table) -> pd.DataFrame:
    """One line per row: its instance key, instant start (µs) and interval (µs), in the rows' order."""
    return pd.DataFrame({
        "node": rows["node"].to_numpy(zero_copy_only=False),
        "gpu": rows["gpu_uuid"].to_numpy(zero_copy_only=False),
        "mig": pc.fill_null(rows["mig_instance"], -1).to_numpy(zero_copy_only=False).astype(np.int64),
        "ts": pc.cast(rows["ts"], pa.int64()).to_numpy(zero_copy_only=False),
        "interval": (rows["interval_s"].to_numpy(zero_copy_only=False) * _US).astype(np.int64),
    })


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


def conserve(rows: pa.Table, cur=None, near: np.ndarray | None = None, max_interval_s: float = 300.0) -> Conserved:
    """Hold `rows` (one group, screened, exact repeats of stored rows already removed) to the rule above.

    `cur`: the writer's transaction, to ask the store about the rows flagged in `near` (rows whose instant may
    meet a stored one: at or before, or within `max_interval_s` after, their node's newest stored sample); without
    it only the group's own rows are held to each other."""
    if not rows.num_rows:
        return Conserved(rows, None)
    frame = _instants(rows)
    frame["end"] = frame["ts"] + frame["interval"]
    # the instant's own rows share one span: the longest interval any of them declares
    inst = frame.groupby(["node", "gpu", "mig", "ts"], sort=True, as_index=False).agg(end=("end", "max"))
    inst["interval"] = inst["end"] - inst["ts"]
    # within the group: every instant starts after the ends of the instants before it (same instance)
    by_key = inst.groupby(["node", "gpu", "mig"], sort=False)["end"]
    before = by_key.cummax().groupby([inst["node"], inst["gpu"], inst["mig"]], sort=False).shift(1)
    start = np.maximum(inst["ts"].to_numpy(), before.fillna(np.iinfo(np.int64).min).to_numpy(np.int64))
    stop = inst["end"].to_numpy().copy()
    if cur is not None and near is not None and near.any():
        # the instants some of whose rows are near stored ones (all of an instant's rows share its node and ts)
        marked = frame.loc[near, ["node", "gpu", "mig", "ts"]].drop_duplicates()
        asked = inst.reset_index().merge(marked, on=["node", "gpu", "mig", "ts"]).set_index("index")
        if len(asked):
            stored = stored_neighbours(cur, asked, max_interval_s)
            where = asked.index.to_numpy()
            prev_end = stored["prev_end"].to_numpy(dtype=float)
            next_ts = stored["next_ts"].to_numpy(dtype=float)
            has_prev, has_next = ~np.isnan(prev_end), ~np.isnan(next_ts)
            start[where[has_prev]] = np.maximum(start[where[has_prev]], prev_end[has_prev].astype(np.int64))
            stop[where[has_next]] = np.minimum(stop[where[has_next]], next_ts[has_next].astype(np.int64))
    kept = stop - start
    interval = inst["interval"].to_numpy()
    refuse = kept < np.maximum(MIN_KEPT_SHARE * interval, 1)
    clip = ~refuse & (kept < interval)
    if not refuse.any() and not clip.any():
        return Conserved(rows, None)
    inst["_refuse"], inst["_kept"] = refuse, np.where(clip, kept, -1)
    per_row = frame[["node", "gpu", "mig", "ts"]].merge(inst[["node", "gpu", "mig", "ts", "_refuse", "_kept"]],
                                                        on=["node", "gpu", "mig", "ts"], how="left")
    refused_rows = per_row["_refuse"].to_numpy(bool)
    new_kept = per_row["_kept"].to_numpy(np.int64)
    clipped_rows = (new_kept >= 0) & ~refused_rows
    intervals = rows["interval_s"].to_numpy(zero_copy_only=False)
    clipped_seconds = float((intervals[clipped_rows] - new_kept[clipped_rows] / _US).sum())
    if clipped_rows.any():
        intervals = np.where(clipped_rows, new_kept / _US, intervals)
        rows = rows.set_column(rows.schema.get_field_index("interval_s"), "interval_s",
                               pa.array(intervals, pa.float64()))
    if refused_rows.any():
        rows = rows.filter(pa.array(~refused_rows))
    return Conserved(rows, refused_rows if refused_rows.any() else None, int(clipped_rows.sum()), clipped_seconds)
