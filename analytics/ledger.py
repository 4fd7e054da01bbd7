"""The chargeback ledger: periods that close, their statements, and corrections booked as adjustments.

Time is cut into periods (`[ledger] period`: calendar months, or ISO weeks), UTC. A period closes `grace_days`
after its end: its statement (per bill line, GPU model and rate card version: GPU-hours, busy GPU-hours, the rate
and the cost in cents) is computed once from the rollups, stored, and from then on read back, never recomputed, so
a rate card edited later, a rollup rebuilt or a sample arriving late cannot change a bill finance has closed
(Store.set_rates refuses a card that would re-price closed time). A correction is an adjustment: an amount for a
team with who made it and why, booked into the first open period at or after the one it corrects, and written to
the audit log in the same transaction. A period still open has a draft statement, computed live the same way.
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

import pandas as pd

from gpuledger.analytics.config import LedgerConfig
from gpuledger.analytics.cost import PRICED
from gpuledger.analytics.cost_split import split
from gpuledger.analytics.records import records
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import Audit
from gpuledger.analytics.store.ledger import book_adjustment, close_period
from gpuledger.analytics.usage import covered_hours, measured
from gpuledger.analytics.windows import as_utc, utc_now
from gpuledger.collector.errors import InputError, NotFoundError
from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED

_MONTH = re.compile(r"^(\d{4})-(\d{2})$")
_WEEK = re.compile(r"^(\d{4})-W(\d{2})$")
CENT = Decimal("0.01")
MAX_ADJUSTMENT_USD = Decimal("1e9")  # one correction of a billion dollars is a typo, not a GPU bill
FULL_COVERAGE = 0.99  # a statement whose samples cover less of its hours says so (coverage.note)
PERIOD_STATES = ("open", "closed")  # a period's state: open (its statement a draft), closed (stored, final)
OPEN, CLOSED = PERIOD_STATES


class LedgerError(InputError):
    """A period, team or amount the ledger cannot take."""


@dataclass(frozen=True)
class Period:
    """One period of the ledger: its name (2026-11, 2026-W48) and its bounds [start, end), UTC."""
    name: str
    start: datetime
    end: datetime


def _month(year: int, month: int) -> Period:
    start = datetime(year, month, 1, tzinfo=timezone.utc)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=timezone.utc)
    return Period(f"{year:04d}-{month:02d}", start, end)


def _week(monday: date) -> Period:
    year, week, _ = monday.isocalendar()
    start = datetime(monday.year, monday.month, monday.day, tzinfo=timezone.utc)
    return Period(f"{year:04d}-W{week:02d}", start, start + timedelta(days=7))


def period_of(at: datetime, kind: str) -> Period:
    """The period of `kind` (month, week) that holds the instant `at`."""
    at = as_utc(at)
    if kind == "month":
        return _month(at.year, at.month)
    day = at.date()
    return _week(day - timedelta(days=day.weekday()))


def parse_period(text: str, kind: str) -> Period:
    """`2026-11` (a month) or `2026-W48` (an ISO week), which must be the ledger's kind of period."""
    month, week = _MONTH.match(text or ""), _WEEK.match(text or "")
    try:
        if month and kind == "month":
            return _month(int(month.group(1)), int(month.group(2)))
        if week and kind == "week":
            return _week(date.fromisocalendar(int(week.group(1)), int(week.group(2)), 1))
    except ValueError as exc:
        raise LedgerError(f"no such period: {text!r}") from exc
    example = "2026-11" if kind == "month" else "2026-W48"
    raise LedgerError(f"the ledger's periods are {kind}s ([ledger] period): give one like {example}, got {text!r}")


def split_of(config: LedgerConfig) -> str:
    """How a statement splits idle capacity and shared-cost teams, in words a statement shows."""
    idle = "idle capacity its own line" if config.idle == "own_line" else f"idle shared by {config.idle_by}"
    shared = (f"; {', '.join(config.shared_teams)} spread by {config.share_by}" if config.shared_teams else "")
    return idle + shared


def closes_at(period: Period, config: LedgerConfig) -> datetime:
    return period.end + timedelta(days=config.grace_days)


def statement_lines(store: Store, start: datetime, end: datetime, config: LedgerConfig) -> pd.DataFrame:
    """What a statement of [start, end) says, per bill line (team, unattributed, idle capacity), line kind (own
    use, or a share of idle capacity or of a shared-cost team: analytics/cost_split.py, as `config` says), GPU
    model and rate card version (`rate_from`, null: unpriced; `rate_variant`: a node pool's or MIG profile's
    rate, '' the model's own): GPU-hours, busy GPU-hours (null where none was measured), the share measured,
    the rate, and the cost in cents that add up to the cluster's cost."""
    sql = f"""
        SELECT bill_line(allocated, team, $unattributed, $idle) AS team, node, gpu_model, rate_from, rate_variant,
               rate_card_version(rate_from, rate_variant) AS rate_card, any_value(usd_per_gpu_hour) AS usd_per_gpu_hour,
               sum(gpu_hours) AS gpu_hours, {measured("sum(used_gpu_hours)")} AS used_gpu_hours,
               sum(util_gpu_s) / 3600.0 AS measured_gpu_hours, sum(cost_usd) AS cost
        FROM {PRICED}
        GROUP BY ALL"""
    per_node = store.query_usage(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED,
                                       "idle": IDLE_CAPACITY})
    lines = split(per_node, config.idle, config.idle_by, config.shared_teams, config.share_by)
    lines["cost_usd"] = lines.pop("cost_cents").map(lambda c: Decimal(int(c)).scaleb(-2))
    return lines


def _closed(store: Store) -> pd.DataFrame:
    return store.query("SELECT * FROM ledger_periods ORDER BY start_ts")


def _first_open(store: Store, config: LedgerConfig, closed: pd.DataFrame | None = None) -> Period | None:
    """The first period not closed: the one after the last closed, else the one of the oldest data (None: none).
    `closed`: the closed periods, where the caller has read them already."""
    closed = _closed(store) if closed is None else closed
    if not closed.empty:
        end = as_utc(closed["end_ts"].iloc[-1].to_pydatetime())
        following = period_of(end, config.period)
        if following.start != end:
            raise LedgerError(f"the last closed period {closed['period'].iloc[-1]} ends at {end:%Y-%m-%d %H:%M} UTC, "
                              f"which does not start a {config.period}: keep [ledger] period as it was when it "
                              "closed (the periods of a ledger cannot change kind in the middle)")
        return following
    oldest = store.scalar("SELECT least((SELECT min(bucket) FROM usage_hour), (SELECT min(ts) FROM samples))")
    return period_of(oldest, config.period) if oldest is not None else None


def _first_period(store: Store, config: LedgerConfig) -> Period | None:
    """The ledger's first period: its first closed one, else the first open one (None: no data yet)."""
    closed = _closed(store)
    if closed.empty:
        return _first_open(store, config, closed)
    first = closed.iloc[0]
    return Period(first["period"], as_utc(first["start_ts"].to_pydatetime()), as_utc(first["end_ts"].to_pydatetime()))


def close_due(store: Store, config: LedgerConfig, now: datetime | None = None, by: str = "gpuledger") -> list[str]:
    """Close, oldest first, every period whose grace has passed (`now` >= end + grace_days); the names closed.
    Waits (closes nothing) while the store folds a backlog: a statement is computed once, from caught-up data."""
    now = as_utc(now) if now else utc_now()
    period = _first_open(store, config)
    done: list[str] = []
    while period is not None and closes_at(period, config) <= now and not store.folding_backlog():
        lines = statement_lines(store, period.start, period.end, config)
        if close_period(store, period.name, period.start, period.end, lines, by, now, split_of(config)):
            done.append(period.name)
        period = period_of(period.end, config.period)
    return done


def periods(store: Store, config: LedgerConfig, now: datetime | None = None) -> list[dict[str, Any]]:
    """Every closed period, then the open ones up to the one holding `now`: name, bounds, state, when it closes
    (or closed, and by whom) and, for a closed one, its statement's total."""
    now = as_utc(now) if now else utc_now()
    totals = store.query("""SELECT period, sum(cost_usd) AS usd FROM (
                                SELECT period, cost_usd FROM statement_lines
                                UNION ALL SELECT period, usd FROM ledger_adjustments) GROUP BY 1""")
    total = dict(zip(totals["period"], totals["usd"]))
    closed = _closed(store)
    closed["closes_at"] = closed["end_ts"] + pd.Timedelta(days=config.grace_days)
    out = [{"period": row["period"], "start": row["start_ts"], "end": row["end_ts"], "state": CLOSED,
            "closes_at": row["closes_at"], "closed_at": row["closed_at"], "closed_by": row["closed_by"],
            "total_usd": _usd(total.get(row["period"], 0))} for row in records(closed)]
    period = _first_open(store, config, closed)
    while period is not None and period.start <= now:
        out.append({"period": period.name, "start": period.start, "end": period.end, "state": OPEN,
                    "closes_at": closes_at(period, config), "closed_at": None, "closed_by": None, "total_usd": None})
        period = period_of(period.end, config.period)
    return out


def _usd(value: Any) -> float:
    """An amount in whole cents, as a float for JSON (the sum of cents, so a total adds up to its lines)."""
    return _cents(_cents_of(value or 0))


def coverage_of(store: Store, start: datetime, end: datetime, now: datetime) -> dict[str, Any]:
    """What a statement's numbers rest on: the clock hours of [start, end) holding at least one sample of any GPU,
    over the period's hours (up to now while it runs), the first and last of them, and a note when that is less
    than the period: a bill for a month whose samples begin on the 23rd must say so, not look like a quiet month."""
    until = min(end, now)
    found = covered_hours(store, start, until)
    hours = sorted({pd.Timestamp(h) for listed in found["hours"] for h in listed}) if not found.empty else []
    hours = [h.tz_localize("UTC") if h.tzinfo is None else h for h in hours]  # the rollups' hours are UTC, unmarked
    elapsed = max(0.0, (until - start).total_seconds() / 3600.0)
    period = (end - start).total_seconds() / 3600.0
    share = len(hours) / elapsed if elapsed else None
    note = None
    if hours and share is not None and share < FULL_COVERAGE:
        note = (f"samples cover {len(hours):,} of the {elapsed:,.0f} hours {'so far ' if until < end else ''}"
                f"({share:.0%}), from {hours[0]:%Y-%m-%d %H:00} to {hours[-1]:%Y-%m-%d %H:00} UTC: the hours without "
                "samples are not billed, not billed as idle")
    elif not hours:
        note = "no samples in the period: nothing is billed"
    return {"hours_with_data": len(hours), "hours_elapsed": round(elapsed, 2), "hours_in_period": round(period, 2),
            "share": round(share, 4) if share is not None else None,
            "first_hour": hours[0].to_pydatetime() if hours else None,
            "last_hour": hours[-1].to_pydatetime() if hours else None, "note": note}


def statement(store: Store, config: LedgerConfig, name: str, now: datetime | None = None) -> dict[str, Any]:
    """A period's statement: the stored one of a closed period, else a draft computed now (state open). Lines,
    the adjustments booked into it, per-team totals (usage + adjustments) and the total, all in cents."""
    now = as_utc(now) if now else utc_now()
    period = parse_period(name, config.period)
    closed = store.query("SELECT * FROM ledger_periods WHERE period = $p", {"p": period.name})
    if closed.empty and period.start > now:
        raise NotFoundError(f"period {period.name} has not started yet")
    first = _first_period(store, config) if closed.empty else None
    if first is not None and period.end <= first.start:
        raise NotFoundError(f"period {period.name} is before the ledger's first period, {first.name} (the one of "
                            "its oldest data)")
    if not closed.empty:
        lines = store.query("""SELECT * EXCLUDE (period), rate_card_version(rate_from, rate_variant) AS rate_card
                               FROM statement_lines WHERE period = $p
                               ORDER BY (team = $idle), team, kind, gpu_model, rate_from, rate_variant""",
                            {"p": period.name, "idle": IDLE_CAPACITY})
        meta = records(closed)[0]
        state = {"state": CLOSED, "closed_at": meta["closed_at"], "closed_by": meta["closed_by"],
                 "split": meta["split"]}
    else:
        lines = statement_lines(store, period.start, min(period.end, now), config)
        state = {"state": OPEN, "closed_at": None, "closed_by": None, "split": split_of(config)}
    adjustments = store.query("SELECT * FROM ledger_adjustments WHERE period = $p ORDER BY made_at",
                              {"p": period.name})
    line_rows = [{**r, "cost_usd": _usd(r["cost_usd"])} for r in records(lines)]
    adjustment_rows = [{**r, "usd": _usd(r["usd"])} for r in records(adjustments)]
    return {"period": period.name, "start": period.start, "end": period.end,
            "closes_at": closes_at(period, config), **state,
            "coverage": coverage_of(store, period.start, period.end, now),
            "lines": line_rows, "adjustments": adjustment_rows,
            "teams": team_totals(line_rows, adjustment_rows),
            "total_usd": _cents(sum(_cents_of(r["cost_usd"]) for r in line_rows)
                                + sum(_cents_of(r["usd"]) for r in adjustment_rows))}


def team_total(teams: list[dict[str, Any]]) -> float:
    """The total of the team lines given (a team token's share of a statement), in cents."""
    return _cents(sum(_cents_of(t["total_usd"]) for t in teams))


def _cents_of(usd: float) -> int:
    return int(Decimal(str(usd)).scaleb(2).to_integral_value(ROUND_HALF_EVEN))


def _cents(cents: int) -> float:
    return float(Decimal(cents).scaleb(-2))


def team_totals(lines: list[dict[str, Any]], adjustments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per bill line: GPU-hours, usage cost, adjustments and the total, in cents; the idle-capacity line last."""
    teams: dict[str, dict[str, Any]] = {}
    for row in lines:
        team = teams.setdefault(row["team"], {"team": row["team"], "gpu_hours": 0.0, "usage": 0, "adjust": 0})
        team["gpu_hours"] += row["gpu_hours"]
        team["usage"] += _cents_of(row["cost_usd"])
    for row in adjustments:
        team = teams.setdefault(row["team"], {"team": row["team"], "gpu_hours": 0.0, "usage": 0, "adjust": 0})
        team["adjust"] += _cents_of(row["usd"])
    return [{"team": t["team"], "gpu_hours": t["gpu_hours"], "usage_usd": _cents(t["usage"]),
             "adjustments_usd": _cents(t["adjust"]), "total_usd": _cents(t["usage"] + t["adjust"])}
            for t in sorted(teams.values(), key=lambda t: (t["team"] == IDLE_CAPACITY, t["team"]))]


def adjust(store: Store, config: LedgerConfig, team: str, usd: Any, reason: str, corrects: str, by: str,
           configured: set[str], audit: Audit | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Book a correction of `corrects` for `team` (`usd` > 0 charges, < 0 credits) into the first open period at
    or after it, with who (`by`) and why (`reason`), audited in the same transaction. The team must be one of the
    `configured` teams, one the store has seen, or a line of a statement."""
    now = as_utc(now) if now else utc_now()
    target = parse_period(corrects, config.period)
    if target.start > now:
        raise LedgerError(f"period {target.name} has not started: there is nothing in it to correct")
    known = configured | set(store.teams()) | {UNATTRIBUTED, IDLE_CAPACITY} | set(
        store.query("SELECT DISTINCT team FROM statement_lines")["team"])
    if team not in known:
        raise NotFoundError(f"unknown team {team!r}: adjust a team of the config or of a statement")
    try:
        amount = Decimal(str(usd)).quantize(CENT, ROUND_HALF_EVEN)
    except (InvalidOperation, ValueError) as exc:
        raise LedgerError(f"usd must be an amount such as -125.50, got {usd!r}") from exc
    if not amount.is_finite() or amount != Decimal(str(usd)) or amount == 0 or abs(amount) > MAX_ADJUSTMENT_USD:
        raise LedgerError(f"usd must be an amount in whole cents, not zero, of at most {MAX_ADJUSTMENT_USD:,.0f} "
                          f"either way, got {usd!r}")
    reason = (reason or "").strip()
    if not reason or any(ord(c) < 32 or ord(c) == 127 for c in reason):
        raise LedgerError("an adjustment needs its reason (what it corrects and why), printable text only")
    first = _first_period(store, config)
    if first is not None and target.end <= first.start:
        raise LedgerError(f"period {target.name} is before the ledger's first period, {first.name}: nothing in it "
                          "was billed")
    first_open = _first_open(store, config)
    booked = target if first_open is None or target.start >= first_open.start else first_open
    entry = {"id": uuid.uuid4().hex[:12], "period": booked.name, "corrects": target.name, "team": team,
             "usd": amount, "reason": reason, "made_by": by, "made_at": now}
    book_adjustment(store, entry, audit)
    return {**entry, "usd": float(amount)}


def for_team(found: dict[str, Any], team: str) -> dict[str, Any]:
    """A statement narrowed to one team's lines and adjustments, its total the team's (NotFoundError naming the
    teams on it when the team has none)."""
    mine = [t for t in found["teams"] if t["team"] == team]
    if not mine:
        named = ", ".join(t["team"] for t in found["teams"]) or "none"
        raise NotFoundError(f"team {team!r} has no line on the statement of {found['period']} (teams on it: {named})")
    return {**found, "lines": [r for r in found["lines"] if r["team"] == team],
            "adjustments": [r for r in found["adjustments"] if r["team"] == team], "teams": mine,
            "total_usd": team_total(mine)}
