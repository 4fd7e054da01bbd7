"""Read the schedulers' job lifecycle and queues on an interval (collector/jobs/prometheus_jobs.py, or Slurm's own
commands: collector/jobs/slurm_commands.py) and store them: the pods or Slurm jobs as jobs with their events, those
no longer listed as left the queue, the queue metrics. A failed read is logged and retried on the next interval,
like the sample collect loop; it never stops the server."""
from __future__ import annotations

import logging
import time
from typing import Protocol

from gpuledger.analytics.store import Store
from gpuledger.collector.jobs.lifecycle import LEFT_QUEUE
from gpuledger.collector.jobs.prometheus_jobs import LifecycleRead
from gpuledger.deploy.collect_loop import PollingLoop

log = logging.getLogger(__name__)


def store_read(store: Store, read: LifecycleRead, source_name: str) -> dict[str, int]:
    """One lifecycle read into the store: its jobs and events (a job read again replaces itself), restarts, node
    labels, queue figures, and the source's stored open jobs it no longer lists marked as having left the queue.
    The loop here and `POST /v1/jobs/slurm` (a sender on the Slurm controller) store a read the same way."""
    restarts = store.record_restarts(read.jobs.jobs, read.at, source_name)
    store.set_node_labels(read.jobs.node_labels, read.at)
    return {"jobs": store.record_jobs(read.jobs.jobs, read.jobs.events), "restarts": restarts,
            "queue_rows": store.record_queue_metrics(read.queues),
            "left_queue": store.close_left_queue(source_name, read.listed_now, read.at, LEFT_QUEUE)}


class LifecycleSource(Protocol):
    name: str
    source_name: str

    def read(self) -> LifecycleRead: ...


class JobLoop(PollingLoop):
    silence = "no job lifecycle read from"
    failing = "reading jobs from"

    def __init__(self, source: LifecycleSource, store: Store, interval_s: float = 60.0) -> None:
        super().__init__(f"jobs-{source.name}", source.name, interval_s)
        self.source = source
        self.store = store
        self.reads = 0
        self.missing: list[str] = []  # what the last read found absent in Prometheus

    def read_once(self) -> dict[str, int]:
        """One read, stored: what was stored (jobs, queue rows, jobs that left the queue)."""
        read = self.source.read()
        stored = store_read(self.store, read, self.source.source_name)
        skipped = read.jobs.skipped + read.skipped
        if self.reads == 0 or any(stored.values()):
            log.info("%s: stored %s%s", self.source.name, ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in
                                                                      stored.items()),
                     f"; skipped {dict(skipped)}" if skipped else "")
        if read.missing != self.missing:
            for what in read.missing:
                log.warning("%s: not found: %s", self.source.name, what)
        self.missing = read.missing
        self.reads += 1
        self.succeeded()
        return stored

    def state(self) -> dict:
        """For /healthz: the source, reads so far, the last error while reads fail, and what Prometheus lacks."""
        return {"source": self.source.name, "reads": self.reads, "failures": self.failures,
                "last_error": self.last_error, "missing": list(self.missing),
                "seconds_since_read": None if self.last_success is None
                else round(time.monotonic() - self.last_success, 1)}

    poll = read_once
