"""The collector's own Prometheus metrics, so that skipped input is counted rather than lost from view.

One registry per process keeps /metrics output stable and lets tests read counters back
without fighting over the global default registry.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

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
BATCHES_WRITTEN = Counter(
    "gpuledger_ingest_batches", "Sample batches appended to the store", registry=REGISTRY
)
ROWS_WRITTEN = Counter("gpuledger_ingest_rows", "Sample rows appended to the store", registry=REGISTRY)


def counter_value(counter: Counter, **labels: str) -> float:
    """Current value of a (labelled) counter; used by tests and the CLI status line."""
    target = counter.labels(**labels) if labels else counter
    return target._value.get()  # prometheus_client exposes no public getter
