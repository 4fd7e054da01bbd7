"""Reporting windows: rolling day counts and ISO weeks, always timezone-aware UTC."""
from __future__ import annotations

import math
import re
from datetime import date, datetime, time, timedelta, timezone

from gpuledger.collector.errors import InputError

_ISO_WEEK = re.compile(r"^(\d{4})-W(\d{2})$")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)  # no GPU telemetry is older; year 1 overflowed (a 500)
LATEST = datetime(2200, 1, 1, tzinfo=timezone.utc)
MAX_BUCKETS = 20_000  # points of one time series in an answer: 14 days at 1 minute, 366 days at 30 minutes
NICE_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 60, 120, 180, 240, 360, 720, 1440)  # what a coarser bucket is rounded up to


def rolling(days: float, end: datetime | None = None) -> tuple[datetime, datetime]:
    """The window [end - days, end); InputError (422) for an end or start outside 2000..2200, which the store has
    no data for and which date arithmetic overflows on (`end=0001-01-01` answered 500 on every windowed route)."""
    end = as_utc(end) if end else utc_now()
    if not EARLIEST <= end <= LATEST:
        raise InputError(f"end {end.isoformat()} is outside {EARLIEST:%Y-%m-%d}..{LATEST:%Y-%m-%d}")
    try:
        start = end - timedelta(days=days)
    except OverflowError as exc:
        raise InputError(f"a window of {days:g} days before {end.isoformat()} starts before year 1") from exc
    if start < EARLIEST:
        raise InputError(f"a window of {days:g} days before {end.isoformat()} starts before {EARLIEST:%Y-%m-%d}")
    return start, end


def buckets_in(days: float, bucket_minutes: int) -> int:
    """Time buckets of `bucket_minutes` in a window of `days`."""
    return math.ceil(days * 1440 / bucket_minutes)


def fitting_bucket(days: float, series: int = 1, max_points: int = MAX_BUCKETS) -> int:
    """The smallest of NICE_BUCKETS (or whole days) at which `series` series over `days` stay within
    `max_points` points in all."""
    series = max(1, series)
    for minutes in NICE_BUCKETS:
        if buckets_in(days, minutes) * series <= max_points:
            return minutes
    return 1440 * math.ceil(days * series / max_points)


def check_buckets(days: float, bucket_minutes: int, series: int = 1, max_points: int = MAX_BUCKETS) -> None:
    """InputError (422) when `series` series of `days` at `bucket_minutes` exceed `max_points` points, saying
    which bucket fits: an answer's size is bounded before it is computed (366 days at 1 minute was 43 MB)."""
    points = buckets_in(days, bucket_minutes) * max(1, series)
    if points > max_points:
        raise InputError(f"{days:g} days at bucket_minutes={bucket_minutes} is {points} points"
                         f"{f' ({series} series)' if series > 1 else ''}, over {max_points}: use "
                         f"bucket_minutes={fitting_bucket(days, series, max_points)} or more, or fewer days")


def iso_week(spec: str | None = None, now: datetime | None = None) -> tuple[datetime, datetime, str]:
    """Bounds of an ISO week 'YYYY-Www', of the last complete week when spec is None or 'last', or of the week
    in progress for 'current'."""
    if spec in (None, "", "last", "current"):
        today = (as_utc(now) if now else utc_now()).date()
        monday = today - timedelta(days=today.weekday() + (0 if spec == "current" else 7))
    else:
        match = _ISO_WEEK.match(spec)
        if not match:
            raise InputError(f"week must look like 2026-W48, 'last' or 'current', got {spec!r}")
        try:
            monday = date.fromisocalendar(int(match.group(1)), int(match.group(2)), 1)
        except ValueError as exc:
            raise InputError(f"no such ISO week: {spec}") from exc
    start = datetime.combine(monday, time(0), tzinfo=timezone.utc)
    year, week, _ = monday.isocalendar()
    return start, start + timedelta(days=7), f"{year}-W{week:02d}"
