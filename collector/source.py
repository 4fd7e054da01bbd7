"""The small interface every telemetry source implements."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import pyarrow as pa

from gpuledger.collector.errors import GpuledgerError


class SourceError(GpuledgerError):
    """A whole read failed (exporter unreachable, NVML not loaded): the caller retries next interval."""


@runtime_checkable
class Source(Protocol):
    """Reads one batch of GPU samples (SAMPLE_SCHEMA) for the current instant.

    Sources skip and count what they cannot read instead of raising, so that one bad
    field never loses a node's batch; only a read that produced nothing at all raises
    SourceError.
    """

    name: str

    def collect(self) -> pa.Table: ...
