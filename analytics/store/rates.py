"""The dated rate card as the store keeps it, and the one rule that guards it: a new card may not re-price a closed
period (a model its statement billed; a card adding a model no closed statement has is fine).

A card is a set of (GPU model, effective start, USD per GPU-hour) rows; a model's rate is in force from its start
until the model's next start. Replacing the card is how a site changes rates (the config is read at every start),
so a replacement that prices any instant of a closed period differently is refused whole, naming what it would
change: a closed statement is stored and never changes, and the live figures of its time must keep agreeing with
it. The same replacement may re-price open time; the server logs what it re-priced.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Mapping, Sequence

import duckdb

from gpuledger.analytics.store.schema import SINCE_EVER
from gpuledger.collector.errors import ConflictError

RateRow = tuple[str, datetime, float]  # (GPU model, effective start, USD per GPU-hour)


class ClosedPeriodError(ConflictError):
    """A rate card (or a write) that would change what a closed period's statement says."""


@dataclass(frozen=True)
class RateChange:
    """One model's rate at one instant, before and after a card replacement (None: no rate, unpriced)."""
    gpu_model: str
    at: datetime
    before: float | None
    after: float | None
    period: str  # what it falls in: "closed period 2026-11", "open time"

    def __str__(self) -> str:
        def show(rate: float | None) -> str:
            return "unpriced" if rate is None else f"${rate:g}/GPU-hour"
        since = "its start" if self.at == SINCE_EVER else f"{self.at:%Y-%m-%d %H:%M} UTC"
        return f"{self.gpu_model} from {since}: {show(self.before)} -> {show(self.after)} ({self.period})"


def rate_at(rows: Sequence[RateRow], model: str, at: datetime) -> float | None:
    """The rate of `model` in force at `at` among `rows`, or None."""
    starts = sorted((start, rate) for m, start, rate in rows if m == model)
    i = bisect.bisect_right([s for s, _ in starts], at)
    return starts[i - 1][1] if i else None


def changes_in(before: Sequence[RateRow], after: Sequence[RateRow],
               spans: Iterable[tuple[str, datetime, datetime, set[str] | None]]) -> list[RateChange]:
    """Where `after` prices an instant of a span (label, start, end, the models it billed; None: any) differently
    from `before`: checked at each span's start and at every start of either card inside it, the only instants a
    rate can change at."""
    found = []
    every = sorted({r[0] for r in before} | {r[0] for r in after})
    for period, lo, hi, billed in spans:
        for model in (every if billed is None else sorted(billed & set(every))):
            starts = {lo} | {s for m, s, _ in (*before, *after) if m == model and lo < s < hi}
            for at in sorted(starts):
                old, new = rate_at(before, model, at), rate_at(after, model, at)
                if old != new:
                    found.append(RateChange(model, at, old, new, period))
                    break  # one line per model and period says enough
    return found


def replace_card(cur: duckdb.DuckDBPyConnection, rows: Sequence[RateRow],
                 basis: Mapping[tuple[str, datetime], str] | None = None) -> list[RateChange]:
    """Put `rows` in place of the stored card inside the caller's transaction, each with its `basis` (how a cost
    model derived it) where given; refused (ClosedPeriodError, nothing written) when it re-prices a closed period.
    Returns what it re-prices of open time (for the log)."""
    before = [(m, s, r) for m, s, r in cur.execute(
        "SELECT gpu_model, effective_from, usd_per_gpu_hour FROM rate_versions").fetchall()]
    closed = cur.execute("SELECT period, start_ts, end_ts FROM ledger_periods ORDER BY start_ts").fetchall()
    billed: dict[str, set[str]] = {}  # per closed period, the models its statement billed: no other can re-price it
    for period, model in cur.execute("SELECT DISTINCT period, gpu_model FROM statement_lines "
                                     "WHERE gpu_model IS NOT NULL").fetchall():
        billed.setdefault(period, set()).add(model)
    refused = changes_in(before, rows, [(f"closed period {p}", lo, hi, billed.get(p, set())) for p, lo, hi in closed])
    if refused:
        last = max(end for _, _, end in closed)
        raise ClosedPeriodError(
            "the rate card would re-price closed time, whose statements never change: "
            + "; ".join(map(str, refused))
            + f". Keep those rates and date the change on or after {last:%Y-%m-%d %H:%M} UTC ([[rate_cards]] "
            "with `from`), or book a correction as an adjustment (POST /v1/ledger/adjustments)")
    newest_closed = max((end for _, _, end in closed), default=SINCE_EVER)
    reopened = changes_in(before, rows, [("open time", newest_closed, datetime.max.replace(tzinfo=SINCE_EVER.tzinfo),
                                          None)])
    cur.execute("DELETE FROM rate_versions")
    if rows:
        cur.executemany("INSERT INTO rate_versions VALUES (?, ?, ?, ?)",
                        [[*r, (basis or {}).get((r[0], r[1]))] for r in rows])
    return [] if not before else reopened
