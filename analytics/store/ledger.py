"""The ledger's writes: a period closed with its statement, and an adjustment booked into an open period.

Both are appends, each checked inside its own transaction against what is already closed, so two writers (the
server's closing job and `gpuledger statement`) cannot close a period twice or book into one that closed a moment
ago. Nothing here updates or deletes a ledger row: a closed statement is final, a correction is a new entry.
"""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import pandas as pd

from gpuledger.analytics.store.access import Audit, audited_write
from gpuledger.analytics.store.rates import ClosedPeriodError

if TYPE_CHECKING:
    from gpuledger.analytics.store.database import Store

LINE_COLUMNS = ("team", "kind", "shared_from", "gpu_model", "rate_from", "rate_variant", "usd_per_gpu_hour",
                "gpu_hours",
                "used_gpu_hours", "util_coverage", "cost_usd")


def close_period(store: "Store", period: str, start: datetime, end: datetime, lines: pd.DataFrame, by: str,
                 at: datetime, split: str) -> bool:
    """Store `period`'s statement `lines` (LINE_COLUMNS) and mark it closed; False when it was closed already
    (nothing written). A period overlapping a closed one is refused (ClosedPeriodError)."""
    with store.transaction() as cur:
        if cur.execute("SELECT 1 FROM ledger_periods WHERE period = ?", [period]).fetchone():
            return False
        overlap = cur.execute("SELECT period FROM ledger_periods WHERE start_ts < ? AND end_ts > ?",
                              [end, start]).fetchone()
        if overlap:
            raise ClosedPeriodError(f"period {period} overlaps closed period {overlap[0]}")
        if len(lines):
            cur.register("statement_in", lines[list(LINE_COLUMNS)])
            cur.execute("INSERT INTO statement_lines BY NAME SELECT ? AS period, * FROM statement_in", [period])
            cur.unregister("statement_in")
        cur.execute("INSERT INTO ledger_periods VALUES (?, ?, ?, ?, ?, ?)", [period, start, end, at, by, split])
    return True


def book_adjustment(store: "Store", entry: dict[str, Any], audit: Audit | None) -> dict[str, Any]:
    """Append an adjustment (id, period, corrects, team, usd, reason, made_by, made_at) with its audit entry, in
    one transaction; refused (ClosedPeriodError) when its period closed meanwhile."""
    with audited_write(store, audit) as tx:
        if tx.cursor.execute("SELECT 1 FROM ledger_periods WHERE period = ?", [entry["period"]]).fetchone():
            raise ClosedPeriodError(f"period {entry['period']} closed meanwhile: book the adjustment again")
        tx.cursor.execute("INSERT INTO ledger_adjustments VALUES ($id, $period, $corrects, $team, $usd, $reason, "
                          "$made_by, $made_at)", entry)
        tx.record(adjustment=entry["id"], period=entry["period"], corrects=entry["corrects"], team=entry["team"],
                  usd=str(entry["usd"]), reason=entry["reason"])
    return entry
