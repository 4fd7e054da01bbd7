"""Turn a trace's jobs (who held which GPUs, when) into samples and job records the store takes like any other.

Why samples at clock hours: a job's holding interval is cut at every hour boundary, and each piece becomes one
sample that stands for exactly its length (`interval_s`), so GPU-hours add up to the trace's to the second while
an hour-long job costs a handful of rows. A fraction of a GPU (openb's `gpu_milli`) is billed as that fraction.
Times are moved so the trace ends at the import's `end` (default now): the traces' own clocks are anonymised or
years old, and analytics work on recent windows.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

from gpuledger.collector.gpu_catalog import normalize_model
from gpuledger.collector.samples import SAMPLE_SCHEMA

log = logging.getLogger(__name__)
HOUR = 3600.0


@dataclass
class Imported:
    """A trace made ready for the store: sample tables (a generator: they are many), job records, team quotas
    when the trace has them, and notes on what was done and what the history is evidence of."""
    samples: Iterator[pa.Table]
    jobs: pd.DataFrame
    notes: list[str]
    quotas: pd.DataFrame | None = None
    capacity: bool = False  # whether free GPUs are in the samples too (then fragmentation means something)


@dataclass(frozen=True)
class Holding:
    """One job holding one GPU (or a part of it) over [start, end), seconds on the trace's clock."""
    job_id: str
    team: str
    user: str | None
    node: str
    gpu: str  # unique within the node
    model: str
    fraction: float
    start: float
    end: float
    util_pct: float | None = None


def pieces(start: float, end: float, step: float = HOUR) -> Iterator[tuple[float, float]]:
    """[start, end) cut at every multiple of `step`: (piece start, piece length)."""
    t = start
    while t < end:
        nxt = min(end, (np.floor(t / step) + 1) * step)
        yield t, nxt - t
        t = nxt


def samples_of(holdings: Iterable[Holding], shift: float, source: str, chunk_rows: int = 500_000
               ) -> Iterator[pa.Table]:
    """Sample tables of the holdings (cut at clock hours), trace seconds moved by `shift` to epoch seconds."""
    rows: dict[str, list] = {c: [] for c in ("ts", "interval_s", "node", "gpu_uuid", "gpu_model", "model_name",
                                             "gpu_fraction", "job_id", "team", "user", "namespace", "util_pct")}

    def flush() -> pa.Table:
        n = len(rows["ts"])
        frame = {name: rows.get(name, [None] * n) for name in SAMPLE_SCHEMA.names}
        frame["ts"] = pd.to_datetime(np.round(np.array(rows["ts"]) * 1e6).astype(np.int64), unit="us", utc=True)
        frame.update(allocated=[True] * n, source=[source] * n)
        for name in rows:
            rows[name] = []
        return pa.Table.from_pydict(frame, schema=SAMPLE_SCHEMA)

    for h in holdings:
        model = normalize_model(h.model)
        for t, length in pieces(h.start + shift, h.end + shift):
            for name, value in (("ts", t), ("interval_s", length), ("node", h.node), ("gpu_uuid", f"{h.node}/{h.gpu}"),
                                ("gpu_model", model), ("model_name", h.model), ("gpu_fraction", h.fraction),
                                ("job_id", h.job_id), ("team", h.team), ("user", h.user), ("namespace", h.team),
                                ("util_pct", h.util_pct)):
                rows[name].append(value)
            if len(rows["ts"]) >= chunk_rows:
                yield flush()
    if rows["ts"]:
        yield flush()


def shift_to(last_trace_second: float, end: datetime | None) -> float:
    """Seconds to add to the trace's clock so that its last instant lands on `end` (default: now, to the hour)."""
    end = end or datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    return end.timestamp() - last_trace_second


def free_capacity(holdings: list[Holding], gpus: list[tuple[str, str, str]], start: float, end: float,
                  shift: float, source: str) -> pa.Table:
    """Unallocated rows: for every GPU (node, gpu, model) and clock hour of [start, end), the part of the hour no
    holding covered, so capacity and idle capacity add up too."""
    first = np.floor((start + shift) / HOUR)
    hours = int(np.ceil((end + shift) / HOUR) - first)
    index = {(n, g): i for i, (n, g, _) in enumerate(gpus)}
    held = np.zeros((hours, len(gpus)))
    for h in holdings:
        col = index[(h.node, h.gpu)]
        for t, length in pieces(h.start + shift, h.end + shift):
            held[int(np.floor(t / HOUR) - first), col] += length * h.fraction
    lo, hi = start + shift, end + shift
    starts = np.maximum((first + np.arange(hours)) * HOUR, lo)
    spans = np.minimum(starts + HOUR, hi) - starts
    free = np.clip(spans[:, None] - held, 0, None)
    r, c = np.nonzero(free > 1e-6)
    nodes, ids, models = (np.array([g[k] for g in gpus], dtype=object) for k in range(3))
    n = len(r)
    frame = {name: [None] * n for name in SAMPLE_SCHEMA.names}
    frame.update(ts=pd.to_datetime(np.round(starts[r] * 1e6).astype(np.int64), unit="us", utc=True),
                 interval_s=spans[r], node=nodes[c], gpu_uuid=[f"{a}/{b}" for a, b in zip(nodes[c], ids[c])],
                 gpu_model=[normalize_model(m) for m in models[c]], model_name=models[c],
                 gpu_fraction=free[r, c] / spans[r], allocated=[False] * n, source=[source] * n)
    return pa.Table.from_pydict(frame, schema=SAMPLE_SCHEMA)


def jobs_frame(rows: list[dict], shift: float) -> pd.DataFrame:
    """Job records (the store's `jobs` table) with the trace's times moved by `shift`."""
    frame = pd.DataFrame(rows)
    for column in ("submit_ts", "start_ts", "end_ts"):
        frame[column] = pd.to_datetime(frame[column] + shift, unit="s", utc=True)
    return frame[["job_id", "team", "user", "namespace", "pod", "node", "gpu_model", "gpus", "submit_ts", "start_ts",
                  "end_ts", "state"]]


def window_start(end_second: float, days: float | None) -> float:
    """The first trace second imported when only the last `days` are wanted (None: everything)."""
    return -np.inf if days is None else end_second - days * 86400.0


__all__ = ["Holding", "samples_of", "pieces", "shift_to", "jobs_frame", "window_start", "free_capacity", "Imported"]
