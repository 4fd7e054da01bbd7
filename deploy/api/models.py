"""Response models of the HTTP API: what every field means, so /docs documents it and clients can rely on it.

GPU-hours count `interval_s * gpu_fraction` of each sample; "GPUs" in a time series are
average concurrent GPUs over the bucket; money is USD at the site's rate card.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field


class Window(BaseModel):
    start: datetime = Field(description="inclusive")
    end: datetime = Field(description="exclusive")


class Health(BaseModel):
    status: Literal["ok"]
    samples: int = Field(description="samples stored")
    latest_sample: datetime | None = Field(description="newest sample instant; null for an empty store")


class NodeStatus(BaseModel):
    node: str
    last_seen: datetime = Field(description="when the server last stored a batch from this agent")
    interval_s: float = Field(description="the agent's sampling interval")
    batches: int = Field(description="batches stored from this agent")
    rows: int = Field(description="samples stored from this agent")
    seconds_since: float = Field(description="seconds since last_seen")
    stale: bool = Field(description="no batch for 3 intervals")


class Team(BaseModel):
    team: str = Field(description="a configured team, or a team or bucket seen in samples ('unattributed')")
    share: float | None = Field(description="fairshare share from the site config; null if not configured")
    quota_gpus: int | None = Field(description="current quota in GPUs from the site config; null if none")


class UsageTotals(BaseModel):
    team: str
    allocated_gpu_hours: float = Field(description="GPU-hours a job of the team held a GPU")
    used_gpu_hours: float = Field(description="allocated GPU-hours weighted by GPU utilisation")
    jobs: int = Field(description="distinct jobs seen")
    efficiency: float = Field(description="used / allocated, 0..1")
    cost_usd: float


class ModelCost(BaseModel):
    team: str
    gpu_model: str
    usd_per_gpu_hour: float | None = Field(description="rate card; null: the model is unpriced")
    gpu_hours: float
    cost_usd: float


class SeriesPoint(BaseModel):
    bucket: datetime = Field(description="start of the time bucket")
    allocated_gpus: float = Field(description="average concurrent GPUs held by jobs")
    used_gpus: float = Field(description="allocated GPUs weighted by utilisation")


class UtilizationPoint(SeriesPoint):
    total_gpus: float = Field(description="average GPUs present (MIG instances as fractions)")


class TeamUsage(BaseModel):
    team: str
    window: Window
    totals: UsageTotals
    by_model: list[ModelCost]
    series: list[SeriesPoint]


class Rate(BaseModel):
    gpu_model: str
    usd_per_gpu_hour: float


class TeamCost(BaseModel):
    team: str = Field(description="a team, 'unattributed' (allocated, no team) or '__idle__' (no job held the GPU)")
    gpu_hours: float
    used_gpu_hours: float
    cost_usd: float
    unpriced_gpu_hours: float = Field(description="GPU-hours on models without a rate (priced at 0)")


class Costs(BaseModel):
    window: Window
    rates: list[Rate]
    teams: list[TeamCost]
    total_usd: float


class WasteThresholds(BaseModel):
    idle_minutes: float = Field(description="an allocated GPU idle this long counts as waste")
    idle_util_pct: float = Field(description="'idle' means utilisation under this")
    oversized_mem_fraction: float = Field(description="peak memory under this share of the card = oversized")


class TeamWaste(BaseModel):
    team: str
    idle_gpu_hours: float
    idle_cost_usd: float
    idle_stretches: int
    oversized_jobs: int
    oversized_gpu_hours: float


class IdleRun(BaseModel):
    team: str
    job_id: str | None
    node: str | None
    gpu_uuid: str
    gpu_model: str | None
    start_ts: datetime
    end_ts: datetime = Field(description="end of the last idle sample")
    idle_minutes: float
    idle_gpu_hours: float
    idle_cost_usd: float
    mean_util_pct: float | None


class Fit(BaseModel):
    kind: Literal["mig", "gpu"] = Field(description="a MIG slice of the same card, or a smaller whole card")
    target: str
    gpu_fraction: float = Field(description="share of a physical GPU the target occupies")


class OversizedJob(BaseModel):
    job_id: str
    team: str
    gpu_model: str | None
    gpus: int
    first_ts: datetime
    last_ts: datetime
    peak_mem_mib: float | None
    mem_total_mib: float | None
    mean_util_pct: float
    p95_util_pct: float
    gpu_hours: float
    cost_usd: float
    usd_per_gpu_hour: float | None
    fits: Fit | None = Field(description="the smallest shape that holds the job; null if none does")


class Waste(BaseModel):
    window: Window
    thresholds: WasteThresholds
    by_team: list[TeamWaste]
    idle_runs: list[IdleRun]
    oversized_jobs: list[OversizedJob]


class FairshareRow(BaseModel):
    hour: datetime
    team: str
    gpu_hours: float = Field(description="allocated GPU-hours in this hour")
    decayed_usage: float = Field(description="GPU-hours decayed with the half-life")
    norm_usage: float = Field(description="U: decayed usage over all teams' decayed usage")
    norm_share: float = Field(description="S: share over all shares")
    fairshare: float = Field(description="F = 2^(-U/S): 1 unused, 0.5 at its share, lower over-served")


class Fairshare(BaseModel):
    half_life_days: float
    history: list[FairshareRow]


class Recommendation(BaseModel):
    id: str = Field(description="stable hash of kind, team, job and action")
    kind: Literal["quota", "reclaim", "resize"]
    team: str
    job_id: str | None
    action: dict[str, Any] = Field(description="what to change")
    evidence: dict[str, Any] = Field(description="the measurements behind it")
    reason: str


class Recommendations(BaseModel):
    generated_at: datetime
    window: Window
    recommendations: list[Recommendation]


class BatchAnswer(BaseModel):
    """The answer to a one-batch request."""
    status: Literal["stored", "duplicate"]
    rows: int = Field(description="rows stored")
    rejected: dict[str, int] = Field(description="rows refused, by reason")
    nulled_values: int = Field(description="NaN/Inf values stored as NULL")


class MultiBatchAnswer(BaseModel):
    """The answer to a request of several consecutive batches, as lists over the batches."""
    first_seq: int
    batches: int
    rows: list[int] = Field(description="rows stored, per batch in seq order")
    duplicates: list[int] = Field(description="seqs already stored, acknowledged without storing")
    rejected: dict[str, dict[str, int]] = Field(description="by seq, rows refused by reason (batches with any)")
    nulled_values: dict[str, int] = Field(description="by seq, NaN/Inf values stored as NULL (batches with any)")
