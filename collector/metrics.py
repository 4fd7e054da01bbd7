"""The collector's own Prometheus metrics, so that skipped input is counted rather than lost from view.

Each room keeps its metrics in its own registry (this one; the agent's; the store's), and a
process exports exactly the registries of the parts it runs (`exported`): a central server
shows no agent series, an agent no ingest series.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)

SAMPLES_READ = Counter(
    "gpuledger_collector_samples_read", "GPU samples produced by a source", ["source"], registry=REGISTRY
)
PARSE_ERRORS = Counter(
    "gpuledger_collector_parse_errors",
    "Exposition lines or values skipped while parsing, by kind",
    ["kind"],
    registry=REGISTRY,
)
SCRAPE_ERRORS = Counter(
    "gpuledger_collector_scrape_errors", "Failed scrapes or device reads, by source and reason",
    ["source", "reason"], registry=REGISTRY,
)
SCRAPE_SECONDS = Histogram(
    "gpuledger_collector_scrape_seconds", "Time to read one batch from a source", ["source"], registry=REGISTRY
)


def exported(*parts: CollectorRegistry | Collector) -> CollectorRegistry:
    """One registry for a process's /metrics holding the given rooms' registries (and any other collectors)."""
    combined = CollectorRegistry(auto_describe=False)
    combined.register(_Rooms(parts))
    return combined


class _Rooms(Collector):
    def __init__(self, parts: Iterable[CollectorRegistry | Collector]) -> None:
        self.parts = tuple(parts)

    def collect(self) -> Iterator:
        for part in self.parts:
            yield from part.collect()


def sample_value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A metric's current value as /metrics shows it (0 when never touched); tests and status lines read it."""
    return registry.get_sample_value(name, labels) or 0.0
