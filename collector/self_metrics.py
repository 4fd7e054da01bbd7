"""The collector's own Prometheus metrics, so that skipped input is counted rather than lost from view.

One registry per process keeps /metrics output stable and lets tests read counters back
without fighting over the global default registry.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
CHECKPOINT_SECONDS = Histogram("gpuledger_store_checkpoint_seconds",
                               "DuckDB checkpoints done when writers are idle: folding the WAL, or (daily) also "
                               "compacting row groups", ["kind"], registry=REGISTRY)


# --- agent: the path from a node to the central server -------------------------------------
AGENT_BATCHES_SENT = Counter("gpuledger_agent_batches_sent", "Batch send attempts", registry=REGISTRY)
AGENT_BATCHES_ACKED = Counter("gpuledger_agent_batches_acked", "Batches the server acknowledged",
                              ["outcome"], registry=REGISTRY)
AGENT_RETRIES = Counter("gpuledger_agent_batches_retried", "Sends that failed and will be retried",
                        ["reason"], registry=REGISTRY)
AGENT_DROPPED = Counter("gpuledger_agent_batches_dropped", "Spooled batches dropped because the spool was full",
                        registry=REGISTRY)
AGENT_REJECTED = Counter("gpuledger_agent_batches_rejected", "Batches the server refused as invalid",
                         registry=REGISTRY)
AGENT_SPOOL_BYTES = Gauge("gpuledger_agent_spool_bytes", "Bytes waiting in the spool", registry=REGISTRY)
AGENT_LAST_ACK = Gauge("gpuledger_agent_last_ack_timestamp_seconds", "When the server last acknowledged a batch",
                       registry=REGISTRY)

# --- server: central ingest ---------------------------------------------------------------
INGEST_ROWS_REJECTED = Counter("gpuledger_ingest_rows_rejected", "Rows refused at ingest, by reason",
                               ["reason"], registry=REGISTRY)
INGEST_VALUES_NULLED = Counter("gpuledger_ingest_values_nulled", "NaN/Inf values stored as NULL", registry=REGISTRY)
INGEST_DUPLICATE_BATCHES = Counter("gpuledger_ingest_duplicate_batches",
                                   "Batches acknowledged again without storing (retries, replays)", registry=REGISTRY)
INGEST_COMMIT_SECONDS = Histogram("gpuledger_ingest_commit_seconds", "Time to commit one group of batches",
                                  registry=REGISTRY)
INGEST_ROWS_PER_SECOND = Gauge("gpuledger_ingest_rows_per_second",
                               "Rows stored per second over the last minute", registry=REGISTRY)
NODE_LAST_SUCCESS = Gauge("gpuledger_node_last_success_timestamp_seconds",
                          "When a batch from this node was last stored", ["node"], registry=REGISTRY)


def counter_value(counter: Counter, **labels: str) -> float:
    """Current value of a (labelled) counter; used by tests and the CLI status line."""
    target = counter.labels(**labels) if labels else counter
    return target._value.get()  # prometheus_client exposes no public getter
