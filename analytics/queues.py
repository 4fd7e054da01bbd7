"""The schedulers' own view of their queues (collector/jobs/kueue.py, kai.py): the quota each queue has in force,
what it holds, what waits, and Kueue's admission waits; so queue state and quotas come from the scheduler, not only
from gpuledger's config, and the plan can be compared with what runs (policies/scheduler_state.py).

The latest read per scheduler is "now"; a read older than `stale_after` is reported with its age, never as current.
Admission waits over a window come from Kueue's cumulative histogram: the difference between the last read in the
window and the last one before it (or the first in it; with one read only, the growth is unknown: null); a counter
that went down (the controller restarted) counts from zero. Percentiles are interpolated inside the buckets as
Prometheus' histogram_quantile does; a queue that admitted nothing in the window has no wait (null), not zero.
"""
from __future__ import annotations

import math
from datetime import datetime

import pandas as pd

from gpuledger.analytics.store import Store

# the per-queue figures a snapshot shows, in this order (collector/jobs/queues.py QUEUE_FIGURES, the gauges)
SNAPSHOT_FIGURES = ("quota_gpus", "borrowing_limit_gpus", "lending_limit_gpus", "fair_share_gpus", "usage_gpus",
                    "reserved_gpus", "pending_workloads", "inadmissible_workloads", "admitted_workloads",
                    "limit_gpus", "fairshare_shares")


def scheduler_queues(store: Store, at: datetime) -> pd.DataFrame:
    """One row per scheduler, queue and flavor from each scheduler's latest read at or before `at`: the figures
    of SNAPSHOT_FIGURES (null where the scheduler does not publish one), `unlimited` where it said so, and the
    read's time (`read_at`)."""
    rows = store.query("""
        WITH latest AS (SELECT scheduler, max(ts) AS ts FROM queue_metrics WHERE ts <= $at GROUP BY scheduler)
        SELECT q.scheduler, q.queue, any_value(q.cohort) AS cohort, coalesce(q.flavor, '') AS flavor, q.figure,
               sum(q.value) AS value, bool_or(coalesce(q.detail = 'unlimited', false)) AS unlimited,
               any_value(q.ts) AS read_at
        FROM queue_metrics q JOIN latest USING (scheduler, ts)
        WHERE q.figure IN (SELECT unnest($figures))
        GROUP BY q.scheduler, q.queue, coalesce(q.flavor, ''), q.figure""",
                       {"at": at, "figures": list(SNAPSHOT_FIGURES)})
    columns = ["scheduler", "queue", "cohort", "flavor", *SNAPSHOT_FIGURES, "unlimited", "read_at"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    keys = ["scheduler", "queue", "flavor"]
    wide = rows.groupby([*keys, "figure"])["value"].first().unstack("figure")  # only the queues that exist
    wide = wide.reindex(columns=list(SNAPSHOT_FIGURES))
    facts = rows.groupby(keys).agg(cohort=("cohort", "first"), unlimited=("unlimited", "any"),
                                   read_at=("read_at", "first"))
    out = wide.join(facts).reset_index()
    out["flavor"] = out["flavor"].astype(object).where(out["flavor"] != "", None)
    return out[columns].sort_values(["scheduler", "queue", "flavor"], na_position="first").reset_index(drop=True)


def admission_waits(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per Kueue ClusterQueue: workloads admitted in [start, end) and their admission wait (mean, p50, p95,
    seconds), from the cumulative histogram's growth over the window."""
    reads = store.query("""
        WITH edges AS (
            SELECT scheduler, max(ts) FILTER (WHERE ts < $start) AS before, min(ts) FILTER (WHERE ts >= $start)
                   AS first_in, max(ts) FILTER (WHERE ts >= $start AND ts < $end) AS last_in
            FROM queue_metrics WHERE figure IN ('admitted_total', 'admission_wait_s_total', 'admission_wait_bucket')
            GROUP BY scheduler)
        SELECT q.queue, q.figure, q.detail, q.value,
               q.ts = edges.last_in AS is_last
        FROM queue_metrics q JOIN edges USING (scheduler)
        WHERE q.figure IN ('admitted_total', 'admission_wait_s_total', 'admission_wait_bucket')
          AND edges.last_in IS NOT NULL AND q.ts IN (coalesce(edges.before, edges.first_in), edges.last_in)""",
                        {"start": start, "end": end})
    columns = ["queue", "admitted", "wait_mean_s", "wait_p50_s", "wait_p95_s"]
    out = []
    for queue, one in reads.groupby("queue"):
        last, first = one[one["is_last"]], one[~one["is_last"]]
        if first.empty:  # one read only: the histogram's growth over the window is not known
            out.append({"queue": queue, "admitted": None, "wait_mean_s": None, "wait_p50_s": None,
                        "wait_p95_s": None})
            continue

        def grown(figure: str, detail: str | None = None) -> float | None:
            def value(frame: pd.DataFrame) -> float | None:
                hit = frame[(frame["figure"] == figure) & ((frame["detail"] == detail) if detail is not None
                                                            else frame["detail"].isna())]
                return float(hit["value"].iloc[0]) if len(hit) else None
            now, then = value(last), value(first)
            if now is None:
                return None
            return now - then if then is not None and then <= now else now  # a reset counts from zero

        admitted = grown("admitted_total")
        total = grown("admission_wait_s_total")
        bounds = sorted({d for d in last.loc[last["figure"] == "admission_wait_bucket", "detail"]},
                        key=lambda d: math.inf if d == "+Inf" else float(d))
        buckets = [(math.inf if d == "+Inf" else float(d), grown("admission_wait_bucket", d)) for d in bounds]
        has = bool(admitted)
        out.append({"queue": queue, "admitted": admitted,
                    "wait_mean_s": total / admitted if has and total is not None else None,
                    "wait_p50_s": _quantile(0.5, buckets) if has else None,
                    "wait_p95_s": _quantile(0.95, buckets) if has else None})
    return pd.DataFrame(out, columns=columns)


def _quantile(q: float, buckets: list[tuple[float, float | None]]) -> float | None:
    """histogram_quantile over cumulative (upper bound, count) buckets: linear inside the bucket the rank falls
    in; a rank in the +Inf bucket answers the largest finite bound (all that is known)."""
    buckets = [(bound, count) for bound, count in buckets if count is not None]
    if not buckets or buckets[-1][0] != math.inf or not buckets[-1][1]:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == math.inf:
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 0.0)
        lower, below = bound, count
    return None
