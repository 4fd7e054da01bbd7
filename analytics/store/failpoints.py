"""Failpoints: named places where a fault test can make the server wait, so a crash lands exactly there.

Set `GPULEDGER_FAILPOINTS=group_commit=2.5` and every group commit pauses 2.5 s after its rows are inserted and
before COMMIT, logging that it does; the fault test kills the process with -9 when the line appears. Unset (always,
in production), a failpoint costs one dictionary lookup.
"""
from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)
ENV = "GPULEDGER_FAILPOINTS"


def _parse(text: str) -> dict[str, float]:
    points = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, seconds = item.partition("=")
        points[name] = float(seconds or 1)
    return points


POINTS = _parse(os.environ.get(ENV, ""))


def pause(name: str) -> None:
    """Wait here for the configured seconds, when the failpoint `name` is set."""
    seconds = POINTS.get(name)
    if seconds:
        log.warning("failpoint %s: pausing %.1f s", name, seconds)
        time.sleep(seconds)
