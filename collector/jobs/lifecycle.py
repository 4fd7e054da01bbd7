"""The one shape every job lifecycle source produces: rows of the `jobs` table and of the `job_events` history,
and a count of what it skipped and why (never a silent guess).

States are the scheduler's, normalised to one lower-case vocabulary (STATES); a state a parser does not know is
kept as it is, lower-cased, and counted, so a new scheduler version shows up instead of being mapped wrongly.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pandas as pd

from gpuledger.collector.identifiers import is_identifier
from gpuledger.collector.jobs.classes import infer_class

# the states a job can be in, as gpuledger names them; the first two are open (the job is not finished)
OPEN_STATES = ("pending", "running")
# a finished job's outcome: what "GPU-hours lost to failed and preempted jobs" is counted over
OUTCOMES = ("completed", "failed", "cancelled", "timeout", "out_of_memory", "node_fail", "preempted", "boot_fail",
            "deadline")
# `left_queue`: a job a queue snapshot (squeue) showed waiting or running and the next one no longer shows; how it
# ended is the history's to say (sacct)
LEFT_QUEUE = "left_queue"
STATES = OPEN_STATES + OUTCOMES + ("requeued", "suspended", LEFT_QUEUE)
LOST = ("failed", "timeout", "out_of_memory", "node_fail", "preempted", "boot_fail", "deadline")  # work not kept
# why a job waits, when the scheduler says it is held rather than short of GPUs (Slurm's reasons): such a wait is no
# demand for GPUs (the quota advice does not count it) and no room made for it would start it (no consolidation)
HELD_REASONS = ("BeginTime", "Dependency", "DependencyNeverSatisfied", "JobHeldUser", "JobHeldAdmin",
                "BadConstraints", "InvalidAccount", "InvalidQOS")
# job_events.event: one row per thing that happened to a job. The first four are read off the job's own instants
# (events_of) and rewritten with it; `restarted` is seen as a restart count growing between two reads, stamped
# with the read that saw it (deploy/job_loop.py) and kept. A preemption is a `finished` event with its outcome.
DERIVED_EVENTS = ("submitted", "eligible", "started", "finished")
EVENTS = DERIVED_EVENTS + ("restarted",)

JOB_COLUMNS = ("job_id", "team", "user", "namespace", "pod", "node", "gpu_model", "gpus", "submit_ts", "start_ts",
               "end_ts", "state", "eligible_ts", "partition", "qos", "account", "exit_code", "restarts",
               "pending_reason", "name", "source", "workload_class", "class_rule", "gres_type")
EVENT_COLUMNS = ("job_id", "ts", "event", "detail", "source")


@dataclass
class JobBatch:
    """What one read of a lifecycle source gives: jobs (JOB_COLUMNS), events (EVENT_COLUMNS) and the rows skipped,
    by reason (e.g. `step` for sacct's step lines, `no_gpus` for CPU-only jobs, `malformed`)."""
    jobs: pd.DataFrame
    events: pd.DataFrame
    skipped: Counter = field(default_factory=Counter)
    unknown_states: Counter = field(default_factory=Counter)
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> {label_<key>: value} (Kubernetes)


MAX_JOB_GPUS = 1_000_000  # more GPUs than any cluster has: a corrupt or hostile record, not a job
FUTURE_SLACK = timedelta(days=1)  # clock skew a scheduler's times may have; later than that is not a real instant


NAME_COLUMNS = ("team", "user", "namespace", "pod")  # a name that breaks its kind's rule is blanked
_NODE_LIST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:@/+\-\[\],]{0,4095}")  # a node, or Slurm's list (`gpu-[01-04]`)


def _checked(records: list[dict], skipped: Counter) -> list[dict]:
    """The records a store can hold, with what does not hold up dropped or blanked and counted: a GPU count that is
    not a whole number from 0 to MAX_JOB_GPUS drops the record (`bad_gpus`: Kubernetes and Slurm count whole
    GPUs); a negative restart count is unknown (`bad_restarts`); an instant over a day in the future is unknown
    (`future_time`); a start before the submission leaves the wait unknown (`start_before_submit`), never negative;
    a job id that breaks the identifier rule drops the record, a team, user, namespace, pod or node that does is
    blanked (`bad_name`): sacct's and the schedulers' names go into the same reports and plans as the agents'."""
    now = datetime.now(timezone.utc)
    kept = []
    for record in records:
        if not is_identifier("job_id", record.get("job_id")):
            skipped["bad_name"] += 1  # a job id is the record's key and lands in reports and plans
            continue
        for column in NAME_COLUMNS:  # the identifier rule the agent path applies (collector/identifiers.py)
            value = record.get(column)
            if value is not None and not (isinstance(value, float) and math.isnan(value)) \
                    and not is_identifier(column, value):
                skipped["bad_name"] += 1
                record[column] = None
        node = record.get("node")
        if node is not None and not (isinstance(node, str) and _NODE_LIST.fullmatch(node)):
            skipped["bad_name"] += 1
            record["node"] = None
        gpus = record.get("gpus")
        if gpus is not None and not (isinstance(gpus, (int, float)) and math.isfinite(gpus)
                                     and 0 <= gpus <= MAX_JOB_GPUS and float(gpus).is_integer()):
            skipped["bad_gpus"] += 1
            continue
        if record.get("restarts") is not None and record["restarts"] < 0:
            skipped["bad_restarts"] += 1
            record["restarts"] = None
        for column in ("submit_ts", "eligible_ts", "start_ts", "end_ts"):
            when = record.get(column)
            if when is not None and not pd.isna(when) and pd.Timestamp(when) > pd.Timestamp(now + FUTURE_SLACK):
                skipped["future_time"] += 1
                record[column] = None
        submit, start = record.get("submit_ts"), record.get("start_ts")
        if submit is not None and start is not None and not pd.isna(submit) and not pd.isna(start) \
                and pd.Timestamp(start) < pd.Timestamp(submit):
            skipped["start_before_submit"] += 1
            record["submit_ts"] = None
        kept.append(record)
    return kept


def jobs_frame(records: list[dict], skipped: Counter | None = None) -> pd.DataFrame:
    """The jobs table's rows for `records`, checked (`_checked`, what is dropped or blanked counted in `skipped`)
    and each given a workload class where the source gave none."""
    records = _checked(records, Counter() if skipped is None else skipped)
    for record in records:  # a class the source did not give is inferred (collector/jobs/classes.py)
        if not record.get("workload_class"):
            record["workload_class"], record["class_rule"] = infer_class(
                record.get("name"), record.get("partition"), record.get("qos"), record.get("priority_class"))
    frame = pd.DataFrame(records, columns=list(JOB_COLUMNS))  # (a record's extra keys, e.g. priority_class, dropped)
    for column in ("submit_ts", "start_ts", "end_ts", "eligible_ts"):
        frame[column] = pd.to_datetime(frame[column], utc=True)
    for column in ("gpus", "restarts"):
        frame[column] = frame[column].astype("Int64")
    return frame


def events_of(jobs: pd.DataFrame) -> pd.DataFrame:
    """The lifecycle events the jobs' own instants show: submitted, eligible, started and finished (with the
    outcome as its detail); an instant the scheduler did not give is no event."""
    rows = []
    for job in jobs.itertuples(index=False):
        instants = (job.submit_ts, job.eligible_ts, job.start_ts, job.end_ts if job.state not in OPEN_STATES else None)
        details = (job.partition, None, job.node, job.state)
        for event, ts, detail in zip(DERIVED_EVENTS, instants, details):
            if ts is not None and not pd.isna(ts):
                rows.append({"job_id": job.job_id, "ts": ts, "event": event, "detail": detail,
                             "source": job.source})
    frame = pd.DataFrame(rows, columns=list(EVENT_COLUMNS))
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    return frame
