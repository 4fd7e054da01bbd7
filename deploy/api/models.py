"""Response models of the HTTP API: what every field means, so /docs documents it and clients can rely on it.

GPU-hours count `interval_s * gpu_fraction` of each sample; "GPUs" in a time series are
average concurrent GPUs over the bucket; money is USD at the site's rate card.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from gpuledger.analytics.config import WHATIF_MODELS
from gpuledger.analytics.efficiency import EFFICIENCY_FLAGS
from gpuledger.analytics.forecast import BASES as FORECAST_BASES
from gpuledger.analytics.forecast import STATUSES as FORECAST_STATUSES
from gpuledger.analytics.inference import SLO_STATUSES
from gpuledger.analytics.allocation import ZERO_FIELDS as ALLOCATION_ZERO_FIELDS
from gpuledger.analytics.budgets import ALERT_KINDS
from gpuledger.analytics.cost_split import LINE_KINDS
from gpuledger.analytics.ledger import PERIOD_STATES
from gpuledger.collector.jobs.classes import UNCLASSIFIED, WORKLOAD_CLASSES
from gpuledger.collector.jobs.lifecycle import LOST, OUTCOMES
from gpuledger.collector.jobs.queues import SCHEDULERS
from gpuledger.collector.topology import BASES as TOPOLOGY_BASES
from gpuledger.collector.topology import MAX_GPUS_PER_NODE
from gpuledger.collector.topology import PATHS as TOPOLOGY_PATHS
from gpuledger.collector.topology import SOURCES as TOPOLOGY_SOURCES
from gpuledger.policies.scheduler_state import COMPARISON_STATUSES
from gpuledger.policies.emitters import TARGETS
from gpuledger.policies.exporting import FORMATS
from gpuledger.policies.placers import POLICIES
from gpuledger.policies.exporting import STATUSES as EXPORT_STATUSES
from gpuledger.policies.recommendation import DECISIONS, KINDS, STATUSES, STORED_STATUSES

# the closed sets of advice as types (declared once in policies/recommendation.py)
Kind = Literal[KINDS]
Status = Literal[STATUSES]
StoredStatus = Literal[STORED_STATUSES]
DecisionName = Literal[tuple(DECISIONS)]

# what every `util_coverage` field means: a sample without a utilisation reading is unknown, never idle or zero
UTIL_COVERAGE = ("share (0..1) of the allocated GPU-hours with a GPU utilisation reading: what the used, idle and "
                 "busy figures rest on; null where nothing was allocated. A sample without a reading (e.g. the "
                 "Philly and Helios traces) counts for GPU-hours and cost, never as idle, busy or used")
PROFILE_FIELD_HELP = ("mean over the GPU-seconds that read it (0..1); null: the GPU or its exporter does not report "
                      "it (DCGM profiling fields, or NVML GPM on Hopper and later), never 0")
Target = Literal[TARGETS]
ExportStatus = Literal[tuple(EXPORT_STATUSES)]
ExportFormat = Literal[FORMATS]
PeriodStateName = Literal[PERIOD_STATES]
AlertKind = Literal[ALERT_KINDS]
LineKind = Literal[LINE_KINDS]


RATE_VARIANT = Field("", description="which rate: '' the model's own; 'pool <name>' a node pool's ([pool_rates], "
                                     "[node_pools]); 'profile <name>' a MIG profile's ([profile_rates], held per "
                                     "GPU-hour of the card's share)")
RATE_CARD = ("the rate card version's label, as bill lines name it: '[rates]' or 'from <start>', with the variant "
             "in brackets where it is a node pool's or MIG profile's")


class RequestBody(BaseModel):
    """A request's body: a field it does not know is refused (422 naming it), never dropped. A misspelt `limt` in a
    what-if edit or a `period` on a budget was answered 200 with the default in its place (issue 45's silent
    successes)."""
    model_config = ConfigDict(extra="forbid")

class Window(BaseModel):
    start: datetime = Field(description="inclusive")
    end: datetime = Field(description="exclusive")


class JobSourceState(BaseModel):
    source: str = Field(description="where job lifecycle and queues are read")
    reads: int = Field(description="reads stored so far")
    failures: int = Field(description="reads that failed")
    last_error: str | None = Field(description="why the last read failed, while reads fail")
    missing: list[str] = Field(description="what the last read found absent (kube-state-metrics, Kueue/KAI)")
    seconds_since_read: float | None = Field(description="since the last stored read; null: none yet")


class AppSourceState(BaseModel):
    source: str = Field(description="where inference servers' metrics are read")
    reads: int = Field(description="reads stored so far")
    failures: int = Field(description="reads that failed as a whole")
    last_error: str | None = Field(description="why the last read failed, while reads fail")
    skipped: dict[str, int] = Field(description="what the last read skipped, by reason (bad lines, families of "
                                                "an unknown version, counters that went negative, ...)")
    unreachable: list[str] = Field(description="targets the last read could not read, and why")
    seconds_since_read: float | None = Field(description="since the last stored read; null: none yet")


class Health(BaseModel):
    status: Literal["ok", "degraded"] = Field(description="degraded: the server's collection, its job lifecycle or "
                                                          "its inference metrics reads keep failing (3 intervals "
                                                          "or more)")
    reason: str | None = Field(None, description="why it is degraded")
    samples: int = Field(description="samples stored")
    latest_sample: datetime | None = Field(description="newest sample instant; null for an empty store")
    folded_until: datetime | None = Field(None, description="minutes before this instant are folded into the "
                                                            "rollups; null before the first fold")
    fold_behind_minutes: float | None = Field(None, description="how far the fold is behind the newest sample, "
                                                                "minutes (a few in steady state); null when empty")
    catching_up: bool = Field(False, description="the server is folding a backlog: analytic reads answer 503 with "
                                                 "Retry-After until it has caught up")
    job_source: JobSourceState | None = Field(None, description="the job lifecycle reader (`serve --jobs-from`); "
                                                                "null: none runs")
    app_source: AppSourceState | None = Field(None, description="the inference servers' metrics reader (`serve "
                                                                "--apps-from`, the demo's); null: none runs")


class Liveness(BaseModel):
    status: Literal["ok"] = Field(description="the process serves requests (nothing else is checked)")


class Readiness(BaseModel):
    ready: bool = Field(description="the store is caught up: analytic reads are answered")
    folded_until: datetime | None = Field(None, description="minutes before this instant are folded")
    fold_behind_minutes: float | None = Field(None, description="how far the fold is behind the newest sample")
    catching_up: bool = Field(description="a backlog is being folded")


class NodeStatus(BaseModel):
    node: str = Field(description="the agent's node name")
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
    parent: str | None = Field(None, description="the department above the team, if configured")


class UsageTotals(BaseModel):
    team: str = Field(description="the team (or bill line: 'unattributed', '__idle__')")
    allocated_gpu_hours: float = Field(description="GPU-hours a job of the team held a GPU")
    used_gpu_hours: float | None = Field(description="allocated GPU-hours weighted by GPU utilisation, over the "
                                                     "GPU-hours with a reading; null: no utilisation data")
    jobs: int = Field(description="distinct jobs seen")
    efficiency: float | None = Field(description="used / allocated GPU-hours with a utilisation reading, 0..1; "
                                                 "null: no utilisation data")
    util_coverage: float | None = Field(None, description=UTIL_COVERAGE)
    cost_usd: float = Field(description="cost at the rate card over the window, USD")


class ModelCost(BaseModel):
    team: str = Field(description="the team (or bill line: 'unattributed', '__idle__')")
    gpu_model: str = Field(description="GPU model, normalised name from the GPU catalogue")
    rate_from: datetime | None = Field(None, description="start of the rate card version that priced these hours")
    rate_variant: str | None = RATE_VARIANT
    rate_card: str | None = Field(None, description=RATE_CARD)
    usd_per_gpu_hour: float | None = Field(description="rate card; null: the model is unpriced")
    gpu_hours: float = Field(description="allocated GPU-hours on this model")
    cost_usd: float = Field(description="GPU-hours x the rate, USD")


class SeriesPoint(BaseModel):
    bucket: datetime = Field(description="start of the time bucket")
    allocated_gpus: float = Field(description="average concurrent GPUs held by jobs")
    used_gpus: float | None = Field(description="allocated GPUs weighted by utilisation (GPUs with a reading); null: "
                                                "GPUs were allocated but none had a utilisation reading")
    busy_gpus: float | None = Field(None, description="allocated GPUs with a reading at or over the idle threshold "
                                                      "([waste] idle_util_pct), average concurrent: the busy count "
                                                      "/metrics and the quota advice use; null as used_gpus")
    util_coverage: float | None = Field(None, description=UTIL_COVERAGE)


class UtilizationPoint(SeriesPoint):
    total_gpus: float = Field(description="average GPUs present (MIG instances as fractions)")


class TeamQuota(BaseModel):
    gpu_model: str = Field(description="GPU model, normalised name from the GPU catalogue")
    guarantee_gpus: float | None = Field(description="GPUs promised to the team (reclaimed from others when asked)")
    limit_gpus: float | None = Field(description="the most it may hold, borrowing idle GPUs")


class ModelPoint(BaseModel):
    bucket: datetime = Field(description="start of the time bucket (UTC)")
    gpu_model: str = Field(description="GPU model, normalised name from the GPU catalogue")
    allocated_gpus: float = Field(description="the team's average concurrent GPUs of this model")


class TeamUsage(BaseModel):
    team: str = Field(description="the team asked for")
    window: Window = Field(description="the window read, [start, end)")
    totals: UsageTotals = Field(description="the team's totals over the window (GPU-hours, jobs, cost in USD)")
    by_model: list[ModelCost] = Field(description="GPU-hours and cost (USD) per GPU model")
    series: list[SeriesPoint] = Field(description="its GPUs per time bucket")
    quotas: list[TeamQuota] = Field(description="its guarantee and limit per GPU model, as in force")
    model_series: list[ModelPoint] = Field(description="its allocated GPUs per bucket and model, against quotas")


class Rate(BaseModel):
    gpu_model: str = Field(description="GPU model, normalised name from the GPU catalogue")
    variant: str = RATE_VARIANT
    usd_per_gpu_hour: float = Field(description="price of one GPU-hour of this model, USD")
    effective_from: datetime = Field(description="when this rate starts (1970-01-01: the undated [rates])")
    until: datetime | None = Field(None, description="when the model's next rate starts; null: in force since")
    rate_card: str = Field(description=RATE_CARD)
    basis: str | None = Field(None, description="how a cost model ([cost_models]) derived the rate, its arithmetic "
                                                "written out; null: the rate was given as is")


class StatementLine(BaseModel):
    team: str = Field(description="a team, 'unattributed' or '__idle__' (idle capacity)")
    kind: LineKind = Field(description="usage: the team's own; idle share: its share of idle capacity; shared "
                                       "cost: its share of a shared-cost team's ([ledger] idle, shared_teams)")
    shared_from: str | None = Field(description="whose cost a share was: '__idle__' or the shared-cost team")
    gpu_model: str | None = Field(description="GPU model; null: the samples named none")
    rate_from: datetime | None = Field(description="start of the rate card version that priced the line; null: "
                                                   "unpriced (no rate for the model then)")
    rate_variant: str | None = RATE_VARIANT
    rate_card: str | None = Field(description=RATE_CARD)
    usd_per_gpu_hour: float | None = Field(description="the rate that priced the line, USD; null: unpriced")
    gpu_hours: float = Field(description="allocated GPU-hours (idle capacity: GPU-hours no job held)")
    used_gpu_hours: float | None = Field(description="busy GPU-hours (allocated, weighted by utilisation); null "
                                                     "where none was measured")
    util_coverage: float | None = Field(description=UTIL_COVERAGE)
    cost_usd: float = Field(description="USD, rounded to the cent")


class Adjustment(BaseModel):
    id: str = Field(description="the adjustment's id")
    period: str = Field(description="the period it is booked into (the first open one at or after `corrects`)")
    corrects: str = Field(description="the period it corrects")
    team: str = Field(description="the team (or bill line) charged or credited")
    usd: float = Field(description="USD: positive charges the team, negative credits it")
    reason: str = Field(description="what it corrects and why, as given")
    made_by: str = Field(description="the token that booked it (name and id)")
    made_at: datetime = Field(description="when it was booked")


class AdjustmentRequest(RequestBody):
    team: str = Field(min_length=1, max_length=253, description="a team of the config, the store or a statement")
    usd: float = Field(strict=True, allow_inf_nan=False, description="USD, to the cent (no finer): positive "
                                                                     "charges, negative credits; not zero")
    # printable text only: a reason is written into terminals, CSV files and pages, where a control character
    # (a CR, an escape sequence) could rewrite what finance reads
    reason: str = Field(min_length=1, max_length=2000, pattern=r"^[^\x00-\x1f\x7f]+$",
                        description="what it corrects and why (printable text, no control characters)")
    corrects: str = Field(min_length=1, max_length=16, description="the period corrected, e.g. 2026-11")


class StatementTeam(BaseModel):
    team: str = Field(description="a team, 'unattributed' or '__idle__' (idle capacity)")
    gpu_hours: float = Field(description="its lines' GPU-hours")
    usage_usd: float = Field(description="its lines' cost, USD (the sum of their cents)")
    adjustments_usd: float = Field(description="the adjustments booked for it into this period, USD")
    total_usd: float = Field(description="usage plus adjustments, USD")


class PeriodState(BaseModel):
    period: str = Field(description="2026-11 (a month) or 2026-W48 (an ISO week), as [ledger] period says")
    start: datetime = Field(description="inclusive, UTC")
    end: datetime = Field(description="exclusive, UTC")
    state: PeriodStateName = Field(description="closed: its statement is stored and final; open: not yet")
    closes_at: datetime = Field(description="when it closes (its end plus [ledger] grace_days), or closed")
    closed_at: datetime | None = Field(description="when it closed; null while open")
    closed_by: str | None = Field(description="what closed it (the server, or `gpuledger statement`)")
    total_usd: float | None = Field(description="a closed period's statement total (usage and adjustments)")


class StatementCoverage(BaseModel):
    """What a statement rests on: the hours of its period that hold samples."""
    hours_with_data: int = Field(description="clock hours of the period holding at least one sample of any GPU")
    hours_elapsed: float = Field(description="hours of the period up to now (all of them once it ended)")
    hours_in_period: float = Field(description="hours of the whole period")
    share: float | None = Field(description="hours_with_data / hours_elapsed; null before the period began")
    first_hour: datetime | None = Field(description="the first hour with samples (UTC); null: none")
    last_hour: datetime | None = Field(description="the last hour with samples (UTC); null: none")
    note: str | None = Field(description="set when the samples cover under 99% of the hours: which and how many")


class Statement(BaseModel):
    period: str = Field(description="2026-11 (a month) or 2026-W48 (an ISO week)")
    start: datetime = Field(description="inclusive, UTC")
    end: datetime = Field(description="exclusive, UTC")
    state: PeriodStateName = Field(description="closed: stored, final; open: a draft computed now")
    closes_at: datetime = Field(description="its end plus [ledger] grace_days")
    closed_at: datetime | None = Field(description="when it closed; null while open")
    closed_by: str | None = Field(description="what closed it")
    split: str = Field(description="how idle capacity and shared-cost teams were split ([ledger] idle, idle_by, "
                                   "shared_teams, share_by); a closed statement keeps the split it closed with")
    coverage: StatementCoverage = Field(description="the hours of the period its samples cover")
    lines: list[StatementLine] = Field(description="per bill line, GPU model and rate card version")
    adjustments: list[Adjustment] = Field(description="the corrections booked into this period")
    teams: list[StatementTeam] = Field(description="per bill line: usage, adjustments and total, in cents")
    total_usd: float = Field(description="the sum of the lines' and adjustments' cents shown (a team token: its own "
                                         "and the shared lines)")
    cluster_total_usd: float = Field(description="the whole statement's total, every line")


class TeamCost(BaseModel):
    team: str = Field(description="a team, 'unattributed' (allocated, no team) or '__idle__' (no job held the GPU)")
    gpu_hours: float = Field(description="allocated GPU-hours in the window")
    used_gpu_hours: float | None = Field(description="allocated GPU-hours weighted by utilisation, over the "
                                                     "GPU-hours with a reading; null: no utilisation data")
    cost_usd: float = Field(description="GPU-hours x the rate card, USD (exact with or without utilisation data)")
    unpriced_gpu_hours: float = Field(description="GPU-hours on models without a rate (priced at 0)")
    util_coverage: float | None = Field(None, description=UTIL_COVERAGE)


class Costs(BaseModel):
    window: Window = Field(description="the window priced, [start, end)")
    rates: list[Rate] = Field(description="the rate card versions in force during the window, USD per GPU-hour")
    teams: list[TeamCost] = Field(description="one line per team and bill line")
    total_usd: float = Field(description="USD: the sum of the lines shown (a team token: its own and the shared "
                                         "lines), so the table adds up to it")
    cluster_total_usd: float = Field(description="USD: the whole cluster's cost over the window, every line")


class WasteThresholds(BaseModel):
    idle_minutes: float = Field(description="an allocated GPU idle this long counts as waste")
    idle_util_pct: float = Field(description="'idle' means utilisation under this")
    oversized_mem_fraction: float = Field(description="peak memory under this share of the card = oversized")


class TeamWaste(BaseModel):
    team: str = Field(description="the team (or bill line: 'unattributed', '__idle__')")
    idle_gpu_hours: float = Field(description="allocated GPU-hours in idle stretches")
    idle_cost_usd: float = Field(description="what those idle GPU-hours cost, USD")
    idle_stretches: int = Field(description="idle stretches counted, one per job and stretch")
    oversized_jobs: int = Field(description="busy jobs whose peak memory was under the oversized share of the card")
    oversized_gpu_hours: float = Field(description="GPU-hours of those oversized jobs")


class IdleRun(BaseModel):
    team: str = Field(description="the team (or bill line: 'unattributed', '__idle__')")
    job_id: str | None = Field(description="the job's id; null when no job held it (then one row per GPU)")
    node: str | None = Field(description="the node; null when unknown")
    gpu_model: str | None = Field(description="GPU model, normalised name from the GPU catalogue")
    gpus: int = Field(description="GPUs (or MIG instances) of the job idle in this stretch")
    gpu_uuids: list[str] = Field(description="their UUIDs")
    start_ts: datetime = Field(description="start of the first idle sample of any of them (UTC)")
    end_ts: datetime = Field(description="end of the last idle sample of any of them")
    idle_minutes: float = Field(description="the longest idle time of its GPUs in the stretch, minutes")
    idle_gpu_hours: float = Field(description="GPU-hours held idle in it, summed over its GPUs (MIG as fractions)")
    idle_cost_usd: float = Field(description="what the stretch cost, USD")
    mean_util_pct: float | None = Field(description="mean GPU utilisation over the stretch, weighted by idle "
                                                    "GPU-hours, %; null: no reading")


class Fit(BaseModel):
    kind: Literal["mig", "gpu"] = Field(description="a MIG slice of the same card, or a smaller whole card")
    target: str = Field(description="the MIG profile (e.g. 1g.10gb) or GPU model advised")
    gpu_fraction: float = Field(description="share of a physical GPU the target occupies")


class OversizedJob(BaseModel):
    job_id: str = Field(description="the job's id")
    team: str = Field(description="the team (or bill line: 'unattributed', '__idle__')")
    gpu_model: str | None = Field(description="GPU model, normalised name from the GPU catalogue")
    gpus: int = Field(description="distinct GPUs it held")
    first_ts: datetime = Field(description="its first sample (UTC)")
    last_ts: datetime = Field(description="its last sample (UTC)")
    peak_mem_mib: float | None = Field(description="peak memory used on a GPU, MiB")
    mem_total_mib: float | None = Field(description="the card's (or instance's) memory, MiB")
    mean_util_pct: float | None = Field(description="mean GPU utilisation over the samples with a reading, %; null: "
                                                    "no utilisation data")
    p95_util_pct: float | None = Field(description="95th percentile of GPU utilisation, %; null: no utilisation data")
    util_coverage: float | None = Field(None, description=UTIL_COVERAGE)
    gpu_hours: float = Field(description="allocated GPU-hours in the window")
    cost_usd: float = Field(description="its cost in the window, USD")
    usd_per_gpu_hour: float | None = Field(description="the model's rate, USD per GPU-hour; null unpriced")
    idle: bool = Field(description="p95 utilisation under the idle threshold: give the GPUs back, no shape advised")
    fits: Fit | None = Field(description="the smallest shape that holds the job; null if none does or it is idle")


class Waste(BaseModel):
    window: Window = Field(description="the window read, [start, end)")
    thresholds: WasteThresholds = Field(description="what counted as idle and oversized")
    by_team: list[TeamWaste] = Field(description="idle and oversized totals per team")
    idle_runs: list[IdleRun] = Field(description="idle stretches, one per job and stretch, costliest first")
    oversized_jobs: list[OversizedJob] = Field(description="busy jobs that asked for more GPU memory than they used "
                                                           "(an idle job is listed under idle_runs only)")


class FairshareRow(BaseModel):
    hour: datetime = Field(description="the clock hour (UTC)")
    team: str = Field(description="the team")
    gpu_hours: float = Field(description="allocated GPU-hours in this hour")
    fairshare: float = Field(description="the algorithm's factor, 0..1, higher = more deserving: slurm_classic "
                                         "F = 2^(-U/S) (0.5 = at its share); slurm_fair_tree the mean rank-based "
                                         "FairShare of the team's users; kai_time_based its part of over-quota GPUs")
    over_served: bool = Field(description="used more than its share (F < 0.5; LevelFS < 1; usage above weight)")
    decayed_usage: float | None = Field(None, description="Slurm: GPU-hours decayed with the half-life")
    norm_usage: float | None = Field(None, description="slurm_classic: decayed usage over all teams' decayed usage")
    effective_usage: float | None = Field(None, description="Slurm: usage as the algorithm weighs it (EffectvUsage)")
    norm_share: float | None = Field(None, description="Slurm: share over the siblings' (Fair Tree) or the "
                                                       "machine's (classic) shares")
    level_fs: float | None = Field(None, description="slurm_fair_tree: LevelFS = S / U; null when infinite (no usage)")
    usage: float | None = Field(None, description="kai_time_based: windowed GPU-hours over the cluster's")
    weight: float | None = Field(None, description="kai_time_based: normalised overQuotaWeight (share)")
    over_quota_weight: float | None = Field(None, description="kai_time_based: P = max(0, W + k (W - U))")


class Fairshare(BaseModel):
    algorithm: str = Field(description="slurm_classic | slurm_fair_tree | kai_time_based ([fairshare] algorithm)")
    half_life_days: float = Field(description="decay half-life of past usage, days ([fairshare] half_life_days)")
    history: list[FairshareRow] = Field(description="per hour and team: usage and the factor")


class Alternatives(BaseModel):
    """Where an open placement advice stands among advice that wants the same GPUs or jobs."""
    group: str = Field(description="one id for advice that cannot all be done together (a group of one if alone)")
    rank: int = Field(ge=1, description="1 = the best of its group, by dollars per week (unpriced last)")
    of: int = Field(ge=1, description="advice in the group")
    competes_with: list[str] = Field(description="ids of the group's advice it cannot be done together with")
    counted: bool = Field(description="whether potential_savings counts it: it is priced and in the most "
                                      "valuable set of its group's advice that can all be done")
    claims: dict[str, Any] = Field(description="what it needs: free_gpus_taken and free_gpus_seen per node, "
                                               "wants_whole_nodes (a consolidation stored before it recorded "
                                               "the node's free GPUs), jobs_changed")


class PotentialSavings(BaseModel):
    """What the open placement advice can save per week, each group of alternatives counted once."""
    usd_per_week: float | None = Field(description="the counted advice's dollars per week; null when advice is "
                                                   "shown but none prices its effect (unknown, not zero)")
    groups: int = Field(description="groups of alternatives among the advice shown")
    advice: int = Field(description="placement advice shown")
    priced: int = Field(description="of which with a price (effect_usd_per_week)")
    counted: list[str] = Field(description="ids of the advice the total counts")
    left_out: list[str] = Field(description="ids of priced advice not counted: an alternative in its group wins")
    basis: str = Field(description="how the total is made")


class Recommendation(BaseModel):
    id: str = Field(description="stored: unique; preview: a stable hash of kind, team, model, job and action")
    kind: Kind = Field(description="quota: a guarantee and limit per GPU model; reclaim: GPUs held idle; resize: a "
                                   "job that fits a MIG slice or smaller card; consolidate: jobs to move so a waiting "
                                   "gang job fits; colocate: a job spread over nodes whose measured cross-node "
                                   "traffic one NVLink island would carry; separate: a latency-sensitive job "
                                   "sharing a GPU with other work; efficiency: a job whose SMs wait")
    team: str = Field(description="the team the advice is for")
    gpu_model: str | None = Field(description="the GPU model a quota or a job's GPUs are for")
    job_id: str | None = Field(description="the job it is about; null for quota advice")
    status: Status = \
        Field(description="proposed, then accepted / rejected / applied by a decision, or superseded by newer "
                          "evidence; insufficient_data: no number, see reason; held_back: quota advice whose simulated "
                          "effect harms other teams beyond [whatif]'s bound (see reason and evidence."
                          "simulated_effect); preview: evaluated at `end`, not stored")
    created: datetime | None = Field(description="when it was stored; null for previews and insufficient_data")
    action: dict[str, Any] = Field(description="what to change; quota: guarantee_gpus (GPUs promised), limit_gpus "
                                               "(most it may hold, borrowing), current_guarantee_gpus")
    evidence: dict[str, Any] = Field(description="the measurements behind it, and its expected effect per week; "
                                                 "quota changes: simulated_effect, the policy window's jobs replayed "
                                                 "with and without it (waits for the team and the others)")
    reason: str = Field(description="why, in one sentence")
    decided_by: str | None = Field(None, description="who decided; null while undecided")
    decided_at: datetime | None = Field(None, description="when it was decided (UTC); null while undecided")
    note: str | None = Field(None, description="the decision's note")
    alternatives: Alternatives | None = Field(
        None, description="open placement advice: its group of alternatives (policies/alternatives.py); null for "
                          "quota advice, advice not open, and the stored history")


class Recommendations(BaseModel):
    generated_at: datetime = Field(description="when this answer was made (UTC)")
    as_of: datetime = Field(description="the instant the policy was evaluated at")
    policy_window: Window = Field(description="the history the advice comes from ([quota] window_days)")
    recommendations: list[Recommendation] = \
        Field(description="open advice (proposed, accepted) and insufficient_data notes")
    potential_savings: PotentialSavings = Field(description="the advice shown, each group of alternatives once")


class Decision(RequestBody):
    decision: DecisionName = Field(
        description="accept: agreed, to be applied; reject: not to be applied; applied: the scheduler now runs it "
                    "(a quota's guarantee becomes the current one)")
    by: str = Field(min_length=1, max_length=200, description="who decided")
    note: str | None = Field(None, max_length=4000, description="why")


class BatchAnswer(BaseModel):
    """The answer to a one-batch request."""
    status: Literal["stored", "duplicate"] = \
        Field(description="stored, or duplicate: the batch was already stored (acknowledged, nothing written)")
    rows: int = Field(description="rows stored")
    rejected: dict[str, int] = Field(description="rows refused, by reason")
    nulled_values: int = Field(description="NaN/Inf values stored as NULL")


class MultiBatchAnswer(BaseModel):
    """The answer to a request of several consecutive batches, as lists over the batches."""
    first_seq: int = Field(description="seq of the first batch of the request")
    batches: int = Field(description="batches in the request")
    rows: list[int] = Field(description="rows stored, per batch in seq order")
    duplicates: list[int] = Field(description="seqs already stored, acknowledged without storing")
    rejected: dict[str, dict[str, int]] = Field(description="by seq, rows refused by reason (batches with any)")
    nulled_values: dict[str, int] = Field(description="by seq, NaN/Inf values stored as NULL (batches with any)")


class HealthEvent(BaseModel):
    ts: datetime = Field(description="the reading that showed the change")
    node: str = Field(description="the node")
    gpu_uuid: str = Field(description="the GPU's (or MIG instance's) UUID")
    gpu_index: int | None = Field(description="the GPU's index on the node")
    gpu_model: str | None = Field(description="GPU model, normalised name from the GPU catalogue")
    kind: str = Field(description="xid, thermal_throttle, power_throttle, hw_slowdown, ecc_sbe, ecc_dbe, "
                                  "row_remap_corr, row_remap_uncorr or row_remap_failure")
    code: int | None = Field(description="xid: the XID code; throttling: the reasons bitmask (NVML's bits)")
    increase: int | None = Field(description="counters (ECC, remapped rows): by how much they rose; else 1")
    job_id: str | None = Field(description="the job that held the GPU then; null when it was free")
    team: str | None = Field(description="the team of the job; null when the GPU was free")
    user: str | None = Field(description="the job's user; null when unknown")
    meaning: str = Field(description="for XIDs: what the code usually means")


class HealthCounts(BaseModel):
    """Events per kind (collector/gpu_health.py)."""
    xid: int = Field(description="XID errors (count)")
    thermal_throttle: int = Field(description="thermal throttling starts (count)")
    power_throttle: int = Field(description="power-cap throttling starts (count)")
    hw_slowdown: int = Field(description="hardware slowdown starts (count)")
    ecc_sbe: int = Field(description="single-bit ECC errors (count)")
    ecc_dbe: int = Field(description="double-bit ECC errors (count)")
    row_remap_corr: int = Field(description="rows remapped for correctable errors (count)")
    row_remap_uncorr: int = Field(description="rows remapped for uncorrectable errors (count)")
    row_remap_failure: int = Field(description="failed row remappings (count)")


class JobHealth(HealthCounts):
    job_id: str = Field(description="the job's id")
    team: str | None = Field(description="its team; null when unknown")
    events: int = Field(description="events on the GPUs the job held, while it held them")
    xid_codes: list[int] | None = Field(description="the distinct XID codes seen")
    gpus_affected: int = Field(description="GPUs with at least one event")
    first_event: datetime = Field(description="first event (UTC)")
    last_event: datetime = Field(description="last event (UTC)")
    job_state: str | None = Field(description="the job's state as the scheduler recorded it, when known")


class GpuHealth(HealthCounts):
    node: str = Field(description="the node")
    gpu_uuid: str = Field(description="the GPU's (or MIG instance's) UUID")
    gpu_index: int | None = Field(description="the GPU's index on the node")
    gpu_model: str | None = Field(description="GPU model, normalised name from the GPU catalogue")
    last_xid: int | None = Field(description="the latest XID code; null when none")
    jobs_hit: int = Field(description="distinct jobs that held the GPU during an event")
    last_event: datetime = Field(description="the latest event (UTC)")


class HealthReport(BaseModel):
    window: Window = Field(description="the window read, [start, end)")
    events_until: datetime | None = Field(description="events are derived as minutes are folded: they reach this "
                                                      "instant, a few minutes behind the newest sample")
    events: list[HealthEvent] = Field(description="newest first, at most `limit`")
    by_job: list[JobHealth] = Field(description="event counts per job")
    by_gpu: list[GpuHealth] = Field(description="event counts per GPU")


class TelemetryCoverage(BaseModel):
    node: str = Field(description="the node")
    samples: int = Field(description="samples of the node in the last `minutes`")
    sm_active: float = Field(description="share of those samples carrying SM activity (a DCGM profiling field)")
    sm_occupancy: float = Field(description="share of samples carrying SM occupancy, 0..1")
    tensor_active: float = Field(description="share of samples carrying tensor-core activity, 0..1")
    dram_active: float = Field(description="share of samples carrying DRAM activity, 0..1")
    power_w: float = Field(description="share of samples carrying power (W), 0..1")
    temp_c: float = Field(description="share of samples carrying temperature (°C), 0..1")
    nvlink_tx_bps: float = Field(description="NVLink per direction (profiling field or NVML)")
    nvlink_bps: float = Field(description="NVLink total (dcgm-exporter's default NVLINK_BANDWIDTH_TOTAL)")
    pcie_tx_bps: float = Field(description="share of samples carrying PCIe transmit (bytes/s), 0..1")
    xid: float = Field(description="share of samples carrying the XID field, 0..1")
    throttle_reasons: float = Field(description="share of samples carrying throttle reasons, 0..1")
    ecc_dbe_total: float = Field(description="share of samples carrying the double-bit ECC counter, 0..1")


class WorkloadShape(BaseModel):
    gpus: int = Field(description="GPUs the task holds")
    gpu_milli: int = Field(description="milli-GPU of each (1000: whole GPUs; less: a MIG slice or shared GPU)")
    share: float = Field(description="how common the shape is among the recent jobs kept (sums to 1)")


class NodeFragmentation(BaseModel):
    node: str = Field(description="the node")
    gpu_model: str | None = Field(description="GPU model, normalised name from the GPU catalogue")
    gpus: float = Field(description="GPUs present, in GPUs")
    idle_gpus: float = Field(description="GPU no job holds, in GPUs (parts of shared or MIG GPUs count)")
    fragmented_gpus: float = Field(description="idle GPU the typical job cannot use (FGD): stranded capacity")
    fragmented_share: float = Field(description="fragmented / idle, 0..1")
    stranded_usd_per_day: float | None = Field(description="fragmented GPUs x the model's rate x 24 h; null unpriced")


class FragmentationPoint(BaseModel):
    ts: datetime = Field(description="when the server recorded it (UTC)")
    gpus: float = Field(description="GPUs present, in GPUs")
    idle_gpus: float = Field(description="GPUs no job held, in GPUs")
    fragmented_gpus: float = Field(description="idle GPUs the typical job cannot use, in GPUs")


class Fragmentation(BaseModel):
    at: datetime | None = Field(description="the instant the state is read at (each node's newest sample)")
    enough_data: bool = Field(description="false when no job held a GPU in the window (no workload to measure "
                                          "against) or no node reported in the last 10 minutes")
    reason: str | None = Field(None, description="why there is not enough data; null when there is")
    workload: list[WorkloadShape] = Field(description="the job shapes covering 95% of the window's jobs")
    gpus: float = Field(description="GPUs present, in GPUs")
    idle_gpus: float = Field(description="GPUs no job holds, in GPUs")
    fragmented_gpus: float = Field(description="idle GPUs the typical job cannot use (FGD), in GPUs")
    fragmented_share_of_idle: float = Field(description="fragmented / idle GPUs, 0..1")
    fragmented_share_of_capacity: float = Field(description="fragmented / present GPUs, 0..1")
    stranded_usd_per_day: float = Field(description="what the fragmented GPUs cost per day at the rate card")
    nodes: list[NodeFragmentation] = Field(description="most fragmented first")
    history: list[FragmentationPoint] = Field(description="the cluster's fragmentation as the server recorded it")


class PlacementRequest(RequestBody):
    gpus: int = Field(1, ge=1, le=64, description="GPUs the task needs (per pod, for a gang of pods)")
    pods: int = Field(1, ge=1, le=512, description="pods of a gang, each of `gpus` whole GPUs, placed all at once "
                                                   "inside one group of [topology] keep_within (clique or rack), "
                                                   "on one GPU model unless mix_models")
    gpu_fraction: float | None = Field(None, gt=0, le=1, description="part of one GPU (a shared GPU; gpus must be 1)")
    mig_profile: str | None = Field(None, max_length=32, pattern=r"^\d+g\.\d+gb$",
                                    description="a MIG profile, e.g. 1g.10gb (gpus must be 1)")
    gpu_model: list[str] | None = Field(
        None, max_length=16, description="allowed GPU models: rate-card names (H100, A100-80GB) or the Kueue flavor "
                                         "names gpuledger emits for them (h100, a100-80gb), in any case; a name that "
                                         "is neither a catalogue model nor a model present is a 422 naming those "
                                         "present")
    mix_models: bool = Field(False, description="let a gang's pods (`pods` > 1) go to different GPU models; by "
                                                "default every pod of a gang is on one model, since a "
                                                "data-parallel job steps at its slowest card")
    limit: int = Field(10, ge=1, le=1000, description="how many ranked candidates to return")
    scheduler: Literal["kueue", "kai"] | None = Field(
        None, description="answer with the pod-set annotations that keep the job inside [topology] keep_within's "
                          "level in this scheduler (when [topology] scheduler_objects is on)")


class PlacementCandidate(BaseModel):
    node: str = Field(description="the node")
    gpu_model: str | None = Field(description="GPU model, normalised name from the GPU catalogue")
    gpus: list[str] = Field(description="the GPUs (UUIDs) the task would take")
    within_island: bool | None = Field(description="true: all of them in one NVLink island; false: the node can only "
                                                   "split the task; null: the node's topology is unknown")
    island: int | None = Field(description="the island taken (analytics: GET /v1/topology), when within one")
    score: int = Field(description="FGD score 0..100: 50 = fragmentation unchanged, higher = it falls")
    fragmentation_before_gpus: float = Field(description="the node's fragmented GPUs now, in GPUs")
    fragmentation_after_gpus: float = Field(description="its fragmented GPUs with the task placed, in GPUs")


class GangPod(BaseModel):
    node: str = Field(description="the node the pod goes to")
    gpu_model: str | None = Field(description="the node's GPU model (catalogue name)")
    gpus: list[str] = Field(description="its GPUs (UUIDs)")
    within_island: bool | None = Field(description="all of them in one NVLink island; null: topology unknown")
    island: int | None = Field(description="the island taken, when within one")


class GangGroupTried(BaseModel):
    group: str = Field(description="the clique or rack ('cluster' for island and node)")
    gpu_model: str | None = Field(description="the GPU model of the group's nodes tried; null with mix_models "
                                              "(every allowed model of the group together)")
    nodes: int = Field(description="nodes of the group (of that model)")
    gpus_free: int = Field(description="GPUs free on them now")
    pods_fit: int = Field(description="pods of the gang they could take now, each pod's GPUs on one node")
    fits: bool = Field(description="true: it takes every pod of the gang")
    chosen: bool = Field(description="true: the group the gang is placed in")
    fragmentation_added_gpus: float | None = Field(description="when it fits: the cluster's fragmented GPUs the "
                                                               "gang would add there; null otherwise")
    reason: str = Field(description="why it was chosen or not, e.g. 'room for 1 of 2 pods now: 1 GPU(s) free on "
                                    "1 node(s), and each pod needs 1 GPU(s) on one node'")


class GangPlacement(BaseModel):
    pods: int = Field(description="pods asked for")
    scope: str = Field(description="what the gang is kept inside ([topology] keep_within): clique or rack keep "
                                   "every pod in one; island and node, each pod inside one island of its node")
    mix_models: bool = Field(description="as asked: false keeps every pod on one GPU model")
    group: str | None = Field(description="the clique or rack chosen ('cluster' for island and node); null: none")
    gpu_model: str | None = Field(description="the GPU model every pod is on; null when none is placed or (with "
                                              "mix_models) the pods are on several")
    placed: list[GangPod] = Field(description="where each pod goes; [] when no group takes them all")
    reason: str | None = Field(description="why the gang is not placed (the groups tried say each one's); null "
                                           "when placed")
    groups_considered: int = Field(description="groups tried: each clique or rack (or the cluster) with a node of "
                                               "an allowed model known to be in it, once per GPU model unless "
                                               "mix_models")
    groups_fitting: int = Field(description="of them, those that take the whole gang now")
    tried: list[GangGroupTried] = Field(description="every group tried, the chosen first, then those closest to "
                                                    "taking the gang: how many pods each could take and why not")
    nodes_without_group: list[str] = Field(description="nodes whose clique or rack is unknown: never placed on")
    fragmentation_added_gpus: float | None = Field(description="the cluster's fragmented GPUs added by the gang")


class PlacementAnswer(BaseModel):
    at: datetime | None = Field(description="the instant the cluster state is read at (UTC); null without data")
    request_gpu_milli: int = Field(description="milli-GPU per GPU the request was read as")
    candidates: list[PlacementCandidate] = Field(description="best first; ties to the lowest node name")
    feasible: int = Field(description="places the task could go in all")
    within_island: int = Field(description="of those, places that keep it inside one NVLink island")
    keep_within: str = Field(description="what a multi-GPU task is kept inside ([topology] keep_within); 'node': "
                                         "islands are reported, not ranked by")
    annotations: dict[str, str] = Field(description="pod-set annotations for the scheduler asked ({} when none)")
    annotations_note: str | None = Field(None, description="why `annotations` is empty although a scheduler was "
                                                           "asked for (and what to set); null otherwise")
    reason: str | None = Field(None, description="why there is no candidate")
    gang: GangPlacement | None = Field(None, description="for `pods` > 1 (null otherwise): the gang's placement, "
                                                         "or why there is none (candidates are then the first "
                                                         "pod's)")


class JobRow(BaseModel):
    job_id: str = Field(description="the job's id")
    team: str = Field(description="the team (or bill line: 'unattributed', '__idle__')")
    user: str | None = Field(description="the job's user; null when unknown")
    gpu_model: str | None = Field(description="GPU model, normalised name from the GPU catalogue")
    gpus: int = Field(description="distinct GPUs (and MIG instances) it held in the window")
    mig_profile: str | None = Field(description="its MIG profile (e.g. 1g.10gb); null on whole GPUs")
    first_ts: datetime = Field(description="its first sample in the window (UTC)")
    last_ts: datetime = Field(description="when its last sample's interval ended")
    gpu_hours: float = Field(description="allocated GPU-hours in the window")
    cost_usd: float = Field(description="its cost in the window, USD")
    mean_util_pct: float | None = Field(description="mean GPU utilisation over its samples with a reading, %; null: "
                                                    "no utilisation data")
    p95_util_pct: float | None = Field(description="95th percentile of its per-minute mean utilisation (whole GPUs, "
                                                   "minutes with a reading); null: no utilisation data")
    peak_mem_mib: float | None = Field(description="peak GPU memory used, MiB")
    mem_total_mib: float | None = Field(description="the card's (or instance's) memory")
    idle_share: float | None = Field(description="share of its GPU-hours with a utilisation reading that were under "
                                                 "the idle threshold; null: no utilisation data")
    util_coverage: float | None = Field(None, description=UTIL_COVERAGE)
    util_note: str | None = Field(None, description="'no utilisation data' when none of its GPU-hours had a reading, "
                                                    "how much was measured when part of them had; null: all were")
    waste: bool = Field(description="idle share at least 0.5, or peak memory under the oversized threshold")
    dra_claims: list[str] = Field(default_factory=list, description="the Kubernetes DRA ResourceClaims "
                                  "(namespace/name) its GPUs came through in the window; empty without DRA")
    sm_active: float | None = Field(None, description="SM active: " + PROFILE_FIELD_HELP)
    sm_occupancy: float | None = Field(None, description="SM occupancy: " + PROFILE_FIELD_HELP)
    tensor_active: float | None = Field(None, description="tensor pipes active: " + PROFILE_FIELD_HELP)
    dram_active: float | None = Field(None, description="DRAM active: " + PROFILE_FIELD_HELP)
    profiling_coverage: float | None = Field(None, description="share (0..1) of its GPU-hours with an SM activity "
                                                               "reading")
    util_on_profiled_pct: float | None = Field(None, description="GPU_UTIL over the GPU-seconds that read SM "
                                                                 "activity, %")
    nvlink_gb: float | None = Field(None, description="NVLink bytes moved, GB")
    pcie_gb: float | None = Field(None, description="PCIe bytes moved, GB; null: not read")


class DailyCost(BaseModel):
    day: datetime = Field(description="the UTC day (its midnight)")
    team: str = Field(description="a team, 'unattributed', or '__idle__' (GPUs no job held)")
    cost_usd: float = Field(description="cost of the day, USD")


class GpuHolder(BaseModel):
    node: str = Field(description="the node")
    gpu_uuid: str = Field(description="the GPU's (or MIG instance's) UUID")
    gpu_model: str | None = Field(description="GPU model, normalised name from the GPU catalogue")
    job_id: str | None = Field(description="the job holding (part of) the GPU now; null: free")
    team: str | None = Field(description="the holding job's team; null: free")
    fraction: float = Field(description="the part of the GPU this row stands for")
    dra_claim: str | None = Field(None, description="the Kubernetes DRA ResourceClaim (namespace/name) it is held "
                                                    "through; null: no DRA claim")


class GpuPoint(BaseModel):
    bucket: datetime = Field(description="start of the time bucket (UTC)")
    node: str = Field(description="the node")
    gpu_uuid: str = Field(description="the GPU's (or MIG instance's) UUID")
    util_pct: float | None = Field(description="mean utilisation over the bucket, %")
    mem_used_mib: float | None = Field(description="peak memory used, MiB")
    power_w: float | None = Field(description="mean power, W")
    temp_c: float | None = Field(None, description="the hottest reading in the bucket, °C (null where the exporter "
                                                   "sends none, or for buckets folded before gpuledger kept it)")
    sm_active: float | None = Field(None, description="SM active over the bucket: " + PROFILE_FIELD_HELP)
    tensor_active: float | None = Field(None, description="tensor pipes active over the bucket: "
                                                          + PROFILE_FIELD_HELP)


class Gpus(BaseModel):
    at: datetime | None = Field(description="the instant the holders are read at")
    holders: list[GpuHolder] = Field(description="every GPU now, one row per holder (a free GPU: no job)")
    bucket_minutes: int = Field(description="the bucket of `series`: the one asked for, or a coarser one when "
                                            "that would have made the answer too long")
    series: list[GpuPoint] = Field(description="per GPU and bucket over the window")


class TokenRequest(RequestBody):
    name: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9._:@-]+$",
                      description="what the token is for, e.g. the agent's node or the person's name")
    role: str = Field(min_length=1, max_length=260, description="admin, reader, team:<team> or agent:<node>")
    expires_in_days: float | None = Field(None, gt=0, le=3650, description="it stops working this many days from "
                                                                         "now; null: never (review and rotate)")


class TokenInfo(BaseModel):
    id: str = Field(description="the token's id: what `revoke` takes and what the audit log names")
    name: str = Field(description="what the token is for")
    role: str = Field(description="admin, reader, team:<team> or agent:<node>")
    created: datetime = Field(description="when it was made (UTC)")
    created_by: str = Field(description="who made it")
    revoked: datetime | None = Field(None, description="when it was revoked (UTC); null while live")
    revoked_by: str | None = Field(None, description="who revoked it; null while live")
    expires: datetime | None = Field(None, description="when it stops working (UTC); null: never")
    last_used: datetime | None = Field(None, description="when a request last used it (UTC, to within a minute); "
                                                         "null: never used")


class NewToken(TokenInfo):
    token: str = Field(description="the bearer token; shown this once, stored only as a hash")


class AuditRow(BaseModel):
    seq: int = Field(description="position in the log, from 1, without gaps")
    ts: datetime = Field(description="when the request was answered (UTC)")
    actor: str = Field(description="the token's name and id, 'bootstrap' (the server's --token) or 'anonymous'")
    role: str = Field(description="the caller's role")
    action: str = Field(description="method and route, e.g. 'POST /v1/recommendations/{rec_id}/decision'")
    target: str = Field(description="the path called")
    status: int = Field(description="the HTTP status answered: 2xx done, 4xx refused")
    remote: str | None = Field(description="the client's address")
    detail: Any = Field(None, description="what the request asked (decision, node and batch, token made or revoked)")


class AuditLog(BaseModel):
    intact: bool = Field(description="every row's hash chains to the one before: nothing edited or removed")
    first_broken: int | None = Field(description="the first row whose chain breaks, when not intact")
    reason: str | None = Field(None, description="why the log is not intact (an entry edited, removed or reordered, "
                                                 "a truncation past the head anchor, a missing key or head); "
                                                 "null when intact")
    keyed_from: int | None = Field(None, description="the first entry chained by HMAC-SHA256 with the site's audit "
                                                     "key; entries before it keep their plain SHA-256 chain")
    entries: list[AuditRow] = Field(description="newest first")


class WhoAmI(BaseModel):
    actor: str = Field(description="the token's name and id; 'anonymous' without a token")
    role: str = Field(description="admin, reader, team:<team>, agent:<node> or anonymous")
    team: str | None = Field(description="the one team a team token sees")
    open_reads: bool = Field(description="whether this server answers reads without a token")
    may_decide: bool = Field(description="whether this token may decide recommendations and manage tokens")


class WorkloadRow(BaseModel):
    team: str = Field(description="the team (the scheduler's account; 'unattributed' where none)")
    gpu_model: str = Field(description="GPU model the jobs asked for; 'any' where they named none")
    jobs_started: int = Field(description="jobs that started in the window (count)")
    wait_p50_minutes: float | None = Field(description="median queue wait of those jobs, submission to start, "
                                                       "minutes; null: none started")
    wait_p95_minutes: float | None = Field(description="95th percentile of that wait, minutes; null: none started")
    wait_max_minutes: float | None = Field(description="longest of that wait, minutes; null: none started")
    no_submit_time: int = Field(description="started jobs without a submission time (no wait is known for them)")
    jobs_finished: int = Field(description="jobs that finished in the window, any outcome (count)")
    run_gpu_hours: float = Field(description="GPUs times run time in the window, as the scheduler reports it")
    lost_gpu_hours: float = Field(description="of those, GPU-hours of jobs that failed, timed out, ran out of "
                                              "memory, lost their node or were preempted")
    waiting_gpu_hours: float = Field(description="GPUs times minutes spent waiting in the window, in GPU-hours")
    restarts: float = Field(description="requeues the scheduler counted for jobs running in the window")
    pending_jobs: int = Field(description="jobs waiting at `at` (count)")
    pending_gpus: float = Field(description="GPUs those jobs ask for")
    longest_pending_minutes: float | None = Field(description="longest wait so far of those, minutes; null: none")
    gang_jobs_waiting: int = Field(description="of the waiting, gang jobs: several GPUs, or several pods of one "
                                               "owner, that must start together (count)")
    gang_gpus_waiting: float = Field(description="GPUs those gang jobs wait for, all at once")


CLASS_HELP = (f"the kind of work: {', '.join(WORKLOAD_CLASSES)}, or {UNCLASSIFIED} where no label, name or "
              "telemetry rule places it (never guessed; docs/howto/jobs.md lists the rules)")


class ClassRow(WorkloadRow):
    gpu_model: str | None = Field(None, description="not split by GPU model here")
    workload_class: str = Field(description=CLASS_HELP + "; from the scheduler's record")


class ClassUsage(BaseModel):
    team: str = Field(description="the team billed")
    workload_class: str = Field(description=CLASS_HELP + "; a job without a record placed by its telemetry")
    jobs: int = Field(description="jobs billed in the window (count)")
    gpu_hours: float = Field(description="allocated GPU-hours billed")
    cost_usd: float = Field(description="their cost at the rate card, USD")
    used_gpu_hours: float | None = Field(description="GPU-hours weighted by utilisation; null: none measured")
    efficiency: float | None = Field(description="used GPU-hours over the measured GPU-hours (0..1); null: none "
                                                 "measured")
    idle_gpu_hours: float | None = Field(description="allocated GPU-hours under the idle threshold (waste)")
    idle_cost_usd: float | None = Field(description="their cost, USD")
    util_coverage: float | None = Field(description="share of the GPU-hours with a utilisation reading")
    placed_by_telemetry: int = Field(description="jobs whose class came from what their GPUs did (the rule is "
                                                 "on each job: /v1/jobs)")


class SchedulerQueue(BaseModel):
    scheduler: str = Field(description=f"the scheduler that published it: {', '.join(SCHEDULERS)}")
    queue: str = Field(description="its queue: a Kueue ClusterQueue, a KAI queue, a Slurm account")
    flavor: str | None = Field(description="Kueue's ResourceFlavor (a GPU model in gpuledger's plan), Slurm's GPU "
                                           "type (gres/gpu:<type>); null for KAI")
    team: str | None = Field(description="the team gpuledger's plan gives this queue; null: not in the plan")
    gpu_model: str | None = Field(description="the GPU model of that plan entry; null: a team's whole queue")
    quota_in_force_gpus: float | None = Field(description="the quota the scheduler runs (Kueue nominalQuota, KAI "
                                                          "deserved, Slurm GrpTRES GPU limit); null: not published "
                                                          "or unlimited")
    planned_gpus: float | None = Field(description="the guarantee in gpuledger's plan (Slurm: its limit; accepted "
                                                   "advice, else the numbers in force in the config); null: not in "
                                                   "the plan")
    difference_gpus: float | None = Field(description="planned minus in force; null where either is unknown")
    usage_gpus: float | None = Field(description="GPUs the queue's admitted workloads hold, as the scheduler says")
    pending_workloads: float | None = Field(description="workloads waiting for admission (Kueue)")
    status: str = Field(description=f"{', '.join(COMPARISON_STATUSES)}")
    read_at: datetime | None = Field(description="when the scheduler's figures were read")


class AdmissionWait(BaseModel):
    queue: str = Field(description="the Kueue ClusterQueue")
    admitted: float | None = Field(description="workloads admitted in the window (the histogram's count grew so)")
    wait_mean_s: float | None = Field(description="their mean wait from creation (or requeue) to admission, s; "
                                                  "null: none admitted")
    wait_p50_s: float | None = Field(description="median of that wait, s, interpolated in Kueue's buckets")
    wait_p95_s: float | None = Field(description="95th percentile of that wait, s")


class Disagreement(BaseModel):
    count: int = Field(description="jobs (count)")
    by_source: dict[str, int] = Field(description="per scheduler source")
    examples: list[str] = Field(description="up to 20 of their job ids")


class UnrecordedTelemetry(BaseModel):
    count: int | None = Field(description="telemetry job ids no scheduler record knows; null: no records at all")
    gpu_hours: float | None = Field(description="their allocated GPU-hours in the window")
    examples: list[str] = Field(description="up to 20 of them")


class SchedulerCoverage(BaseModel):
    window_start: datetime = Field(description="the window read")
    window_end: datetime = Field(description="its end")
    at: datetime = Field(description="the instant 'running now' is checked at")
    grace_minutes: float = Field(description="a job must have run this long before missing samples count")
    telemetry_jobs: int = Field(description="job ids the GPU telemetry billed in the window")
    scheduler_jobs: int = Field(description="GPU jobs the schedulers say ran in the window")
    running_without_samples: Disagreement = Field(description="the scheduler says they run, no GPU sample of "
                                                              "theirs arrived lately")
    ended_without_samples: Disagreement = Field(description="they ran and ended in the window, no GPU sample of "
                                                            "theirs at all")
    samples_without_record: UnrecordedTelemetry = Field(description="GPU telemetry of jobs no scheduler knows")


class SchedulerQueues(BaseModel):
    window: Window = Field(description="the window the admission waits are read over")
    at: datetime = Field(description="the instant the queues are read at (each scheduler's latest read before)")
    queues: list[SchedulerQueue] = Field(description="each queue the scheduler runs or the plan would write")
    admission_waits: list[AdmissionWait] = Field(description="Kueue's admission waits per ClusterQueue")


class OutcomeRow(BaseModel):
    team: str = Field(description="the team")
    gpu_model: str = Field(description="GPU model asked for; 'any' where none was named")
    outcome: str | None = Field(description=f"how the jobs ended: {', '.join(OUTCOMES)} (or the scheduler's own "
                                            "word, lower-cased, where gpuledger does not know it)")
    jobs: int = Field(description="jobs that ended so in the window (count)")
    gpu_hours: float | None = Field(description="GPU-hours they ran in the window; null: a job the scheduler gave "
                                                "no end time")
    lost: bool = Field(description=f"the work is lost (outcome {', '.join(LOST)})")


class WaitingJob(BaseModel):
    job_id: str = Field(description="the job (slurm:<id> for Slurm)")
    team: str = Field(description="the team")
    gpu_model: str = Field(description="GPU model asked for; 'any' where none was named")
    gpus: int = Field(description="GPUs asked for")
    submit_ts: datetime | None = Field(description="when it was submitted (UTC); null: not known")
    wait_minutes: float | None = Field(description="how long it has waited, minutes; null: no submission time")
    pending_reason: str | None = Field(description="why it waits, as the scheduler says (Slurm's Reason, "
                                                   "Kubernetes' Unschedulable)")
    source: str | None = Field(description="the scheduler the record comes from")
    workload_class: str = Field(description=CLASS_HELP)


class Workloads(BaseModel):
    window: Window = Field(description="the window read, [start, end)")
    at: datetime = Field(description="the instant 'now' stands for: open jobs are measured up to it")
    by_team: list[WorkloadRow] = Field(description="per team and GPU model")
    by_class: list[ClassRow] = Field(description="waits and outcomes per team and workload class")
    class_usage: list[ClassUsage] = Field(description="cost, GPU-hours, efficiency and waste per team and class")
    outcomes: list[OutcomeRow] = Field(description="finished jobs per team, model and outcome")
    waiting_now: list[WaitingJob] = Field(description="jobs waiting at `at`, longest first")


EfficiencyFlag = Literal[tuple(EFFICIENCY_FLAGS)]


class ProfileMeans(BaseModel):
    gpu_hours: float = Field(description="allocated GPU-hours in the window")
    mean_util_pct: float | None = Field(description="mean GPU_UTIL over the GPU-seconds with a reading, %")
    sm_active: float | None = Field(description="SM active: " + PROFILE_FIELD_HELP)
    sm_occupancy: float | None = Field(description="SM occupancy (warps resident of the maximum): "
                                                   + PROFILE_FIELD_HELP)
    tensor_active: float | None = Field(description="tensor pipes active: " + PROFILE_FIELD_HELP)
    dram_active: float | None = Field(description="DRAM (memory bandwidth) active: " + PROFILE_FIELD_HELP)
    profiling_coverage: float | None = Field(description="share (0..1) of the GPU-hours with an SM activity reading")
    util_on_profiled_pct: float | None = Field(description="GPU_UTIL over the same GPU-seconds that read SM "
                                                           "activity, %: the like-for-like comparison")
    nvlink_gb: float | None = Field(description="NVLink bytes moved, GB (both directions)")
    pcie_gb: float | None = Field(description="PCIe bytes moved, GB (both directions); null: not read")


class TeamEfficiency(ProfileMeans):
    team: str = Field(description="the team or bill line")


class JobEfficiency(ProfileMeans):
    job_id: str = Field(description="the job's id")
    team: str = Field(description="the team (or bill line 'unattributed')")
    gpu_model: str | None = Field(description="the GPU model it held most")
    gpus: int = Field(description="distinct GPUs (and MIG instances) it held in the window")
    cost_usd: float = Field(description="its cost in the window, USD")
    workload_class: str | None = Field(None, description="its workload class (collector/jobs/classes.py)")
    interconnect_gbps_per_gpu: float | None = Field(description="NVLink + PCIe GB/s per GPU held")
    flags: list[EfficiencyFlag] = Field(description="what its profiling readings say it is bound by")
    note: str | None = Field(description="why it has no flag for want of evidence; null when its readings suffice")


class FlaggedTeam(BaseModel):
    team: str = Field(description="the team (or bill line)")
    flag: EfficiencyFlag = Field(description="the flag")
    jobs: int = Field(description="its jobs with that flag in the window")
    gpu_hours: float = Field(description="their GPU-hours in the window")
    cost_usd: float = Field(description="their cost in the window, USD")


class Efficiency(BaseModel):
    window: Window = Field(description="the window read")
    flags: dict[str, str] = Field(description="what each flag means")
    thresholds: dict[str, float] = Field(description="the [efficiency] settings the flags were judged by")
    teams: list[TeamEfficiency] = Field(description="per team: the profiling means over its GPU-seconds")
    flagged: list[FlaggedTeam] = Field(description="per team and flag: the jobs flagged")
    jobs: list[JobEfficiency] = Field(description="per job, most costly first: its means and flags")


SloStatus = Literal[SLO_STATUSES]
LATENCY_HELP = "from the histogram's bucket increases over the window, interpolated in the bucket that holds the rank"


class InferenceService(BaseModel):
    kind: str = Field(description="the server: vllm, triton, tgi, sglang, sglang_router, training")
    service: str = Field(description="the model served, as the server names it ('' where the page names none)")
    team: str = Field(description="the team of its pods' namespace (or bill line 'unattributed')")
    pods: int = Field(description="pods seen serving it")
    jobs: list[str] = Field(description="the jobs that served it (`namespace/pod`, or the job its target names): "
                                        "the jobs its GPU cost is read from")
    first_ts: datetime = Field(description="its first read in the window")
    last_ts: datetime = Field(description="its last read in the window")
    seconds: float = Field(description="seconds between them: what the rates are over")
    requests: float | None = Field(description="requests finished, counter increases (resets counted as restarts)")
    failed_requests: float | None = Field(None, description="requests that failed or were aborted (counter increases)")
    prompt_tokens: float | None = Field(None, description="prompt (prefill) tokens processed (counter increases)")
    generation_tokens: float | None = Field(None, description="tokens generated (counter increases)")
    requests_per_s: float | None = Field(None, description="requests finished per second over the span read")
    prompt_tokens_per_s: float | None = Field(None, description="prompt tokens per second")
    generation_tokens_per_s: float | None = Field(None, description="generated tokens per second")
    train_samples_per_s: float | None = Field(None, description="training samples per second "
                                                                "(gpuledger_train_samples_total)")
    ttft_p50_s: float | None = Field(None, description="time to first token, p50, s: " + LATENCY_HELP)
    ttft_p95_s: float | None = Field(None, description="time to first token, p95, s")
    ttft_p99_s: float | None = Field(None, description="time to first token, p99, s")
    tpot_p50_s: float | None = Field(None, description="time per output token, p50, s")
    tpot_p95_s: float | None = Field(None, description="time per output token, p95, s")
    tpot_p99_s: float | None = Field(None, description="time per output token, p99, s")
    e2e_p50_s: float | None = Field(None, description="end-to-end request latency, p50, s")
    e2e_p95_s: float | None = Field(None, description="end-to-end request latency, p95, s")
    e2e_p99_s: float | None = Field(None, description="end-to-end request latency, p99, s")
    e2e_seconds_mean: float | None = Field(None, description="mean end-to-end latency from sum and count (Triton's "
                                                             "cumulative durations give only this)")
    queue_seconds_mean: float | None = Field(None, description="mean time in the server's queue, s (from sum and count)")
    requests_running: float | None = Field(None, description="mean requests running")
    requests_waiting: float | None = Field(None, description="mean requests waiting in the server's queue")
    kv_cache_usage: float | None = Field(None, description="mean KV-cache use (0..1)")
    kv_cache_usage_max: float | None = Field(None, description="highest KV-cache use read (0..1)")
    cost_usd: float | None = Field(description="GPU cost of its pods in the window at the rate card; null: no GPU "
                                               "samples for them (cost_note)")
    gpu_hours: float | None = Field(None, description="GPU-hours of its pods in the window")
    gpu_model: str | None = Field(None, description="the GPU model its pods held (each, comma-separated, where its "
                                                    "pods ran on different models)")
    cost_note: str | None = Field(None, description="why it has no cost; null when it has one")
    cost_per_million_tokens: float | None = Field(description="cost over prompt + generated tokens, USD per million")
    cost_per_million_prompt_tokens: float | None = Field(None, description="cost per million prompt tokens, USD")
    cost_per_million_generated_tokens: float | None = Field(None, description="cost per million generated tokens, USD")
    cost_per_thousand_requests: float | None = Field(None, description="cost per thousand requests finished, USD")
    slo: dict[str, float] | None = Field(None, description="its latency objective ([slo.\"name\"] by service, else "
                                                           "by team), seconds per bound")
    slo_status: SloStatus | None = Field(None, description="met, missed, or unknown (a bound without a measured "
                                                           "quantile); null: no objective set")
    slo_missed: list[str] = Field(default_factory=list, description="the bounds it missed")


class TeamInference(BaseModel):
    team: str = Field(description="the team (or bill line)")
    services: int = Field(description="its services read in the window")
    requests: float = Field(description="requests its services finished")
    tokens: float = Field(description="prompt + generated tokens of its services")
    cost_usd: float | None = Field(description="GPU cost of the services with a cost; null: none has one")
    cost_per_million_tokens: float | None = Field(description="over the services with a cost")
    services_without_cost: int = Field(description="services whose pods had no GPU samples: not in the cost")


class Inference(BaseModel):
    window: Window = Field(description="the window read")
    services: list[InferenceService] = Field(description="per service (server kind, model served, team)")
    teams: list[TeamInference] = Field(description="per team: its services' tokens, requests and cost")
    unknown_slos: list[str] = Field(description="[slo] names that match no service or team ever read")


class AllocationWindow(BaseModel):
    start: str = Field(description="RFC 3339, UTC")
    end: str = Field(description="RFC 3339, UTC")


class GpuAllocation(BaseModel):
    gpuRequestAverage: float = Field(description="GPUs allocated on average over the set's window")
    gpuUsageAverage: float | None = Field(description="GPUs busy (allocated, weighted by utilisation) on average; "
                                                      "null where nothing was measured")
    utilCoverage: float | None = Field(description=UTIL_COVERAGE)


# OpenCost's resource fields gpuledger does not price: present, so tools reading them find numbers, and always 0
_ZERO = {name: (float, Field(0.0, description="always 0: gpuledger prices GPUs only (OpenCost field)"))
         for name in ALLOCATION_ZERO_FIELDS}
OpenCostAllocation = create_model(
    "OpenCostAllocation",
    name=(str, Field(description="the aggregated value; __idle__ (no job held the GPUs), __unallocated__ (held, "
                                 "without a value of the aggregated property)")),
    properties=(dict[str, Any], Field(description="cluster, and the aggregated property (labels.team for team)")),
    window=(AllocationWindow, Field(description="the set's window")),
    start=(str, Field(description="RFC 3339, UTC")), end=(str, Field(description="RFC 3339, UTC")),
    minutes=(float, Field(description="the window's length in minutes")),
    gpuCount=(float, Field(description="GPUs on average over the window")),
    gpuHours=(float, Field(description="allocated GPU-hours (shared idle adds cost, not hours)")),
    gpuCost=(float, Field(description="USD at the rate card in force at each hour")),
    gpuCostAdjustment=(float, Field(description="always 0 (corrections are ledger adjustments)")),
    sharedCost=(float, Field(description="always 0 (shared-cost teams are split in ledger statements)")),
    totalCost=(float, Field(description="USD: gpuCost")),
    totalEfficiency=(float | None, Field(description="GPU efficiency: busy over allocated GPU-hours that were "
                                                     "measured; null where none was (never 0)")),
    gpuAllocation=(GpuAllocation, Field(description="gpuledger's GPU figures")),
    rawAllocationOnly=(Any, Field(None, description="always null (OpenCost field)")),
    **_ZERO)


class AllocationAnswer(BaseModel):
    code: int = Field(description="200, as OpenCost answers")
    data: list[dict[str, OpenCostAllocation]] = Field(description="one set per step (one when accumulated), "
                                                                  "name -> allocation")


class BudgetRequest(RequestBody):
    usd: float = Field(strict=True, gt=0, le=1e12, allow_inf_nan=False,
                       description="the team's budget per ledger period, USD, to the cent (as [budgets] takes it)")


class BudgetStatus(BaseModel):
    team: str = Field(description="the team")
    period: str = Field(description="the ledger period in progress")
    period_end: datetime = Field(description="when it ends")
    budget_usd: float = Field(description="the budget for the period, USD")
    source: str = Field(description="config, or who set it through the API")
    spend_usd: float = Field(description="cost so far in the period, USD")
    forecast_usd: float | None = Field(description="cost forecast at the period's end, USD; null without a day of "
                                                   "history")
    forecast_basis: str = Field(description="what the forecast rests on, or why there is none")
    spend_share: float = Field(description="spend over budget")
    forecast_share: float | None = Field(description="forecast over budget")


class Alert(BaseModel):
    id: str = Field(description="the alert's id")
    key: str = Field(description="its condition: one alert per key while the condition holds")
    kind: AlertKind = Field(description="budget spend, budget forecast or idle job")
    team: str = Field(description="the team it concerns")
    subject: str = Field(description="one line saying what happened")
    detail: dict[str, Any] = Field(description="the evidence: figures, threshold, job")
    fired_at: datetime = Field(description="when its condition started (as checked)")
    resolved_at: datetime | None = Field(description="when its condition ended; null: still holds")
    deliveries: dict[str, Any] = Field(description="per phase and channel (e.g. 'fired webhook'): sent or failed, "
                                                   "tries")


class EnergyLine(BaseModel):
    team: str = Field(description="a team, 'unattributed' or '__idle__' (idle capacity)")
    job_id: str | None = Field(None, description="the job (per-job rows)")
    gpu_hours: float = Field(description="GPU-hours of the samples in the window")
    gpu_kwh: float | None = Field(description="energy the GPUs drew, kWh, over the GPU-hours with a power reading; "
                                              "null: none had one")
    power_coverage: float = Field(description="share (0..1) of the GPU-hours with a power reading")
    facility_kwh: float | None = Field(description="gpu_kwh x the on-premises cost model's PUE; null without one")


class Energy(BaseModel):
    window: Window = Field(description="the window read")
    complete_from: datetime | None = Field(description="the oldest raw sample kept: figures before it are missing")
    pue: float | None = Field(description="the PUE facility_kwh uses (the first on-premises cost model's)")
    teams: list[EnergyLine] = Field(description="per bill line")
    jobs: list[EnergyLine] = Field(description="per job, most energy first")


WhatIfModel = Literal[WHATIF_MODELS]
Policy = Literal[POLICIES]


class QuotaEdit(RequestBody):
    guarantee: float | None = Field(None, ge=0, le=1_000_000, description="GPUs promised")
    limit: float | None = Field(None, ge=0, le=1_000_000, description="most GPUs the team may hold")


class WhatIfRequest(RequestBody):
    model: WhatIfModel | None = Field(None, description="the scheduler model (default: [whatif] model)")
    start: datetime | None = Field(None, description="the window's start (default: end - [quota] window_days)")
    end: datetime | None = Field(None, description="the window's end (default: now)")
    use_recommendations: bool = Field(True, description="start the proposal from the open recommendations (else "
                                                        "from the quotas in force)")
    edits: dict[str, dict[str, QuotaEdit]] = Field(default_factory=dict, max_length=1000,
                                                   description="{team: {GPU model: {guarantee, limit}}} over it")
    capacity: dict[str, int] = Field(default_factory=dict, max_length=64,
                                     description="the proposal's GPUs per model (add a model, or 0 to retire one)")


class WhatIfConfiguration(BaseModel):
    teams: dict[str, dict[str, float | int | None]] = Field(
        description="per team and `all`: jobs, started, still_waiting (at the replay's horizon), wait p50/p95/mean "
                    "(minutes, from submission to first start), completion p50/p95 (hours), gpu_hours served in the "
                    "window, preemptions, lost_gpu_hours (work thrown away by preemptions)")
    utilisation: float | None = Field(description="GPU-hours served in the window over GPU-hours present")


class WhatIfAnswer(BaseModel):
    model: WhatIfModel = Field(description="the scheduler model the jobs were replayed through")
    start: datetime = Field(description="the window's start (UTC)")
    end: datetime = Field(description="the window's end (UTC)")
    capacity: dict[str, dict[str, int]] = Field(description="GPUs per model: current and proposed")
    jobs: int = Field(description="jobs replayed")
    assumptions: list[dict[str, Any]] = Field(description="what was assumed or left out, with how many jobs")
    quotas: list[dict[str, Any]] = Field(description="per team and GPU model: guarantee and limit, current and "
                                                     "proposed, and whether it changed")
    configurations: dict[str, WhatIfConfiguration] = Field(description="current and proposed")
    difference: dict[str, dict[str, float | None]] = Field(description="proposed - current, per team and figure")
    notes: list[str] = Field(description="what is worth knowing about the configurations (an over-commitment in "
                                         "force, GPUs a Kueue cohort has no quota for, Slurm's lack of guarantees)")
    seconds: float = Field(description="how long the replays took")
    calibrated: bool = Field(description="whether the replay of the quotas in force gives back the measured p95 wait "
                                         "of every team with [whatif] backtest_min_jobs jobs, within tolerance: "
                                         "false, and the difference is not an effect to act on")
    backtest: dict[str, Any] | None = Field(description="the replay of the quotas in force against the record: per "
                                                        "team and per (team, GPU model), jobs, started, wait "
                                                        "p50/p95/mean and GPU-hours, measured and replayed, the p95 "
                                                        "error, the tolerance and the worst team")


class PlacementWhatIfRequest(RequestBody):
    start: datetime | None = Field(None, description="the window's start (default: end - [quota] window_days)")
    end: datetime | None = Field(None, description="the window's end (default: now)")
    placers: list[Policy] = Field(default_factory=lambda: list(POLICIES), min_length=1, max_length=len(POLICIES),
                                  description="the placers to replay the jobs through")


class PlacerFigures(BaseModel):
    policy: Policy = Field(description="the placer")
    kept_within_islands: bool = Field(description="true: replayed keeping each multi-GPU task inside one NVLink "
                                                  "island where a node's island holds it; false: as the placer places")
    multi_gpu_tasks: int = Field(description="tasks of several whole GPUs placed")
    split_tasks: int | None = Field(description="of them, placed across NVLink islands of their node; null: no "
                                                "placed task's node has a known topology")
    unknown_topology_tasks: int = Field(description="of them, placed on a node whose topology is unknown")
    jobs: int = Field(description="jobs replayed")
    started: int = Field(description="jobs placed before the window's end")
    still_waiting: int = Field(description="jobs no placement started before the window's end")
    allocated_share: float = Field(description="GPU allocated over GPU present, time-weighted")
    fragmented_share: float = Field(description="FGD's fragmented GPU for the target workload over GPU present")
    stranded_gpu_hours: float = Field(description="fragmented GPU-hours: GPUs free but unusable by the typical task")
    stranded_usd: float | None = Field(description="their dollars at each model's rate; null: no model has a rate")
    unpriced_stranded_gpu_hours: float = Field(description="stranded GPU-hours of models without a rate")
    wait_p50_minutes: float | None = Field(description="median wait from submission to placement (minutes)")
    wait_p95_minutes: float | None = Field(description="95th-percentile wait (minutes)")
    gang_jobs: int = Field(description="jobs of more than one GPU (placed all at once)")
    gang_jobs_started_earlier: int = Field(description="of them, those that would have started earlier than the "
                                                       "record says they did")
    gang_minutes_earlier_mean: float | None = Field(description="how much earlier they would have started, on "
                                                                "average (minutes); null when none would")
    seconds: float = Field(description="how long this placer's replay took")


class PlacementWhatIfAnswer(BaseModel):
    start: datetime = Field(description="the window's start (UTC)")
    end: datetime = Field(description="the window's end (UTC)")
    nodes: int = Field(description="nodes of the inventory (the GPUs present at the window's end)")
    gpus: int = Field(description="their GPUs")
    jobs: int = Field(description="jobs replayed")
    assumptions: list[dict[str, Any]] = Field(description="what was assumed or left out, with how many jobs")
    placers: list[PlacerFigures] = Field(description="per placer, in the order asked")
    notes: list[str] = Field(description="how the replay reads the inventory and gang jobs")


# --- capacity forecast (analytics/forecast.py) ------------------------------------------------------------------
ForecastStatus = Literal[FORECAST_STATUSES]
ForecastBasis = Literal[FORECAST_BASES]


class ForecastWeek(BaseModel):
    week_start: datetime = Field(description="the week's first instant (UTC)")
    week_end: datetime = Field(description="the week's end (UTC, exclusive)")
    covered_hours: float = Field(description="clock hours of the week with a sample of the model (of 168)")
    fitted: bool = Field(description="a whole week (samples in at least min_coverage of its hours), so in the "
                                     "trend; a partial week is shown, never fitted (it would read as growth)")
    allocated_gpu_hours: float | None = Field(description="GPU-hours jobs held the model's GPUs, busy or not; null: "
                                                          "no sample of the model that week (unknown, not 0)")
    busy_gpu_hours: float | None = Field(description="allocated GPU-hours with a utilisation reading at or over the "
                                                     "idle threshold; null: unknown (held without any reading, or "
                                                     "no sample that week)")
    util_coverage: float | None = Field(description=UTIL_COVERAGE)
    queued_gpu_hours: float | None = Field(description="GPU-hours jobs waited in the queue for the model (GPUs x "
                                                       "wait; jobs the scheduler held are left out); null: no job "
                                                       "record in the window, so the queue is unknown")
    demand_gpu_hours: float | None = Field(description="the week's demand on the model's basis: busy (or allocated) "
                                                       "plus queued GPU-hours; null: no sample of the model that week")


class ModelForecast(BaseModel):
    gpu_model: str = Field(description="the GPU model")
    gpus: float = Field(description="its GPUs present at the window's end (MIG instances as their fractions)")
    capacity_gpu_hours_per_week: float = Field(description="gpus x 168: what the model can serve in a week")
    status: ForecastStatus = Field(description="forecast: saturates at the current growth in weeks_to_saturation; "
                                               "saturated: the trend's demand is at or over capacity now; "
                                               "not_saturating: flat or falling; insufficient_data: fewer whole "
                                               "weeks than min_weeks, no trend is given")
    reason: str = Field(description="the status in a sentence, with the figures it rests on")
    basis: ForecastBasis = Field(description="what a week's demand counts: busy + queued GPU-hours; allocated "
                                             "where busy is unknown (no or too few utilisation readings); 'only' "
                                             "where the queue is unknown (no job records)")
    basis_reason: str | None = Field(description="why the basis is not busy + queued; null: it is")
    whole_weeks: int = Field(description="whole weeks the trend is fitted through")
    demand_now_gpu_hours_per_week: float | None = Field(description="the trend's demand in the window's last week "
                                                                    "(GPU-hours a week); null: no trend")
    utilisation_now: float | None = Field(description="that demand over capacity (0..; over 1: more asked than the "
                                                       "GPUs give); null: no trend")
    growth_gpu_hours_per_week: float | None = Field(description="the trend's slope: GPU-hours a week more each week "
                                                                "(least squares over the whole weeks); null: no trend")
    growth_stderr: float | None = Field(description="the slope's standard error; null: no trend")
    growth_80_low: float | None = Field(description="the slope's 80% interval, low end (Student's t, n - 2 degrees "
                                                    "of freedom); null: no trend")
    growth_80_high: float | None = Field(description="the slope's 80% interval, high end; null: no trend")
    weeks_to_saturation: float | None = Field(description="weeks after the window's end until the trend's demand "
                                                          "reaches capacity; 0: saturated; null: not saturating at "
                                                          "the current trend, or no trend (see status)")
    weeks_to_saturation_80_low: float | None = Field(description="the soonest, at the high end of the growth's 80% "
                                                                 "interval; null: no trend, or even then it does "
                                                                 "not grow")
    weeks_to_saturation_80_high: float | None = Field(description="the latest, at the low end of the growth's 80% "
                                                                  "interval; null: there demand does not grow (no "
                                                                  "upper bound), or no trend")
    saturates_around: datetime | None = Field(description="the window's end + weeks_to_saturation; null: not "
                                                          "saturating, no trend, or more than a century away")
    weeks: list[ForecastWeek] = Field(description="the window's weeks, oldest first")


class CapacityForecast(BaseModel):
    start: datetime = Field(description="the window's start (UTC): `weeks` weeks before its end")
    end: datetime = Field(description="the window's end (UTC): the last whole hour at or before the end asked")
    weeks: int = Field(description="weeks in the window")
    min_weeks: int = Field(description="whole weeks a trend needs; fewer is insufficient_data")
    min_coverage: float = Field(description="the share of a week's hours with samples that makes it whole, and of "
                                            "its allocated GPU-hours with a utilisation reading that makes busy "
                                            "GPU-hours its basis")
    idle_util_pct: float = Field(description="the utilisation under which an allocated GPU counts as idle, not busy")
    queue_known: bool = Field(description="any scheduler job record in the window; false: queued demand is unknown "
                                          "and no trend counts it")
    models: list[ModelForecast] = Field(description="per GPU model present at the window's end, by name")
    notes: list[str] = Field(description="demand no model present can take (models gone, queued jobs naming no "
                                         "model), and an unknown queue")


# --- topology (collector/topology.py, analytics/topology.py) ----------------------------------------------------
_BUS_ID = r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$"
_NAME = r"^[A-Za-z0-9._:/-]+$"  # node, GPU, clique and rack names as telemetry writes them: no spaces or markup


class GpuPlaceIn(BaseModel):
    uuid: str = Field(min_length=1, max_length=128, pattern=_NAME, description="the GPU's UUID")
    index: int | None = Field(None, ge=0, le=4096, description="its index on the node (NVML, nvidia-smi)")
    gpu_model: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9 ._()/-]+$",
                           description="GPU model, normalised name from the GPU catalogue")
    island: int = Field(ge=0, le=4096, description="its NVLink island on the node, numbered from 0")
    pci_bus_id: str | None = Field(None, max_length=16, pattern=_BUS_ID,
                                   description="PCI bus id, e.g. 00000000:53:00.0")
    numa_node: int | None = Field(None, ge=-1, le=4096, description="the NUMA node the GPU is attached to")
    cpu_affinity: str | None = Field(None, max_length=4096, pattern=r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$",
                                     description="the CPUs close to the GPU, as a Linux cpulist (0-47,96-143)")
    nvlink_links: int | None = Field(None, ge=0, le=64, description="active NVLink links; null: no NVLink known")
    clique_id: str | None = Field(None, max_length=64, pattern=_NAME,
                                  description="multi-node NVLink clique (GB200 NVL72), with cluster_uuid")
    cluster_uuid: str | None = Field(None, max_length=64, pattern=_NAME, description="the NVLink fabric's cluster")
    rack: str | None = Field(None, max_length=63, pattern=_NAME, description="the node's rack, as a label names it")


class GpuLinkIn(BaseModel):
    gpu: str = Field(min_length=1, max_length=128, pattern=_NAME, description="one GPU's UUID")
    peer: str = Field(min_length=1, max_length=128, pattern=_NAME, description="the other GPU's UUID")
    path: Literal[TOPOLOGY_PATHS] = Field(description="their closest common path: nvlink, or NVML's PCIe/CPU level")
    nvlinks: int = Field(0, ge=0, le=64, description="direct NVLink links between them (0 through NVSwitch)")


class TopologyIn(BaseModel):
    """A node's topology as an agent posts it (collector/topology.py NodeTopology.to_json)."""
    node: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9._:-]+$", description="the node")
    source: Literal[TOPOLOGY_SOURCES] = Field(description="who read it")
    basis: Literal[TOPOLOGY_BASES] = Field(description="measured (pair by pair) or inferred (from the model)")
    gpus: list[GpuPlaceIn] = Field(min_length=1, max_length=MAX_GPUS_PER_NODE, description="the node's GPUs")
    links: list[GpuLinkIn] = Field([], max_length=MAX_GPUS_PER_NODE * (MAX_GPUS_PER_NODE - 1) // 2,
                                   description="GPU pairs and their path")
    notes: list[str] = Field([], max_length=256, description="what the reading assumed or found contradictory")


class TopologyStored(BaseModel):
    node: str = Field(description="the node")
    stored: bool = Field(description="true: a new snapshot; false: the same as the newest stored")
    digest: str = Field(description="what identifies this topology")


class IslandOut(BaseModel):
    island: int = Field(description="the island's number on its node")
    gpus: int = Field(description="GPUs in it")
    gpu_indexes: list[int | None] = Field(description="their indexes")
    gpu_uuids: list[str] = Field(description="their UUIDs")
    gpu_model: str = Field(description="their model")
    direct_nvlinks: int | None = Field(description="direct NVLink links among them (0 through NVSwitch); null: "
                                                   "no pair recorded")
    numa_nodes: list[int] = Field(description="the NUMA nodes its GPUs are attached to")


class NodeTopologyOut(BaseModel):
    node: str = Field(description="the node")
    source: str = Field(description="who read the topology shown (nvml measured wins over a dcgm page's)")
    basis: str = Field(description="measured, inferred (from the model's board, see notes) or unknown")
    observed_at: datetime = Field(description="since when the node has looked like this (UTC)")
    notes: list[str] = Field(description="assumptions and contradictions of this reading")
    gpus: int = Field(description="GPUs")
    islands: list[IslandOut] = Field(description="NVLink islands, a GPU alone in its own")
    largest_island: int = Field(description="GPUs in the largest island: the largest job kept on NVLink here")
    clique_id: str | None = Field(description="the node's multi-node NVLink clique; null: none or mixed")
    rack: str | None = Field(description="the node's rack; null: no label")
    gpu_places: list[dict[str, Any]] = Field(description="per GPU: index, island, PCI bus, NUMA node, CPUs, links")
    paths: list[dict[str, Any]] = Field(description="per GPU pair: path (nvlink or NVML's level) and direct links")


class TopologyAnswer(BaseModel):
    at: datetime = Field(description="the instant the topology is read at (UTC)")
    nodes: list[NodeTopologyOut] = Field(description="nodes with a stored topology")
    cliques: list[dict[str, Any]] = Field(description="multi-node NVLink cliques and their nodes")
    racks: list[dict[str, Any]] = Field(description="racks and their nodes")
    missing: list[str] = Field(description="nodes reporting samples with no topology stored: unknown, not alone")


class TopologySnapshot(BaseModel):
    ts: datetime = Field(description="when this topology was first seen")
    source: str = Field(description="who read it")
    basis: str = Field(description="measured or inferred")
    digest: str = Field(description="what identifies it")
    notes: str | None = Field(description="its notes (JSON list)")
    gpus: int = Field(description="GPUs")
    islands: int = Field(description="NVLink islands")


class TopologyHistory(BaseModel):
    node: str = Field(description="the node")
    snapshots: list[TopologySnapshot] = Field(description="oldest first: each change, and the one in force at start")
