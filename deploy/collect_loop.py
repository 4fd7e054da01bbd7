"""Run a Source on an interval and append each batch to the store.

A failed read is logged and counted, and the loop carries on: a node that is briefly
unreachable must not stop collection from the others.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import pyarrow as pa

from gpuledger.analytics.store import Store
from gpuledger.collector.source import Source, SourceError

log = logging.getLogger(__name__)


class CollectLoop(threading.Thread):
    def __init__(self, source: Source, store: Store, interval_s: float,
                 after_batch: Callable[[], None] | None = None) -> None:
        super().__init__(name=f"collect-{source.name}", daemon=True)
        self.source = source
        self.store = store
        self.interval_s = interval_s
        self.after_batch = after_batch
        self.stop_event = threading.Event()
        self.started_at = time.monotonic()
        self.batches = 0
        self.failures = 0
        self.last_success: float | None = None  # monotonic time of the last stored batch
        self.last_error: str | None = None  # why the last read failed, while reads keep failing

    def health(self) -> tuple[bool, str | None]:
        """Healthy unless reads have failed for 3 intervals or more, with the reason."""
        if self.last_error is None:
            return True, None
        silent = time.monotonic() - (self.last_success or self.started_at)
        if silent < 3 * self.interval_s:
            return True, None
        return False, f"no batch from {self.source.name} for {silent:.0f}s: {self.last_error}"

    def collect_once(self, table: pa.Table | None = None) -> int:
        """Read the source (or store `table`, already read) and append it."""
        table = self.source.collect() if table is None else table
        rows = self.store.append_samples(table)
        processes = self.source.process_rows()
        if processes is not None and processes.num_rows:
            self.store.append_processes(processes)
        self.batches += 1
        self.last_success, self.last_error = time.monotonic(), None
        self.store.checkpoint_if_due()  # between batches, never inside an append
        if self.after_batch:
            self.after_batch()
        return rows

    def run(self) -> None:
        self.started_at = time.monotonic()
        while not self.stop_event.is_set():
            try:
                self.collect_once()
            except SourceError as exc:
                self.failures += 1
                self.last_error = str(exc)
                log.warning("%s", exc)
            except Exception as exc:  # keep collecting; the traceback is in the log
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("collection from %s failed", self.source.name)
            # a source reading history (Prometheus backfill) says so: read the next chunk at once
            self.stop_event.wait(0 if self.source.catching_up and not self.last_error
                                 else self.interval_s)

    def stop(self) -> None:
        self.stop_event.set()
