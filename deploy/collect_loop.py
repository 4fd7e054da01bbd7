"""Run a Source on an interval and append each batch to the store.

A failed read is logged and counted, and the loop carries on: a node that is briefly
unreachable must not stop collection from the others.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

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
        self.batches = 0
        self.failures = 0

    def collect_once(self) -> int:
        table = self.source.collect()
        rows = self.store.append_samples(table)
        processes = getattr(self.source, "processes", None)
        if processes is not None and processes.num_rows:
            self.store.append_processes(processes)
        self.batches += 1
        self.store.checkpoint_if_due()  # between batches, never inside an append
        if self.after_batch:
            self.after_batch()
        return rows

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.collect_once()
            except SourceError as exc:
                self.failures += 1
                log.warning("%s", exc)
            except Exception:  # keep collecting; the traceback is in the log
                self.failures += 1
                log.exception("collection from %s failed", self.source.name)
            self.stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self.stop_event.set()
