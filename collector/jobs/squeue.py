"""Slurm's `squeue` output: what waits (and runs) now, with the scheduler's reason. sacct reports a job held for a
later begin time only once it is eligible, so the queue as it stands is read from squeue.

Read by the header's field names, never by position, from output of a `|`-separated format such as

    squeue -a -o "%i|%T|%V|%a|%u|%P|%q|%b|%r|%j|%D|%S"

whose header is `JOBID|STATE|SUBMIT_TIME|ACCOUNT|USER|PARTITION|QOS|TRES_PER_NODE|REASON|NAME|NODES|START_TIME`;
any subset in any order works (JOBID required). Facts from Slurm's documentation and source this relies on:
- TRES_PER_NODE (`%b`) is what the job asks per node: `gres:gpu:h100:2`, `gres:gpu:2` (untyped), or in newer
  releases `gres/gpu:h100=2`; its GPUs are that times NODES (`%D`).
- START_TIME of a pending job is the scheduler's expected start (or N/A), not a start: only a running job's is kept.
- Times are the local time of the host squeue ran on, without a zone, as in sacct.
"""
from __future__ import annotations

import re
from collections import Counter
from datetime import timezone, tzinfo

from gpuledger.collector.errors import InputError
from gpuledger.collector.jobs.lifecycle import JobBatch, events_of, jobs_frame
from gpuledger.collector.jobs.sacct import JOB_PREFIX, SOURCE, STATE_WORDS, model_of_type, time_of

_GPU_PER_NODE = re.compile(r"^gres[:/]gpu(?::(?P<type>[^:=]+))?[:=](?P<count>\d+)$", re.IGNORECASE)


def gpus_per_node(tres: str | None) -> tuple[int | None, str | None]:
    """(GPUs per node, model) from squeue's TRES_PER_NODE; (None, None) where it asks for no GPU."""
    total, types = 0, []
    for item in (tres or "").split(","):
        match = _GPU_PER_NODE.match(item.strip())
        if match:
            total += int(match.group("count"))
            if match.group("type"):
                types.append(match.group("type"))
    if not total:
        return None, None
    return total, (model_of_type(types[0]) if len(set(types)) == 1 else None)


def parse_squeue(text: str, zone: tzinfo = timezone.utc, team_field: str = "Account") -> JobBatch:
    """The jobs in squeue's output (pending and running ones; others are skipped and counted by state)."""
    skipped: Counter = Counter()
    unknown: Counter = Counter()
    names: list[str] | None = None
    records = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if "|" not in line:
            skipped["not_a_row"] += 1
            continue
        values = [v.strip() for v in line.split("|")]
        if values[0].upper() == "JOBID":
            names = [v.upper() for v in values]
            continue
        if names is None:
            raise InputError("the squeue output has no header line: run squeue without -h, with a '|'-separated "
                             "-o format (e.g. -o \"%i|%T|%V|%a|%u|%P|%q|%b|%r|%j|%D|%S\")")
        if len(values) != len(names):
            skipped["malformed"] += 1
            continue
        row = dict(zip(names, values))
        word = row.get("STATE", "").upper()
        state = STATE_WORDS.get(word)
        if state not in ("pending", "running"):
            if state is None and word:
                unknown[word] += 1
            skipped[f"state_{(state or word or 'unknown').lower()}"] += 1
            continue
        per_node, model = gpus_per_node(row.get("TRES_PER_NODE") or row.get("GRES"))
        if not per_node:
            skipped["no_gpus"] += 1
            continue
        nodes = row.get("NODES", "1")
        team_key = {"ACCOUNT": "ACCOUNT", "PARTITION": "PARTITION", "QOS": "QOS"}.get(team_field.upper(), "ACCOUNT")
        records.append({
            "job_id": JOB_PREFIX + row["JOBID"], "team": row.get(team_key) or None, "user": row.get("USER") or None,
            "namespace": None, "pod": None, "node": None, "gpu_model": model,
            "gpus": per_node * (int(nodes) if nodes.isdigit() else 1),
            "submit_ts": time_of(row.get("SUBMIT_TIME"), zone),
            "start_ts": time_of(row.get("START_TIME"), zone) if state == "running" else None,
            "end_ts": None, "state": state, "eligible_ts": None, "partition": row.get("PARTITION") or None,
            "qos": row.get("QOS") or None, "account": row.get("ACCOUNT") or None, "exit_code": None,
            "restarts": None, "pending_reason": (row.get("REASON") or None) if state == "pending" else None,
            "name": row.get("NAME") or None, "source": SOURCE,
        })
    if names is None:
        raise InputError("no squeue output found: expected a header line JOBID|... and rows separated by '|'")
    jobs = jobs_frame(records, skipped)
    return JobBatch(jobs, events_of(jobs), skipped, unknown)
