"""The dated rate card as the store keeps it, and the one rule that guards it: a new card may not re-price a closed
period (a model its statement billed; a card adding a model no closed statement has is fine).

A card is a set of (GPU model, effective start, USD per GPU-hour, variant) rows; a rate is in force from its start
until the next start of the same model and variant. The variant narrows a rate to part of the fleet: '' (the
model's rate), `pool <name>` (a node pool's: two pools of one GPU model can cost differently) or `profile <name>`
(a MIG or vGPU profile's, held per GPU-hour of the card's share it occupies). A GPU-hour is priced at the most
specific rate in force at its time: its profile's, else its node pool's, else its model's (analytics/usage.py).
Replacing the card is how a site changes rates (the config is read at every start), so a replacement that prices
any instant of a closed period differently is refused whole, naming what it would
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

RateRow = tuple[str, datetime, float, str]  # (GPU model, effective start, USD per GPU-hour, variant)
RateKey = tuple[str, str]  # (GPU model, variant)
BASE = ""  # the variant of a model's own rate
POOL = "pool "  # a node pool's rate: "pool <name>"
PROFILE = "profile "  # a MIG profile's rate: "profile <name>"


def variant_label(variant: str) -> str:
    """How a variant reads after the GPU model: '' for the model's own rate."""
    return f" ({variant})" if variant else ""


class ClosedPeriodError(ConflictError):
    """A rate card (or a write) that would change what a closed period's statement says."""


@dataclass(frozen=True)
class RateChange:
    """One model's rate at one instant, before and after a card replacement (None: no rate, unpriced)."""
    gpu_model: str
    variant: str
    at: datetime
    before: float | None
    after: float | None
    period: str  # what it falls in: "closed period 2026-11", "open time"

    def __str__(self) -> str:
        def show(rate: float | None) -> str:
            if rate is None:
                return "the model's own rate" if self.variant else "unpriced"
            return f"${rate:g}/GPU-hour"
        since = "its start" if self.at == SINCE_EVER else f"{self.at:%Y-%m-%d %H:%M} UTC"
        return (f"{self.gpu_model}{variant_label(self.variant)} from {since}: {show(self.before)} -> "
                f"{show(self.after)} ({self.period})")


def rate_at(rows: Sequence[RateRow], key: RateKey, at: datetime) -> float | None:
    """The rate of `key` (model and variant) in force at `at` among `rows`, or None."""
    starts = sorted((start, rate) for m, start, rate, v in rows if (m, v) == key)
    i = bisect.bisect_right([s for s, _ in starts], at)
    return starts[i - 1][1] if i else None


def changes_in(before: Sequence[RateRow], after: Sequence[RateRow],
               spans: Iterable[tuple[str, datetime, datetime, set[str] | None]]) -> list[RateChange]:
    """Where `after` prices an instant of a span (label, start, end, the models it billed; None: any) differently
    from `before`: checked at each span's start and at every start of either card inside it, the only instants a
    rate can change at."""
    found = []
    every = sorted({(r[0], r[3]) for r in before} | {(r[0], r[3]) for r in after})
    for period, lo, hi, billed in spans:
        for key in (k for k in every if billed is None or k[0] in billed):
            starts = {lo} | {s for m, s, _, v in (*before, *after) if (m, v) == key and lo < s < hi}
            for at in sorted(starts):
                old, new = rate_at(before, key, at), rate_at(after, key, at)
                if old != new:
                    found.append(RateChange(key[0], key[1], at, old, new, period))
                    break  # one line per model, variant and period says enough
    return found


def replace_card(cur: duckdb.DuckDBPyConnection, rows: Sequence[RateRow],
                 basis: Mapping[tuple[str, datetime, str], str] | None = None) -> list[RateChange]:
    """Put `rows` in place of the stored card inside the caller's transaction, each with its `basis` (how a cost
    model derived it) where given; refused (ClosedPeriodError, nothing written) when it re-prices a closed period.
    Returns what it re-prices of open time (for the log)."""
    before = [(m, s, r, v) for m, s, r, v in cur.execute(
        "SELECT gpu_model, effective_from, usd_per_gpu_hour, variant FROM rate_versions").fetchall()]
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
        cur.executemany("INSERT INTO rate_versions (gpu_model, effective_from, usd_per_gpu_hour, basis, variant) "
                        "VALUES (?, ?, ?, ?, ?)", [[*r[:3], (basis or {}).get((r[0], r[1], r[3])), r[3]] for r in rows])
    return [] if not before else reopened


PoolRule = tuple[str | None, str | None, str | None]  # (pool, node-name glob, node label naming the pool)


def replace_pools(cur: duckdb.DuckDBPyConnection, rules: Sequence[PoolRule]) -> None:
    """Put the node pool rules (first match wins, in order) in place of the stored ones inside the caller's
    transaction. Which pool a node is in decides which pool rate prices it, so changed
    rules are refused (ClosedPeriodError) while a pool rate is in force in closed time: the node's closed hours
    would be re-priced."""
    before = [tuple(r) for r in cur.execute("SELECT pool, pattern, label FROM pool_rules ORDER BY ord").fetchall()]
    if before == [tuple(r) for r in rules]:
        return
    closed_end = cur.execute("SELECT max(end_ts) FROM ledger_periods").fetchone()[0]
    if closed_end is not None:
        priced = cur.execute("SELECT DISTINCT gpu_model || ' (' || variant || ')' FROM rate_versions "
                             "WHERE starts_with(variant, $pool) AND effective_from < $end ORDER BY 1",
                             {"pool": POOL, "end": closed_end}).fetchall()
        if priced:
            raise ClosedPeriodError(
                "the node pools ([node_pools]) changed, but pool rates priced closed time "
                f"({', '.join(r[0] for r in priced)}"
                f" up to {closed_end:%Y-%m-%d %H:%M} UTC): moving a node between pools would re-price its closed hours."
                " Keep the rules, or book a correction as an adjustment (POST /v1/ledger/adjustments)")
    cur.execute("DELETE FROM pool_rules")
    cur.executemany("INSERT INTO pool_rules VALUES (?, ?, ?, ?)", [[i, *r] for i, r in enumerate(rules)])
