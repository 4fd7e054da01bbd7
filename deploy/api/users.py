"""Each user's own jobs (issue 44 item 5): GET /v1/users, per-user cost and efficiency for a team lead, and
GET /v1/users/notes, a note per job owner for the jobs that wasted GPUs with what to change (jobstats-style).
A team token sees its own team's users and notes only (`caller.own`), the same rule as /v1/jobs."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from gpuledger.analytics.owner_notes import FINDINGS, owner_notes, user_table
from gpuledger.analytics.records import records
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import CaughtUp, ConfigDep, Days, End, StoreDep, window

router = APIRouter(tags=["users"], dependencies=[CaughtUp])
TeamFilter = Query(None, max_length=253, description="only this team's users (a team token: its own, always)")


class UserRow(BaseModel):
    team: str = Field(description="the team the jobs were billed to (a user in two teams has a row in each)")
    user: str | None = Field(description="the jobs' owner as their records name them (null: jobs without one)")
    jobs: int = Field(description="jobs of the window")
    gpu_hours: float = Field(description="their allocated GPU-hours")
    cost_usd: float = Field(description="their cost, USD")
    mean_util_pct: float | None = Field(description="mean utilisation over the measured GPU-hours (null: none)")
    util_coverage: float | None = Field(description="the share of the GPU-hours with a utilisation reading")
    idle_gpu_hours: float | None = Field(description="measured GPU-hours spent idle (null: none measured)")
    flagged_jobs: int = Field(description="jobs flagged as waste (mostly idle, or peak memory a small share)")
    flagged_cost_usd: float = Field(description="the cost of the flagged jobs, USD")


class Finding(BaseModel):
    finding: str = Field(description=f"one of {', '.join(FINDINGS)}")
    evidence: str = Field(description="the measured figures it rests on")
    wasted_usd: float | None = Field(description="the dollars it wasted (null: no figure can be put on it)")
    change: str = Field(description="what the owner can change")


class NotedJob(BaseModel):
    job_id: str = Field(description="the job")
    gpu_model: str | None = Field(description="the GPU model it held most")
    gpus: int = Field(description="GPUs (or MIG instances) it held")
    first_ts: datetime | None = Field(description="its first sample in the window")
    last_ts: datetime | None = Field(description="its last sample in the window")
    gpu_hours: float = Field(description="its allocated GPU-hours in the window")
    cost_usd: float = Field(description="their cost, USD, to the cent")
    findings: list[Finding] = Field(description="what wasted GPUs in it, each with what to change")


class OwnerNote(BaseModel):
    team: str = Field(description="the team whose jobs the note names: never another's")
    user: str = Field(description="the jobs' owner")
    jobs: list[NotedJob] = Field(description="the owner's jobs of that team that wasted GPUs, most wasteful first")
    gpu_hours: float = Field(description="the GPU-hours of the jobs named")
    cost_usd: float = Field(description="their cost, USD")
    wasted_usd: float = Field(description="the dollars wasted by the findings that carry a figure")
    unpriced_findings: int = Field(description="findings without a dollar figure (starved jobs, shapes with no fit)")


class OwnerNotes(BaseModel):
    start: datetime = Field(description="the window's start")
    end: datetime = Field(description="the window's end")
    notes: list[OwnerNote] = Field(description="a note per owner and team, the most wasted dollars first")
    jobs_without_owner: int = Field(description="jobs that wasted GPUs but name no user: no note can reach them")


@router.get("/v1/users", response_model=list[UserRow])
def users(caller: ReadCaller, store: StoreDep, config: ConfigDep, days: float = Days, end: datetime | None = End,
          team: str | None = TeamFilter) -> list[dict]:
    """Per team and user: jobs, GPU-hours, cost, measured utilisation, idle GPU-hours and flagged jobs."""
    start, stop, _ = window(days, end)
    return records(user_table(store, start, stop, config, caller.own(team, store)))


@router.get("/v1/users/notes", response_model=OwnerNotes)
def notes(caller: ReadCaller, store: StoreDep, config: ConfigDep, days: float = Days, end: datetime | None = End,
          team: str | None = TeamFilter,
          user: str | None = Query(None, max_length=253, description="only this owner's note")) -> dict:
    """A note per job owner and team for the jobs that wasted GPUs: idle, oversized or starved, each with its
    evidence, its dollars where known and what to change."""
    start, stop, _ = window(days, end)
    found = owner_notes(store, start, stop, config, caller.own(team, store), user)
    return {"start": start, "end": stop, **found}
