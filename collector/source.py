"""The small interface every telemetry source implements."""
from __future__ import annotations

from datetime import datetime

import pyarrow as pa

from gpuledger.collector.errors import UnavailableError
from gpuledger.collector.topology import NodeTopology

# how often the collect loop and the agent ask a source for its nodes' topology: it changes with hardware and
# driver state, not load, and the store keeps a new row only when it changed
TOPOLOGY_EVERY_S = 600.0


class SourceError(UnavailableError):
    """A whole read failed (exporter unreachable, NVML not loaded): the caller retries next interval."""


class Source:
    """Reads one batch of GPU samples (SAMPLE_SCHEMA) for the current instant.

    Sources skip and count what they cannot read instead of raising, so that one bad
    field never loses a node's batch; only a read that produced nothing at all raises
    SourceError.

    The optional abilities have defaults here, so the agent and the collect loop call them on any source instead
    of probing for them: a source that has one overrides it.
    """

    name: str
    # a source reading history (the Prometheus backfill) says more is waiting: the loop reads again at once
    catching_up: bool = False
    # the samples' `source` value of a source that reads history, so a restarted server resumes after what it stored
    source_name: str | None = None

    def collect(self) -> pa.Table:
        raise NotImplementedError

    def collect_step(self, step: int) -> pa.Table:
        """The batch of the agent's `step`-th read: a source replaying a timeline (the simulator) reads that step;
        the others read now."""
        return self.collect()

    def resume_after(self, newest: datetime | None) -> None:
        """Carry on after `newest`, the newest sample this source stored before (a restarted server): only a
        source that reads history needs it."""

    def process_rows(self) -> pa.Table | None:
        """The per-process readings of the last `collect` (NVML: which process held what memory), None where a
        source reads none."""
        return None

    def topology(self) -> list[NodeTopology]:
        """The GPU topology of the nodes this source reads (collector/topology.py); [] where it cannot say."""
        return []
