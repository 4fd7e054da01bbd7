"""Turn cumulative counters (NVLink bytes, energy) into per-interval rates.

A counter that goes down was reset (driver reload, GPU reset) or wrapped: that interval
gets no rate rather than a negative one. A gap longer than `max_gap_intervals` gets no
rate either, since an average over hours of silence would smear a burst across them.
"""
from __future__ import annotations

from typing import Hashable


class RateTracker:
    def __init__(self, interval_s: float, max_gap_intervals: float = 3.0) -> None:
        self.interval_s = interval_s
        self.max_gap_s = max_gap_intervals * interval_s
        self._last: dict[Hashable, tuple[float, float]] = {}
        self.resets = 0
        self.gaps = 0

    def rate(self, key: Hashable, now_s: float, total: float) -> float | None:
        """Per-second rate since the previous reading of `key`, or None for the first, a reset or a gap."""
        previous = self._last.get(key)
        self._last[key] = (now_s, total)
        if previous is None:
            return None
        then, before = previous
        elapsed = now_s - then
        if elapsed <= 0:
            return None
        if total < before:
            self.resets += 1
            return None
        if elapsed > self.max_gap_s:
            self.gaps += 1
            return None
        return (total - before) / elapsed
