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
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.source import TOPOLOGY_EVERY_S, Source, SourceError

log = logging.getLogger(__name__)


class PollingLoop(threading.Thread):
    """A thread that does one read on an interval: a failed read is counted, logged and retried on the next
    interval, never stopping the server; `health` says when reads have failed for 3 intervals or more. Subclasses
    give `poll` (one read, stored), `silence` (how /healthz words a silent loop) and `failing` (how the log words an
    unexpected failure)."""

    silence = "no read from"
    failing = "reading from"

    def __init__(self, name: str, source_name: str, interval_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self.reads_from = source_name
        self.interval_s = interval_s
        self.stop_event = threading.Event()
        self.started_at = time.monotonic()
        self.failures = 0
        self.last_success: float | None = None  # monotonic time of the last stored read
        self.last_error: str | None = None  # why the last read failed, while reads keep failing

    def poll(self) -> object:
        raise NotImplementedError

    def succeeded(self) -> None:
        """A read was stored: the loop is healthy again."""
        self.last_success, self.last_error = time.monotonic(), None

    def wait_s(self) -> float:
        """How long to wait before the next read."""
        return self.interval_s

    def health(self) -> tuple[bool, str | None]:
        """Healthy unless reads have failed for 3 intervals or more, with the reason."""
        if self.last_error is None:
            return True, None
        silent = time.monotonic() - (self.last_success or self.started_at)
        if silent < 3 * self.interval_s:
            return True, None
        return False, f"{self.silence} {self.reads_from} for {silent:.0f}s: {self.last_error}"

    def run(self) -> None:
        self.started_at = time.monotonic()
        while not self.stop_event.is_set():
            try:
                self.poll()
            except SourceError as exc:
                self.failures += 1
                self.last_error = str(exc)
                log.warning("%s", exc)
            except Exception as exc:  # keep reading; the traceback is in the log
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("%s %s failed", self.failing, self.reads_from)
            self.stop_event.wait(self.wait_s())

    def stop(self) -> None:
        self.stop_event.set()


class CollectLoop(PollingLoop):
    silence = "no batch from"
    failing = "collection from"

    def __init__(self, source: Source, store: Store, interval_s: float,
                 after_batch: Callable[[], None] | None = None) -> None:
        super().__init__(f"collect-{source.name}", source.name, interval_s)
        self.source = source
        self.store = store
        self.after_batch = after_batch
        self.batches = 0
        self.topology_due = 0.0  # monotonic time the source's topology is next read (at the first batch)

    def collect_once(self, table: pa.Table | None = None) -> int:
        """Read the source (or store `table`, already read) and append it."""
        table = self.source.collect() if table is None else table
        rows = self.store.append_samples(table)
        processes = self.source.process_rows()
        if processes is not None and processes.num_rows:
            self.store.append_processes(processes)
        self.batches += 1
        self.succeeded()
        self.record_topology()
        self.store.checkpoint_if_due()  # between batches, never inside an append
        if self.after_batch:
            self.after_batch()
        return rows

    poll = collect_once

    def record_topology(self) -> int:
        """Every TOPOLOGY_EVERY_S, store the nodes' topology the source reports where it changed; a failure is
        logged and never costs the batch already stored. Returns the snapshots stored."""
        if time.monotonic() < self.topology_due:
            return 0
        self.topology_due = time.monotonic() + TOPOLOGY_EVERY_S
        try:
            now = utc_now()
            return sum(self.store.record_topology(found, now) for found in self.source.topology())
        except Exception:  # topology is an aside: the samples are what the loop is for
            log.exception("topology from %s not stored", self.reads_from)
            return 0

    def wait_s(self) -> float:
        # a source reading history (Prometheus backfill) says so: read the next chunk at once
        return 0 if self.source.catching_up and not self.last_error else self.interval_s
