"""A time limit on the store's reads: a read still running at its deadline is interrupted, not left to hold a thread.

Why: the API's reads run on a pool of worker threads; a read that runs for minutes (a window of a year at 10,000
GPUs) holds its thread, and enough of them starve every other caller. The server sets a deadline per request
(deploy/api/read_limits.py) in a context variable, which follows the request into the worker thread that runs it;
every cursor the store opens for that request is registered with one watcher thread, which interrupts it when the
deadline passes. DuckDB then raises `INTERRUPTED` in the reading thread, and the API answers 503 with the reason.
Writes (the ingest writer, the fold) run outside any request and have no deadline.
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
import weakref
from contextvars import ContextVar
from typing import Any

import duckdb

READ_DEADLINE: ContextVar[float | None] = ContextVar("gpuledger_read_deadline", default=None)  # time.monotonic()
INTERRUPTED = duckdb.InterruptException  # what a read interrupted at its deadline raises


class _Watcher:
    """One thread for every deadline: a heap of (deadline, cursor), each cursor interrupted when its time comes (a
    cursor closed before then is gone from its weak reference, or refuses the interrupt: either way nothing)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, cursor: Any, deadline: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._order), weakref.ref(cursor)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="read-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _, _, ref = heapq.heappop(self._heap)
            cursor = ref()
            if cursor is not None:
                try:
                    cursor.interrupt()
                except Exception:  # noqa: BLE001 - closed, or already finished: nothing to stop
                    pass


_WATCHER = _Watcher()


def watched(cursor: Any) -> Any:
    """`cursor`, interrupted at the current request's read deadline when there is one."""
    deadline = READ_DEADLINE.get()
    if deadline is not None:
        _WATCHER.watch(cursor, deadline)
    return cursor
