"""The store's own Prometheus metrics: what reached DuckDB, what central ingest refused, and checkpoint time."""
from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

BATCHES_WRITTEN = Counter("gpuledger_ingest_batches", "Sample batches appended to the store", registry=REGISTRY)
ROWS_WRITTEN = Counter("gpuledger_ingest_rows", "Sample rows appended to the store", registry=REGISTRY)
CHECKPOINT_SECONDS = Histogram("gpuledger_store_checkpoint_seconds",
                               "DuckDB checkpoints done when writers are idle: folding the WAL, or (daily) also "
                               "compacting row groups", ["kind"], registry=REGISTRY)
INGEST_ROWS_REJECTED = Counter("gpuledger_ingest_rows_rejected", "Rows refused at ingest, by reason",
                               ["reason"], registry=REGISTRY)
INGEST_ROWS_HELD = Counter("gpuledger_ingest_rows_held", "Rows of a GPU not registered to the sending node, held "
                           "until an admin moves the GPU (analytics/store/gpu_inventory.py), by reason", ["reason"],
                           registry=REGISTRY)
INGEST_ROWS_UNATTRIBUTED = Counter("gpuledger_ingest_rows_unattributed", "Rows stored without the job they claimed, "
                                   "by reason (job_not_on_node: its scheduler places the job on other nodes)",
                                   ["reason"], registry=REGISTRY)
INGEST_ROWS_CLIPPED = Counter("gpuledger_ingest_rows_clipped", "Rows whose interval was cut where it overlapped an "
                              "instant of the same GPU already billed (analytics/store/gpu_time.py)", registry=REGISTRY)
INGEST_SECONDS_CLIPPED = Counter("gpuledger_ingest_seconds_clipped", "Seconds cut from rows' intervals where they "
                                 "overlapped an instant of the same GPU already billed", registry=REGISTRY)
INGEST_VALUES_NULLED = Counter("gpuledger_ingest_values_nulled", "NaN/Inf values stored as NULL", registry=REGISTRY)
INGEST_DUPLICATE_BATCHES = Counter("gpuledger_ingest_duplicate_batches",
                                   "Batches acknowledged again without storing (retries, replays)", registry=REGISTRY)
INGEST_REQUESTS_DEFERRED = Counter("gpuledger_ingest_requests_deferred",
                                   "Push requests answered 503 because their group could not be committed (nothing "
                                   "stored; the agent resends), by reason", ["reason"], registry=REGISTRY)
HTTP_REFUSED = Counter("gpuledger_http_refused",
                       "Connections and requests the server refused before doing their work (deploy/server.py, "
                       "deploy/api/limits.py), by reason: body_too_large, no_token, unpacked_too_large, "
                       "client_connections, head_timeout, body_timeout", ["reason"], registry=REGISTRY)
AUDIT_DEFERRED = Counter("gpuledger_audit_entries_deferred",
                         "Audit entries the store could not write at once (kept in memory, written with the next)",
                         registry=REGISTRY)
INGEST_COMMIT_SECONDS = Histogram("gpuledger_ingest_commit_seconds", "Time to commit one group of batches",
                                  registry=REGISTRY)
INGEST_ROWS_PER_SECOND = Gauge("gpuledger_ingest_rows_per_second",
                               "Rows stored per second over the last minute", registry=REGISTRY)


class RowRate:
    """Rows stored per second over the last minute, whoever stores them (agents' pushes or the server's own
    collection), kept in INGEST_ROWS_PER_SECOND."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._recent: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def add(self, rows: int) -> None:
        with self._lock:
            clock = time.monotonic()
            self._recent.append((clock, rows))
            while self._recent and self._recent[0][0] < clock - self.window_s:
                self._recent.popleft()
            span = max(clock - self._recent[0][0], 1.0)
            INGEST_ROWS_PER_SECOND.set(sum(r for _, r in self._recent) / span)


ROW_RATE = RowRate()
NODE_LAST_SUCCESS = Gauge("gpuledger_node_last_success_timestamp_seconds",
                          "When a batch from this node was last stored", ["node"], registry=REGISTRY)
ROLLUP_WATERMARK = Gauge("gpuledger_rollup_watermark_timestamp_seconds",
                         "Minutes before this instant are folded into the rollups; alert when it falls behind (the "
                         "analytics then aggregate more raw samples on every query)", registry=REGISTRY)
ROLLUP_BEHIND = Gauge("gpuledger_rollup_behind_seconds",
                      "How far the rollups' watermark is behind the newest sample (a backlog being folded when large)",
                      registry=REGISTRY)
ROLLUP_FOLD_RATE = Gauge("gpuledger_rollup_fold_minutes_per_second",
                         "Minutes of samples folded per second of work in the last fold step", registry=REGISTRY)
ROLLUP_FOLD_SECONDS = Histogram("gpuledger_rollup_fold_seconds", "Time to fold closed minutes into the rollups",
                                registry=REGISTRY)
RETENTION_ROWS_DROPPED = Counter("gpuledger_retention_rows_dropped",
                                 "Rows dropped by retention once folded, by table", ["table"], registry=REGISTRY)
ALERT_DELIVERIES = Counter("gpuledger_alert_deliveries",
                           "Alert messages (firing or resolved) handed to a channel, by channel (email, webhook) "
                           "and outcome (sent, failed: after its retries)", ["channel", "outcome"], registry=REGISTRY)
ALERT_RETRIES = Counter("gpuledger_alert_delivery_retries", "Alert deliveries tried again after a failure, by channel",
                        ["channel"], registry=REGISTRY)
