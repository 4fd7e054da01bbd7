"""Reporting windows: rolling day counts and ISO weeks, always timezone-aware UTC."""
from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta, timezone

from gpuledger.collector.errors import InputError

_ISO_WEEK = re.compile(r"^(\d{4})-W(\d{2})$")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def rolling(days: float, end: datetime | None = None) -> tuple[datetime, datetime]:
    end = as_utc(end) if end else utc_now()
    return end - timedelta(days=days), end


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
