"""The agent's own Prometheus metrics: the path of each batch from this node to the central server."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry(auto_describe=True)

AGENT_BATCHES_SENT = Counter("gpuledger_agent_batches_sent", "Batch send attempts", registry=REGISTRY)
AGENT_BATCHES_ACKED = Counter("gpuledger_agent_batches_acked", "Batches the server acknowledged",
                              ["outcome"], registry=REGISTRY)
AGENT_RETRIES = Counter("gpuledger_agent_batches_retried", "Sends that failed and will be retried",
                        ["reason"], registry=REGISTRY)
AGENT_HELD_IN_MEMORY = Counter("gpuledger_agent_batches_held_in_memory",
                               "Batches the spool could not write (disk full), held in memory until sent",
                               registry=REGISTRY)
AGENT_DROPPED = Counter("gpuledger_agent_batches_dropped", "Spooled batches dropped because the spool was full",
                        registry=REGISTRY)
AGENT_REJECTED = Counter("gpuledger_agent_batches_rejected", "Batches the server refused as invalid",
                         registry=REGISTRY)
AGENT_SPOOL_BYTES = Gauge("gpuledger_agent_spool_bytes", "Bytes waiting in the spool", registry=REGISTRY)
AGENT_LAST_ACK = Gauge("gpuledger_agent_last_ack_timestamp_seconds", "When the server last acknowledged a batch",
                       registry=REGISTRY)
