"""`gpuledger import TRACE PATH` and `gpuledger demo --trace TRACE`: a public cluster trace into the store, so every
analytic, the dashboard and the weekly report run on a real cluster's history.

Each trace's reader (collector/traces/) says how its rows become jobs and samples and what the history is evidence
of; this module streams them into the store, folds the rollups and records the fragmentation history.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable

import pyarrow as pa

from gpuledger.analytics import fragmentation
from gpuledger.analytics.store import Store
from gpuledger.collector.errors import InputError
from gpuledger.collector.traces import TRACE_NAMES, genai, helios, philly
from gpuledger.collector.traces.history import Imported
from gpuledger.policies import openb_placement

# trace -> (reader, its folder under ../shared/traces, the days imported by default: None = all)
TRACES: dict[str, tuple[Callable[..., Imported], str, float | None]] = {
    "openb": (openb_placement.import_history, "openb/csv", 7.0),
    "philly": (philly.import_history, "philly", None),
    "helios": (helios.import_history, "helios", None),
    "genai": (genai.import_history, "alibaba_genai_2026", None),
}
assert tuple(TRACES) == TRACE_NAMES, "a trace is declared in collector/traces/__init__.py and read here"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def default_path(trace: str) -> Path:
    """Where the shared copy of a trace lives beside the checkout (../shared/traces)."""
    return SHARED / TRACES[trace][1]


def import_trace(store: Store, trace: str, path: Path | None = None, days: float | None = None,
                 echo: Callable[[str], None] = print, end: datetime | None = None) -> dict[str, int]:
    """Read `trace` from `path` and store it: samples (with progress), jobs, quotas, rollups, fragmentation. The
    trace is moved to end at `end` (default: now, to the hour)."""
    if trace not in TRACES:
        raise InputError(f"unknown trace {trace!r}; one of {', '.join(TRACES)}")
    reader, _, default_days = TRACES[trace]
    path = Path(path) if path else default_path(trace)
    if not path.exists():
        raise InputError(f"{path} not found: give the trace's folder (see ../shared/traces/{TRACES[trace][1]})")
    imported = reader(path, days=days if days is not None else default_days, end=end)
    tables = list(imported.samples)
    echo(f"  {trace}: {sum(t.num_rows for t in tables):,} samples read")
    # one append in time order: a store folds as it goes, and rows landing in minutes already folded are refolded
    history = pa.concat_tables(tables).sort_by("ts") if tables else None
    stored = store.append_samples(history) if history is not None else 0
    echo(f"  {trace}: {stored:,} samples stored")
    if len(imported.jobs):
        store.upsert_jobs(imported.jobs)
    if imported.quotas is not None and len(imported.quotas):
        store.set_team_quotas(imported.quotas)
    store.fold()
    echo(f"  rollups: complete up to {store.rollup_params()['mwm']:%Y-%m-%d %H:%M} UTC")
    readings = 0
    if imported.capacity:  # free GPUs are known: record how fragmented they were, every 6 hours
        first, last = store.span_of(f"trace:{trace}")
        readings = fragmentation.backfill(store, first, last + timedelta(minutes=1), timedelta(hours=6))
    for note in imported.notes:
        echo(f"  note: {note}")
    return {"samples": stored, "jobs": len(imported.jobs), "fragmentation_readings": readings}
