"""What a scheduler plan needs from the store beyond the quotas (policies/quota_plan.py `applicable_plan`): the
namespaces each team's GPUs were seen in, the MIG profiles present, the job shapes that ran, and the GPU types
Slurm named the GPUs by.

Each answer is read from the records kept (raw samples, the jobs table); none is a guess: a team with no namespace
seen, a model with no MIG instance, a site with no sacct record gets an empty answer and the plan says what it fell
back to.
"""
from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import CAPACITY_STALE
from gpuledger.collector.gpu_catalog import UNKNOWN_MODEL
from gpuledger.collector.samples import UNATTRIBUTED


def team_namespaces(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per team and namespace: the samples (raw, so only within raw retention) and job records of [start, end)
    that put the team's work in that namespace. Rows with no team or no namespace are left out (a pod in `default`
    that no rule bills is nobody's)."""
    sql = """SELECT team, namespace, sum(seen)::BIGINT AS seen FROM (
                 SELECT team, namespace, count(*) AS seen FROM samples
                 WHERE ts >= $start AND ts < $end AND team IS NOT NULL AND namespace IS NOT NULL
                   AND team <> $unattributed
                 GROUP BY ALL
                 UNION ALL
                 SELECT team, namespace, count(*) AS seen FROM jobs
                 WHERE team IS NOT NULL AND namespace IS NOT NULL AND team <> $unattributed
                   AND coalesce(submit_ts, start_ts) < $end AND (end_ts IS NULL OR end_ts >= $start)
                 GROUP BY ALL)
             GROUP BY ALL ORDER BY team, seen DESC, namespace"""
    return store.query(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED})


def mig_profiles(store: Store, before: datetime, stale: timedelta = CAPACITY_STALE) -> pd.DataFrame:
    """Per GPU model and MIG profile: the instances present before `before`, each node as its newest instant shows
    it (as `capacity_by_model` counts the GPUs they are part of)."""
    sql = """WITH newest AS (SELECT node, max(ts) AS ts FROM samples WHERE ts < $end AND ts >= $since GROUP BY node)
             SELECT coalesce(s.gpu_model, $unknown) AS gpu_model, s.mig_profile, count(*) AS instances
             FROM samples s JOIN newest n ON s.node = n.node AND s.ts = n.ts
             WHERE s.ts < $end AND s.ts >= $since AND s.mig_profile IS NOT NULL
             GROUP BY ALL ORDER BY 1, 2"""
    return store.query(sql, {"end": before, "since": before - stale, "unknown": UNKNOWN_MODEL})


def job_shapes(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per team (the unattributed bucket for a job without one), GPU model (null: not recorded) and GPU count: the
    jobs that ran at some time in [start, end) with that shape, and one of them to name. A job that never started
    proved nothing about what the cluster can start and is left out."""
    sql = """SELECT owner(team, $unattributed) AS team, gpu_model, gpus, count(*) AS jobs, min(job_id) AS example
             FROM jobs
             WHERE gpus > 0 AND start_ts IS NOT NULL AND start_ts < $end AND coalesce(end_ts, $end) >= $start
             GROUP BY ALL ORDER BY gpus DESC, team, gpu_model"""
    return store.query(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED})


def gres_types(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per GPU model and Slurm GPU type (`gres/gpu:<type>` in sacct's AllocTRES, the jobs table's `gres_type`):
    how many job records name that type. The model is the one the job's own samples of [start, end) show (the
    driver's, as the plan names its models), else the model the job record gives (collector/jobs/sacct.py reads it
    off the type). Every record kept counts, not only the window's: a site's types rarely change."""
    sql = """WITH typed AS (SELECT job_id, gpu_model, gres_type FROM jobs WHERE gres_type IS NOT NULL),
             sampled AS (SELECT DISTINCT job_id, gpu_model FROM samples
                         WHERE ts >= $start AND ts < $end AND gpu_model IS NOT NULL
                           AND job_id IN (SELECT job_id FROM typed))
             SELECT coalesce(s.gpu_model, t.gpu_model) AS gpu_model, t.gres_type, count(DISTINCT t.job_id) AS jobs
             FROM typed t LEFT JOIN sampled s USING (job_id)
             WHERE coalesce(s.gpu_model, t.gpu_model) IS NOT NULL
             GROUP BY ALL ORDER BY gpu_model, jobs DESC, gres_type"""
    return store.query(sql, {"start": start, "end": end})
