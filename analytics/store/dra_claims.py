"""Kubernetes DRA claims per job and hour: which ResourceClaim (and device) each job's GPU-time came through.

Why a table of its own: a claim is not a billing key (a GPU claimed by two pods is billed once, split between the
pods like any shared GPU), but an admin who allocates GPUs through claims names them in bills and in /allocation.
Derived from the raw samples' `dra_claim`/`dra_device` in the same transactions that fold them into the rollups
(analytics/store/database.py), whole hours at a time, so a late or replayed batch re-derives its hours and the
table always equals its samples; kept as long as the hour rollups.
"""
from __future__ import annotations

from datetime import datetime, timedelta

DDL = [
    """CREATE TABLE IF NOT EXISTS dra_claim_hours (
    bucket TIMESTAMPTZ NOT NULL, node VARCHAR NOT NULL, gpu_uuid VARCHAR, job_id VARCHAR, team VARCHAR,
    dra_claim VARCHAR NOT NULL, dra_device VARCHAR, gpu_s DOUBLE)""",
]

# $lo, $hi: whole hours (see `hours`); $node: one node's or (NULL) all
DROP = """DELETE FROM dra_claim_hours WHERE bucket >= $lo AND bucket < $hi AND ($node IS NULL OR node = $node)"""
FOLD = """INSERT INTO dra_claim_hours
    SELECT date_trunc('hour', ts) AS bucket, node, gpu_uuid, job_id, any_value(team), dra_claim, any_value(dra_device),
           sum(CASE WHEN isfinite(interval_s * gpu_fraction) THEN interval_s * gpu_fraction ELSE 0 END)
    FROM samples
    WHERE ts >= $lo AND ts < $hi AND dra_claim IS NOT NULL AND ($node IS NULL OR node = $node)
    GROUP BY ALL"""


def hours(lo: datetime, hi: datetime, folded_to: datetime) -> dict[str, datetime]:
    """The span to re-derive for samples in [lo, hi): from the start of lo's hour, to the end of hi's hour or the
    fold's watermark, whichever is first (the rest of that hour is derived again with the next fold)."""
    start = lo.replace(minute=0, second=0, microsecond=0)
    end = hi.replace(minute=0, second=0, microsecond=0)
    if end < hi:
        end += timedelta(hours=1)
    return {"lo": start, "hi": min(end, folded_to)}


def claims_by_job(store, start: datetime, end: datetime) -> dict[str, list[str]]:
    """job id -> the claims its GPU-time in [start, end) came through (by hour), sorted."""
    found = store.query("""SELECT job_id, list(DISTINCT dra_claim ORDER BY dra_claim) AS claims FROM dra_claim_hours
                           WHERE bucket >= date_trunc('hour', $start) AND bucket < $end AND job_id IS NOT NULL
                           GROUP BY job_id""", {"start": start, "end": end})
    return dict(zip(found["job_id"], (list(c) for c in found["claims"])))


# the claim of each job, for joining onto rollup rows (/allocation's `claim` aggregate): a job of several claims
# is named by all of them, comma-separated
JOB_CLAIM = """(SELECT job_id, string_agg(DISTINCT dra_claim, ',' ORDER BY dra_claim) AS dra_claim
               FROM dra_claim_hours WHERE job_id IS NOT NULL GROUP BY job_id)"""


def dra_drivers(store, start: datetime, end: datetime) -> list[str]:
    """The DRA drivers whose devices jobs claimed in [start, end) (the first part of `dra_device`), sorted."""
    found = store.query("""SELECT DISTINCT split_part(dra_device, '/', 1) AS driver FROM dra_claim_hours
                           WHERE bucket >= date_trunc('hour', $start) AND bucket < $end AND dra_device IS NOT NULL
                           ORDER BY 1""", {"start": start, "end": end})
    return [d for d in found["driver"] if d]
