"""Kueue's queue state from its controller's metrics (`kueue_*`, facts from kueue's pkg/metrics/metrics.go and its
site's reference/metrics page): per ClusterQueue, the GPU quota in force and what it holds and waits for.

Read per ClusterQueue (label `cluster_queue`; the resource families add `cohort`, `flavor`, `resource`):
- `kueue_cluster_queue_nominal_quota`, `_borrowing_limit`, `_lending_limit`, `_resource_usage`,
  `_resource_reservation`: GPUs for `resource="nvidia.com/gpu"`; other resources (cpu, memory) are skipped.
  These are optional in Kueue (the ClusterQueue resource metrics setting): absent, no quota row is written.
- `kueue_pending_workloads{status="active"|"inadmissible"}`, `kueue_admitted_active_workloads`.
- `kueue_admission_wait_time_seconds` (histogram: `_bucket{le}`, `_sum`, `_count`): cumulative since the
  controller started, so a wait over a window is the difference of two reads (analytics/queues.py).
- `kueue_evicted_workloads_total{reason}`.
Newer Kueue adds `replica_role` to these: only the leader's (or a standalone controller's) figures are read.
Every other family is ignored; local-queue families (`kueue_local_queue_*`) repeat the cluster queues' figures
per namespace and are not read.
"""
from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Iterable

from gpuledger.collector.jobs.queues import GPU_RESOURCES, QueueBatch, queue_frame
from gpuledger.collector.prom_text import parse

SOURCE = "kueue"
RESOURCE_FIGURES = {"kueue_cluster_queue_nominal_quota": "quota_gpus",
                    "kueue_cluster_queue_borrowing_limit": "borrowing_limit_gpus",
                    "kueue_cluster_queue_lending_limit": "lending_limit_gpus",
                    "kueue_cluster_queue_resource_usage": "usage_gpus",
                    "kueue_cluster_queue_resource_reservation": "reserved_gpus"}
PENDING = {"active": "pending_workloads", "inadmissible": "inadmissible_workloads"}
WAIT = "kueue_admission_wait_time_seconds"


def parse_kueue(text: str, at: datetime) -> QueueBatch:
    """A Kueue controller's /metrics page (or the same families from Prometheus), read at `at`."""
    page = parse(text)
    return kueue_rows(page.samples, at, page.skipped())


def kueue_rows(samples: Iterable[tuple], at: datetime, skipped: Counter | None = None) -> QueueBatch:
    skipped = Counter() if skipped is None else skipped
    records: dict[tuple, dict] = {}
    for name, labels, value, _ in samples:
        if not name.startswith("kueue_") or name.startswith("kueue_local_queue_"):
            continue
        if labels.get("replica_role", "leader") not in ("leader", "standalone"):
            skipped["not_leader"] += 1  # an HA follower repeats the leader's figures (or has stale ones)
            continue
        queue = labels.get("cluster_queue")
        if not queue:
            skipped["no_cluster_queue"] += 1
            continue
        row = {"scheduler": SOURCE, "queue": queue, "cohort": labels.get("cohort") or None,
               "flavor": labels.get("flavor") or None, "figure": None, "detail": None, "value": value}
        if name in RESOURCE_FIGURES:
            if labels.get("resource") not in GPU_RESOURCES:
                skipped["not_gpu"] += 1
                continue
            row["figure"] = RESOURCE_FIGURES[name]
        elif name == "kueue_pending_workloads" and labels.get("status") in PENDING:
            row["figure"] = PENDING[labels["status"]]
        elif name == "kueue_admitted_active_workloads":
            row["figure"] = "admitted_workloads"
        elif name == f"{WAIT}_count":
            row["figure"] = "admitted_total"
        elif name == f"{WAIT}_sum":
            row["figure"] = "admission_wait_s_total"
        elif name == f"{WAIT}_bucket" and labels.get("le"):
            row["figure"], row["detail"] = "admission_wait_bucket", labels["le"]
        elif name == "kueue_evicted_workloads_total":
            row["figure"], row["detail"] = "evicted_total", labels.get("reason") or None
        else:
            continue
        key = (queue, row["flavor"], row["figure"], row["detail"])
        if key in records:  # the same series scraped twice (two Prometheus jobs): one figure, not a sum
            skipped["duplicate"] += 1
        records[key] = row
    return QueueBatch(queue_frame(list(records.values()), at, SOURCE, skipped), skipped)
