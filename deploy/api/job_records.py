"""Job records and scheduler queue state pushed to a running server: `POST /v1/jobs` takes what `gpuledger import`
reads from a file (sacct, squeue, kube-state-metrics, Kueue's and KAI's /metrics pages, sacctmgr's associations),
so a site's cron on the Slurm controller (`sacct ... | gpuledger import sacct - --server URL`) feeds the server
that owns the store without stopping it. Same parsers, refusals and summary as the file path
(deploy/job_import.py); an admin token, checked before the body is read (deploy/api/limits.py), which is bounded
to JOBS_BODY_BYTES. A batch sent twice is stored once: a job read again replaces itself.
"""
from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Body, Query, Request
from pydantic import BaseModel, Field

from gpuledger.collector.jobs import JOB_FORMATS, QUEUE_FORMATS
from gpuledger.deploy.api.access import AdminCaller
from gpuledger.deploy.api.deps import StoreDep
from gpuledger.deploy.api.limits import JOBS_BODY_BYTES, JOBS_PATH
from gpuledger.deploy.job_import import ImportOptions, job_batches, queue_batch, store_jobs, store_queues

Format = Literal[(*JOB_FORMATS, *QUEUE_FORMATS)]  # type: ignore[valid-type]
router = APIRouter(tags=["jobs"])


class JobImport(BaseModel):
    format: str = Field(description=f"the format read: {', '.join((*JOB_FORMATS, *QUEUE_FORMATS))}")
    stored: int = Field(description="GPU jobs stored (a job read again replaces itself), or queue figures")
    events: int = Field(description="job events stored (submitted, started, ended, requeued...)")
    queues: int = Field(description="queues the figures are of (queue formats)")
    node_labels: int = Field(description="nodes whose labels were stored (kube-state)")
    left_queue: int = Field(description="squeue: jobs stored as waiting or running no longer in the queue")
    skipped: dict[str, int] = Field(description="lines or rows skipped, by reason (as `gpuledger import` says)")
    unknown_states: dict[str, int] = Field(description="states gpuledger does not know, kept as written")
    summary: list[str] = Field(description="what `gpuledger import` prints for the same input")


@router.post(JOBS_PATH, response_model=JobImport)
def import_records(request: Request, caller: AdminCaller, store: StoreDep,
                   text: str = Body(..., media_type="text/plain",
                                    description="the command's output as it printed it (UTF-8)"),
                   format: Format = Query(..., description="what the body is"),
                   fields: str | None = Query(None, max_length=2000, description="sacct: the -o field list of "
                                              "output taken with --noheader"),
                   timezone: str = Query("UTC", max_length=64, description="sacct, squeue: the time zone they "
                                         "printed in"),
                   team_field: Literal["Account", "Partition", "QOS"] = Query("Account", description="sacct, "
                                                                                "squeue: the field naming the team"),
                   team_label: str | None = Query(None, max_length=253, description="kube-state: the pod label "
                                                  "naming the team"),
                   class_label: str | None = Query(None, max_length=253, description="kube-state: the pod label "
                                                   "or annotation naming the workload class")) -> dict:
    """Store a site's job records or its scheduler's queue state, as `gpuledger import FORMAT` does with a file;
    an input of which nothing was kept is refused (422) with what was skipped and why."""
    request.state.audit = {"format": format, "bytes": len(text)}
    source = f"the {format} body"
    if format in QUEUE_FORMATS:
        result = store_queues(store, format, queue_batch(format, text, source))
    else:
        options = ImportOptions(fields=fields.split(",") if fields else None, timezone=timezone,
                                team_field=team_field, team_label=team_label, class_label=class_label)
        result = store_jobs(store, format, job_batches(format, text.splitlines(keepends=True), options, source),
                            source)
    return {**result.to_dict(), "summary": result.lines("the server's store")}


__all__ = ["router", "JOBS_PATH", "JOBS_BODY_BYTES"]
