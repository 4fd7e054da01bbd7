"""The one shape every scheduler-queue reader produces: what the scheduler itself says of its queues at an instant
(the quota in force, what the queue uses, how many workloads wait, how long admission took), as rows of the
`queue_metrics` table, and what was skipped and why.

Long rows (one figure per row) because the schedulers publish different figures: Kueue a nominal quota with
borrowing and lending limits per flavor and an admission-wait histogram, KAI a deserved quota and a fair share per
queue. A figure a scheduler does not publish is no row, never a zero.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import pandas as pd

SCHEDULERS = ("kueue", "kai", "slurm")
# gpuledger's names for what the schedulers publish, GPUs in devices; `_total` figures are cumulative counters
QUEUE_FIGURES = (
    "quota_gpus",            # Kueue nominalQuota / KAI deserved: the guarantee in force
    "borrowing_limit_gpus",  # Kueue: most it may borrow above its quota
    "lending_limit_gpus",    # Kueue: most of its quota others may borrow
    "fair_share_gpus",       # KAI: the fair share the scheduler computed this cycle
    "limit_gpus",            # Slurm: GrpTRES gres/gpu, the most GPUs the account's jobs hold at once
    "fairshare_shares",      # Slurm: the account's raw shares (Fairshare); `detail` "parent" where it has its parent's
    "usage_gpus",            # GPUs its admitted workloads hold
    "reserved_gpus",         # Kueue: GPUs reserved (quota reservation, before admission checks)
    "pending_workloads",     # waiting to be admitted (Kueue status=active)
    "inadmissible_workloads",  # Kueue: tried and not admissible until the cluster changes
    "admitted_workloads",    # admitted and running now
    "admitted_total",        # Kueue: workloads admitted so far (the admission-wait histogram's count)
    "admission_wait_s_total",  # Kueue: their summed wait, seconds
    "admission_wait_bucket",   # Kueue: cumulative bucket count; `detail` is the bucket's upper bound (le)
    "evicted_total",         # Kueue: workloads evicted so far; `detail` is the reason (Preempted, ...)
)
QUEUE_COLUMNS = ("ts", "scheduler", "queue", "cohort", "flavor", "figure", "detail", "value", "source")
GPU_RESOURCES = ("nvidia.com/gpu",)  # the Kubernetes resource names counted as GPUs


@dataclass
class QueueBatch:
    """What one read of a scheduler's metrics gives: rows (QUEUE_COLUMNS) and the samples skipped, by reason."""
    rows: pd.DataFrame
    skipped: Counter = field(default_factory=Counter)


def _holds(record: dict) -> bool:
    """A figure a scheduler can publish: a count or GPU amount that is finite and not negative (a missing value is
    kept where the record says why, e.g. unlimited), and a histogram bucket whose bound is a number or +Inf."""
    value = record["value"]
    if value is None:
        return record.get("detail") is not None
    if not (math.isfinite(value) and value >= 0):
        return False
    if record["figure"] == "admission_wait_bucket":
        try:
            return record["detail"] == "+Inf" or math.isfinite(float(record["detail"]))
        except (TypeError, ValueError):
            return False
    return True


def queue_frame(records: list[dict], at: datetime, source: str, skipped: Counter | None = None) -> pd.DataFrame:
    """Rows for `records` (scheduler, queue, cohort, flavor, figure, detail, value), all taken at `at`; a figure
    no scheduler could publish (negative, infinite, a bucket bound that is no number) is dropped and counted
    (`bad_value`)."""
    kept = [r for r in records if _holds(r)]
    if skipped is not None and len(kept) < len(records):
        skipped["bad_value"] += len(records) - len(kept)
    records = kept
    frame = pd.DataFrame(records, columns=[c for c in QUEUE_COLUMNS if c not in ("ts", "source")])
    frame.insert(0, "ts", pd.Timestamp(at).tz_convert("UTC") if pd.Timestamp(at).tzinfo
                 else pd.Timestamp(at, tz="UTC"))
    frame["source"] = source
    frame["value"] = frame["value"].astype("float64")
    return frame[list(QUEUE_COLUMNS)]
