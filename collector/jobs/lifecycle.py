"""The one shape every job lifecycle source produces: rows of the `jobs` table and of the `job_events` history,
and a count of what it skipped and why (never a silent guess).

States are the scheduler's, normalised to one lower-case vocabulary (STATES); a state a parser does not know is
kept as it is, lower-cased, and counted, so a new scheduler version shows up instead of being mapped wrongly.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

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
# job_events.event: one row per thing that happened to a job, at the instant the scheduler gives
EVENTS = ("submitted", "eligible", "started", "finished")

# what kind of work a job is, so waits, cost and waste can be read per kind: from a label where the site sets one,
# else inferred (infer_class); `class_from` says which
WORKLOAD_CLASSES = ("training", "inference", "interactive", "batch")
CLASS_FROM = ("label", "inferred")

JOB_COLUMNS = ("job_id", "team", "user", "namespace", "pod", "node", "gpu_model", "gpus", "submit_ts", "start_ts",
               "end_ts", "state", "eligible_ts", "partition", "qos", "account", "exit_code", "restarts",
               "pending_reason", "name", "source", "workload_class", "class_from")
EVENT_COLUMNS = ("job_id", "ts", "event", "detail", "source")


@dataclass
class JobBatch:
    """What one read of a lifecycle source gives: jobs (JOB_COLUMNS), events (EVENT_COLUMNS) and the rows skipped,
    by reason (e.g. `step` for sacct's step lines, `no_gpus` for CPU-only jobs, `malformed`)."""
    jobs: pd.DataFrame
    events: pd.DataFrame
    skipped: Counter = field(default_factory=Counter)
    unknown_states: Counter = field(default_factory=Counter)


# the inference rules, first match wins; each reads the job's name (a pod's owner as Kind/name), partition and QOS
_SHELL = re.compile(r"^(bash|sh|zsh|tcsh|fish|srun)$")  # a job that is a login shell (srun --pty bash)
_INTERACTIVE = re.compile(r"interactive|jupyter|notebook|\bdebug\b|\bdev\b|sys/dashboard|vscode", re.I)
_SERVICE_OWNERS = re.compile(r"^(Deployment|ReplicaSet|StatefulSet|LeaderWorkerSet|InferenceService|DaemonSet)/")
_INFERENCE = re.compile(r"serv(e|ing)|vllm|triton|tgi|sglang|infer|predict", re.I)
_TRAINING = re.compile(r"^(PyTorchJob|TFJob|MPIJob|JAXJob|XGBoostJob|PaddleJob|TrainJob|RayJob|JobSet)/|"
                       r"train|pretrain|fine-?tun|\bsft\b|rlhf|\bdpo\b", re.I)


def infer_class(name: str | None, partition: str | None = None, qos: str | None = None) -> tuple[str, str]:
    """(workload class, how it was known) for a job without a class label: a partition or QOS named like a class
    counts as the site's label; then interactive names (shells, notebooks, debug/dev queues), services (a pod owned
    by a Deployment, StatefulSet, ... or named like an inference server), training (a training operator's job, or
    named train/fine-tune/SFT/...), and batch for the rest."""
    for given in (partition, qos):
        if given and given.lower() in WORKLOAD_CLASSES:
            return given.lower(), "label"
    text = " ".join(t for t in (name, partition, qos) if t)
    if (name and _SHELL.match(name)) or _INTERACTIVE.search(text):
        return "interactive", "inferred"
    if (name and _SERVICE_OWNERS.match(name)) or _INFERENCE.search(text):
        return "inference", "inferred"
    if _TRAINING.search(text):
        return "training", "inferred"
    return "batch", "inferred"


def jobs_frame(records: list[dict]) -> pd.DataFrame:
    for record in records:
        if not record.get("workload_class"):
            record["workload_class"], record["class_from"] = infer_class(
                record.get("name"), record.get("partition"), record.get("qos"))
    frame = pd.DataFrame(records, columns=list(JOB_COLUMNS))
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
        for event, ts, detail in zip(EVENTS, instants, details):
            if ts is not None and not pd.isna(ts):
                rows.append({"job_id": job.job_id, "ts": ts, "event": event, "detail": detail,
                             "source": job.source})
    frame = pd.DataFrame(rows, columns=list(EVENT_COLUMNS))
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    return frame
