"""Compaction as `gpuledger compact` runs it on a file and `POST /v1/admin/compact` on a running server: fold the
closed minutes (after a rebuild from the raw samples, when asked), drop what retention expired, checkpoint. One
function, so the two doors print and answer the same figures."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Callable

from gpuledger.analytics.store import Store


def compact(store: Store, rebuild: bool = False,
            progress: Callable[[datetime, datetime], None] | None = None,
            note: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Minutes folded, where the rollups are complete to, rows dropped per table and the retention that dropped
    them. Nothing is dropped before it is folded, so GPU-hours and cost are the same before and after."""
    minutes = 0
    if rebuild:
        note("rebuilding the rollups from the raw samples kept...")
        minutes = store.rebuild_rollups()
    note("folding closed minutes...")
    minutes += store.fold(progress=progress)
    dropped = store.retain()
    store.checkpoint_if_due(min_wal_bytes=0)
    return {"folded_minutes": minutes, "complete_to": store.rollup_params()["mwm"], "dropped": dropped,
            "raw_days": store.retention.raw_days, "minute_days": store.retention.minute_days}


def summary(done: dict[str, Any]) -> list[str]:
    """What `gpuledger compact` prints of a compaction, whichever door ran it."""
    dropped = done["dropped"]
    return [f"folded {done['folded_minutes']:,} minute(s); rollups complete up to {done['complete_to']:%Y-%m-%d %H:%M} "
            "UTC",
            f"dropped {dropped.get('samples', 0):,} raw sample(s) older than {done['raw_days']:g} days, "
            f"{dropped.get('processes', 0):,} process row(s), {dropped.get('usage_minute', 0):,} minute rollup(s) older "
            f"than {done['minute_days']:g} days; hour rollups are kept"]


__all__ = ["compact", "summary"]
