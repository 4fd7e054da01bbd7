"""Slurm's jobs, queue and limits read continuously from its own commands (`serve --jobs-from slurm`), so a Slurm
site's waits, outcomes and queued demand reach the store while the server runs, as Kubernetes pods do through
Prometheus (prometheus_jobs.py).

Each read, on the host where Slurm's client commands reach slurmctld and slurmdbd:
- `squeue -a -o <SQUEUE_FORMAT>` first: what waits and runs now (a job held for a later begin time shows only here);
- `sacct -aP -S <from> -E now -o <SACCT_FIELDS>`: every job that was in the system at some point since the last
  read, less an overlap (`OVERLAP`) so a job ending while the read runs is read again, finished ones with their
  outcome; the first read goes back `since`. A job read again replaces itself (the store's rule), so the overlap
  stores nothing twice, and steps are skipped as in `import sacct`;
- `sacctmgr -nP show assoc format=<FIELDS>`: the account limits and shares in force (sacctmgr.py).
The commands run with TZ=UTC, so their times are UTC whatever the host's zone. A job that squeue no longer lists and
that sacct did not report ended is marked as having left the queue by the loop (deploy/job_loop.py), as for pods.
A command that fails raises SourceError: the loop logs it and reads again at the next interval.
"""
from __future__ import annotations

import os
import subprocess
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable, Mapping

import pandas as pd

from gpuledger.collector.jobs.lifecycle import JobBatch
from gpuledger.collector.jobs.prometheus_jobs import LifecycleRead
from gpuledger.collector.jobs.sacct import SOURCE, parse_sacct
from gpuledger.collector.jobs.sacctmgr import FIELDS as ASSOC_FIELDS
from gpuledger.collector.jobs.sacctmgr import parse_sacctmgr
from gpuledger.collector.jobs.squeue import parse_squeue
from gpuledger.collector.source import SourceError

SACCT_FIELDS = ("JobID,State,Submit,Eligible,Start,End,Account,User,Partition,QOS,NodeList,AllocTRES,ReqTRES,"
                "Reason,ExitCode,JobName")
SQUEUE_FORMAT = "%i|%T|%V|%a|%u|%P|%q|%b|%r|%j|%D|%S"
# where a sender (`gpuledger jobs-agent`) posts one read's output: the wire contract, as INGEST_PATH is for samples
SLURM_READ_PATH = "/v1/jobs/slurm"
OVERLAP = timedelta(minutes=10)  # each read goes back this far before the last one
OPEN = ("pending", "running")


class SlurmLifecycle:
    """Reads squeue, sacct and sacctmgr on each call of `read()`."""

    source_name = SOURCE

    def __init__(self, since: timedelta = timedelta(days=7), team_field: str = "Account",
                 env: Mapping[str, str] | None = None, timeout_s: float = 120.0,
                 clock: Callable[[], datetime] | None = None) -> None:
        self.name = "slurm-commands"
        self.since = since
        self.team_field = team_field
        self.env = {**(env if env is not None else os.environ), "TZ": "UTC"}
        self.timeout_s = timeout_s
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self.last_read: datetime | None = None

    def _run(self, *command: str) -> str:
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SourceError(f"{command[0]}: {exc}") from exc
        if done.returncode != 0:
            raise SourceError(f"{' '.join(command[:2])} failed ({done.returncode}): {done.stderr.strip()[:300]}")
        return done.stdout

    def outputs(self) -> SlurmOutputs:
        """The three commands' output, as printed, from the cursor on; the cursor moves only with `advance`, so a
        sender that could not deliver a read sends the same window again."""
        at = self.clock()
        start = at - self.since if self.last_read is None else self.last_read - OVERLAP
        queue = self._run("squeue", "-a", "-o", SQUEUE_FORMAT)
        history = self._run("sacct", "-aP", "-S", f"{start:%Y-%m-%dT%H:%M:%S}", "-E", f"{at:%Y-%m-%dT%H:%M:%S}",
                            "-o", SACCT_FIELDS)
        limits = self._run("sacctmgr", "-nP", "show", "assoc", f"format={','.join(ASSOC_FIELDS)}")
        return SlurmOutputs(at, queue, history, limits, self.team_field)

    def advance(self, outputs: SlurmOutputs) -> None:
        """The read is stored: the next one starts from its instant (less the overlap)."""
        self.last_read = outputs.at

    def read(self) -> LifecycleRead:
        outputs = self.outputs()
        read = parse_outputs(outputs)
        self.advance(outputs)
        return read


@dataclass(frozen=True)
class SlurmOutputs:
    """One read of Slurm's commands as they printed it (times in UTC): what `serve --jobs-from slurm` parses in
    place and what `gpuledger jobs-agent` sends from the controller host to `POST /v1/jobs/slurm`."""
    at: datetime
    squeue: str
    sacct: str
    sacctmgr: str
    team_field: str = "Account"


def parse_outputs(outputs: SlurmOutputs) -> LifecycleRead:
    """One read's jobs (sacct's record wins for a job both list: it has the outcome; squeue adds the jobs sacct
    cannot show yet), the jobs still in the system, and the association limits in force."""
    queue = parse_squeue(outputs.squeue, timezone.utc, outputs.team_field)
    history = parse_sacct(outputs.sacct, zone=timezone.utc, team_field=outputs.team_field)
    limits = parse_sacctmgr(outputs.sacctmgr, outputs.at)
    known = set(history.jobs["job_id"])
    waiting = queue.jobs[~queue.jobs["job_id"].isin(known)]
    jobs = pd.concat([history.jobs, waiting], ignore_index=True) if len(waiting) else history.jobs
    events = pd.concat([history.events, queue.events[queue.events["job_id"].isin(waiting["job_id"])]],
                       ignore_index=True) if len(waiting) else history.events
    listed = sorted(set(queue.jobs["job_id"]) | set(history.jobs.loc[history.jobs["state"].isin(OPEN), "job_id"]))
    skipped = Counter(history.skipped) + Counter(queue.skipped) + Counter(limits.skipped)
    batch = JobBatch(jobs, events, skipped, history.unknown_states + queue.unknown_states)
    return LifecycleRead(batch, listed, limits.rows, outputs.at, Counter(), [])


__all__ = ["SLURM_READ_PATH", "SlurmLifecycle", "SlurmOutputs", "parse_outputs", "SACCT_FIELDS", "SQUEUE_FORMAT"]
