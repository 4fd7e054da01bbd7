"""`POST /v1/jobs/slurm`: one read of Slurm's own commands (squeue, sacct, sacctmgr, as they printed it) sent by
`gpuledger jobs-agent` on the Slurm controller host, stored exactly as `serve --jobs-from slurm` stores a read it
made itself (collector/jobs/slurm_commands.py parse_outputs, deploy/job_loop.py store_read): the server that owns
the store need not be where Slurm's client commands work.

A read sent twice is stored once (a job read again replaces itself; the queue figures of one instant replace each
other). An admin token, checked before the body is read; the body is bounded like `POST /v1/jobs`.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import InputError
from gpuledger.collector.jobs.sacct import SOURCE
from gpuledger.collector.jobs.slurm_commands import SLURM_READ_PATH, SlurmOutputs, parse_outputs
from gpuledger.deploy.api.access import AdminCaller
from gpuledger.deploy.api.deps import StoreDep
from gpuledger.deploy.api.models import RequestBody
from gpuledger.deploy.job_loop import store_read

router = APIRouter(tags=["jobs"])
CLOCK_SKEW = timedelta(minutes=5)  # the sender's clock may run this far ahead of the server's
MAX_TEXT = 30 * 1024 * 1024  # the body's bound (limits.py) holds all three; each on its own within it


class SlurmRead(RequestBody):
    at: datetime = Field(description="when the commands ran (the end of sacct's -E window); not in the future")
    squeue: str = Field(max_length=MAX_TEXT, description="`squeue -a -o '%i|%T|%V|%a|%u|%P|%q|%b|%r|%j|%D|%S'`")
    sacct: str = Field(max_length=MAX_TEXT, description="`sacct -aP -S FROM -E AT -o <fields>` with its header")
    sacctmgr: str = Field(max_length=MAX_TEXT, description="`sacctmgr -nP show assoc format=<fields>`")
    team_field: Literal["Account", "Partition", "QOS"] = Field("Account", description="the field naming the team")


class SlurmStored(BaseModel):
    jobs: int = Field(description="GPU jobs stored (a job read again replaces itself)")
    restarts: int = Field(description="jobs seen requeued or restarted since their last read")
    queue_rows: int = Field(description="association limit and share figures stored")
    left_queue: int = Field(description="stored open jobs neither squeue nor sacct lists any more")
    skipped: dict[str, int] = Field(description="lines or rows skipped, by reason")


@router.post(SLURM_READ_PATH, response_model=SlurmStored)
def store_slurm_read(body: SlurmRead, request: Request, caller: AdminCaller, store: StoreDep) -> dict:
    """Store one read of a Slurm cluster's squeue, sacct and sacctmgr output as `serve --jobs-from slurm` would."""
    at = body.at if body.at.tzinfo else body.at.replace(tzinfo=utc_now().tzinfo)
    if at > utc_now() + CLOCK_SKEW:
        raise InputError(f"at {at.isoformat()} is in the future (this server's clock: {utc_now().isoformat()}): a "
                         "read is stored as of when it was made; check the sender host's clock")
    request.state.audit = {"bytes": len(body.squeue) + len(body.sacct) + len(body.sacctmgr)}
    read = parse_outputs(SlurmOutputs(at, body.squeue, body.sacct, body.sacctmgr, body.team_field))
    return {**store_read(store, read, SOURCE), "skipped": dict(read.jobs.skipped)}


__all__ = ["router", "SlurmRead", "SlurmStored"]
