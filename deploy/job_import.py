"""A site's job records and scheduler queue state into the store, one way for both doors: `gpuledger import FORMAT
FILE` on the file, and `POST /v1/jobs` on a running server (what `import ... --server` pushes to). The same
parsers, the same refusals (an input of which nothing was kept is an error naming what was skipped and why) and
the same summary, so a cron job piping sacct to a live server sees what the offline import would have printed.
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpuledger.analytics.store import Store
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import InputError
from gpuledger.collector.jobs import JOB_FORMATS, QUEUE_FORMATS

# what each reason an import skips a line for means, for the refusal of an import that kept nothing
SKIP_REASONS = {
    "not_a_row": "not_a_row: lines that are no row (a prompt, prose, output without the '|' separator; sacct's "
                 "fixed-width table is read with its header and the line of dashes under it)",
    "malformed": "malformed: rows with another number of fields than the header names",
    "step": "step: job steps (.batch, .extern, .N), kept only as part of their job",
    "no_gpus": "no_gpus: jobs that asked for no GPU (AllocTRES or ReqTRES without gres/gpu)",
    "bad_gpus": "bad_gpus: GPU counts that are no number",
}


@dataclass
class ImportOptions:
    """How to read a format: sacct's --fields, the time zone sacct and squeue printed in, the field naming the
    team, and kube-state's team and class labels."""
    fields: list[str] | None = None
    timezone: str = "UTC"
    team_field: str = "Account"
    team_label: str | None = None
    class_label: str | None = None

    def zone(self) -> ZoneInfo:
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise InputError(f"timezone {self.timezone!r} is not a time zone (e.g. UTC, Europe/Oslo)") from exc


@dataclass
class Imported:
    """What one import stored and skipped."""
    format: str
    stored: int = 0  # GPU jobs, or queue figures
    events: int = 0
    queues: int = 0
    labels: int = 0  # nodes whose labels were stored (kube-state)
    left: int = 0  # jobs no longer in squeue's queue, marked as having left it
    skipped: Counter = field(default_factory=Counter)
    unknown_states: Counter = field(default_factory=Counter)

    def lines(self, into: str) -> list[str]:
        """The summary the CLI prints, and the API answers as `summary`."""
        shown = ", ".join(f"{n:,} {why}" for why, n in sorted(self.skipped.items())) or "none"
        if self.format in QUEUE_FORMATS:
            return [f"imported {self.format}: {self.stored:,} figures of {self.queues:,} queue(s) into {into} "
                    f"(skipped: {shown})"]
        labelled = f", labels of {self.labels:,} node(s)" if self.labels else ""
        out = [f"imported {self.format}: {self.stored:,} GPU jobs, {self.events:,} events{labelled} into {into} "
               f"(skipped: {shown})"]
        if self.left:
            out.append(f"{self.left:,} job(s) stored as waiting or running are no longer in the queue: marked "
                       "left_queue (import sacct for how they ended)")
        if self.unknown_states:
            out.append("states gpuledger does not know, kept as written: "
                       + ", ".join(f"{state} ({n})" for state, n in sorted(self.unknown_states.items())))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "stored": self.stored, "events": self.events, "queues": self.queues,
                "node_labels": self.labels, "left_queue": self.left, "skipped": dict(self.skipped),
                "unknown_states": dict(self.unknown_states)}


def job_batches(fmt: str, lines: Iterable[str], options: ImportOptions, source: str) -> Iterator[Any]:
    """The JobBatches of a job format's output (`source` names it in errors); sacct is streamed a chunk at a time.
    The first batch is parsed before this returns, so an input that is not the format is refused before any
    store is opened."""
    from gpuledger.collector.jobs.kube_state import parse_kube_state
    from gpuledger.collector.jobs.sacct import sacct_chunks
    from gpuledger.collector.jobs.squeue import parse_squeue
    if fmt not in JOB_FORMATS:
        raise InputError(f"unknown job format {fmt!r}: one of {', '.join(JOB_FORMATS)}")
    zone = options.zone()
    if fmt == "sacct":
        batches: Iterator[Any] = sacct_chunks(iter(lines), options.fields, zone, options.team_field)
    elif fmt == "squeue":
        batches = iter([parse_squeue("".join(lines), zone, options.team_field)])
    else:
        batch = parse_kube_state("".join(lines), options.team_label, class_label=options.class_label)
        if batch.jobs.empty and not (batch.skipped["no_gpus"] or batch.skipped["bad_gpus"] or batch.node_labels):
            raise InputError(f"no kube-state-metrics pod series (kube_pod_*) in {source}: is it kube-state-metrics' "
                             "/metrics page?")
        batches = iter([batch])
    first = next(batches, None)
    return itertools.chain([first] if first is not None else [], batches)


def store_jobs(store: Store, fmt: str, batches: Iterable[Any], source: str,
               progress: Callable[[int], None] | None = None) -> Imported:
    """Store each batch (a job read again replaces itself); refused when input was given and nothing of it kept."""
    from gpuledger.collector.jobs.lifecycle import LEFT_QUEUE
    from gpuledger.collector.jobs.sacct import SOURCE
    result = Imported(fmt)
    chunks = 0
    for batch in batches:
        store.record_restarts(batch.jobs, utc_now(), batch.jobs["source"].iloc[0] if len(batch.jobs) else "")
        store.set_node_labels(batch.node_labels, utc_now())
        result.stored += store.record_jobs(batch.jobs, batch.events)
        if fmt == "squeue":
            result.left = store.close_left_queue(SOURCE, list(batch.jobs["job_id"]), utc_now(), LEFT_QUEUE)
        result.events += len(batch.events)
        result.skipped.update(batch.skipped)
        result.unknown_states.update(batch.unknown_states)
        result.labels += len(batch.node_labels)
        chunks += 1
        if progress is not None and chunks > 1:
            progress(result.stored)
    if not result.stored and not result.labels and sum(result.skipped.values()):
        shown = ", ".join(f"{n:,} {why}" for why, n in sorted(result.skipped.items()))
        raise InputError(f"nothing imported from {source}: every line was skipped ({shown}). "
                         + "; ".join(SKIP_REASONS[why] for why in sorted(result.skipped) if why in SKIP_REASONS))
    return result


def queue_batch(fmt: str, text: str, source: str) -> Any:
    """The QueueBatch of a scheduler's queue page or Slurm's associations, refused when it holds no figure."""
    from gpuledger.collector.jobs.kai import parse_kai
    from gpuledger.collector.jobs.kueue import parse_kueue
    from gpuledger.collector.jobs.sacctmgr import FIELDS, parse_sacctmgr
    readers = {"kueue": (parse_kueue, "the /metrics page of Kueue's controller manager"),
               "kai": (parse_kai, "the /metrics page of KAI's queue controller or scheduler"),
               "sacctmgr": (parse_sacctmgr, f"the output of `sacctmgr -P show assoc format={','.join(FIELDS)}` "
                                            "(account associations with a Fairshare or a gres/gpu GrpTRES)")}
    if fmt not in readers:
        raise InputError(f"unknown queue format {fmt!r}: one of {', '.join(QUEUE_FORMATS)}")
    read, what = readers[fmt]
    batch = read(text, utc_now())
    if batch.rows.empty:
        skipped = ", ".join(f"{n:,} {why}" for why, n in sorted(batch.skipped.items())) or "nothing"
        raise InputError(f"no {fmt} queue figures in {source} (skipped: {skipped}): is it {what}?")
    return batch


def store_queues(store: Store, fmt: str, batch: Any) -> Imported:
    result = Imported(fmt, skipped=Counter(batch.skipped))
    result.stored = store.record_queue_metrics(batch.rows)
    result.queues = int(batch.rows["queue"].nunique())
    return result


__all__ = ["ImportOptions", "Imported", "SKIP_REASONS", "job_batches", "queue_batch", "store_jobs", "store_queues"]
