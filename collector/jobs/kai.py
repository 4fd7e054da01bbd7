"""KAI Scheduler's queue state from its metrics (facts from KAI's docs/metrics and its queue controller's and
scheduler's metrics code): per queue, the deserved GPUs (its quota), what it holds and the fair share the
scheduler computed.

Families, under KAI's metric namespace (`kai_` by default, set per component with `--metrics-namespace`, so any
prefix is accepted, and none):
- `<ns>_queue_deserved_gpus{queue_name}`: the queue's deserved quota (KAI `spec.resources.gpu.quota`);
  older queue controllers give it only as the `gpu_guaranteed_quota` label of `<ns>_queue_info`.
- `<ns>_queue_allocated_gpus{queue_name}`: GPUs its workloads hold now.
- `<ns>_queue_fair_share_gpu{queue_name}`: the scheduler's fair share this cycle.
A negative quota is KAI's "unlimited": stored with no value and `detail` "unlimited", never as -1 GPUs. A NaN is
dropped and counted with the other figures no scheduler could publish (queues.py).
"""
from __future__ import annotations

import re
from collections import Counter
from datetime import datetime
from typing import Iterable

from gpuledger.collector.jobs.queues import QueueBatch, queue_frame
from gpuledger.collector.prom_text import parse

SOURCE = "kai"
FAMILY = re.compile(r"^(?:[a-zA-Z_:][a-zA-Z0-9_:]*_)?queue_(deserved_gpus|allocated_gpus|fair_share_gpu|info)$")
FIGURES = {"deserved_gpus": "quota_gpus", "allocated_gpus": "usage_gpus", "fair_share_gpu": "fair_share_gpus"}


def parse_kai(text: str, at: datetime) -> QueueBatch:
    """A KAI queue controller's or scheduler's /metrics page (or the same families from Prometheus), at `at`."""
    page = parse(text)
    return kai_rows(page.samples, at, page.skipped())


def kai_rows(samples: Iterable[tuple], at: datetime, skipped: Counter | None = None) -> QueueBatch:
    skipped = Counter() if skipped is None else skipped
    records: dict[tuple[str, str], dict] = {}
    info_quota: dict[str, float] = {}
    for name, labels, value, _ in samples:
        match = FAMILY.match(name)
        if not match or name.startswith("kueue_"):
            continue
        queue = labels.get("queue_name")
        if not queue:
            skipped["no_queue_name"] += 1
            continue
        if match.group(1) == "info":
            try:
                info_quota[queue] = float(labels["gpu_guaranteed_quota"])
            except (KeyError, ValueError):
                pass
            continue
        records[(queue, FIGURES[match.group(1)])] = _row(queue, FIGURES[match.group(1)], value)
    for queue, quota in info_quota.items():
        records.setdefault((queue, "quota_gpus"), _row(queue, "quota_gpus", quota))
    return QueueBatch(queue_frame(list(records.values()), at, SOURCE, skipped), skipped)


def _row(queue: str, figure: str, value: float) -> dict:
    unlimited = value < 0
    return {"scheduler": SOURCE, "queue": queue, "cohort": None, "flavor": None, "figure": figure,
            "detail": "unlimited" if unlimited else None, "value": None if unlimited else value}
