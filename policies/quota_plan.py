"""The quota plan: each team's share, department, and guarantee and limit per GPU model, as gpuledger would
have the scheduler run them. Emitters turn it into scheduler objects.

A team's numbers are the ones in force (the last applied decision, else the site config), replaced by its
open recommendation where there is one: `accepted` only (the default), or `proposed` too (to review what the
advice would change before deciding).

A plan never takes away what a team uses: every GPU model a team held in the policy window gets an entry, even
without any quota (guarantee 0, limit the model's capacity: it may borrow as it did), and no limit is below the
team's peak use in the window (hourly mean GPUs held, rounded up). Without that, Kueue and KAI read a missing
model as zero (the team is locked out of it) while Slurm reads it as unlimited: the targets would disagree.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import capacity_by_model, hourly_demand
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import InputError
from gpuledger.policies.quota import QuotaAdvice, current_quotas
from gpuledger.policies.recommendation import ACCEPTED, stored

ROOT_GROUP = "gpuledger"  # the cohort / parent every team without a department hangs under


@dataclass
class TeamPlan:
    team: str
    share: float
    parent: str | None
    guarantee: dict[str, float] = field(default_factory=dict)  # GPU model -> GPUs promised
    limit: dict[str, float] = field(default_factory=dict)  # GPU model -> most GPUs it may hold
    source: dict[str, str] = field(default_factory=dict)  # GPU model -> "config", "decision ID", "recommendation ID"
    always_busy: dict[str, float] = field(default_factory=dict)  # GPU model -> GPUs busy in 95% of the hours

    def total_guarantee(self) -> float:
        return sum(self.guarantee.values())

    def models(self) -> list[str]:
        """The GPU models the team has a guarantee or a limit for."""
        return sorted(set(self.guarantee) | set(self.limit))


@dataclass
class QuotaPlan:
    teams: list[TeamPlan]
    capacity: dict[str, float]  # GPU model -> GPUs present
    made: datetime

    def limit_of(self, team: TeamPlan, model: str) -> float:
        """The team's limit for a model: as planned, else the model's capacity (borrow any idle GPU)."""
        return team.limit.get(model, self.capacity.get(model, 0.0))

    def total_limit(self, teams: list[TeamPlan]) -> float:
        """The teams' limits summed over their models, capped at the cluster's GPUs."""
        return min(sum(self.capacity.values()), sum(self.limit_of(t, m) for t in teams for m in t.models()))

    def departments(self) -> dict[str, list[TeamPlan]]:
        out: dict[str, list[TeamPlan]] = {}
        for team in self.teams:
            if team.parent:
                out.setdefault(team.parent, []).append(team)
        return out


def k8s_name(text: str) -> str:
    """A DNS-1123 label for a team, department or GPU model (lower case, '-' for anything else)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not name:
        raise InputError(f"{text!r} has no characters a Kubernetes name can use")
    return name[:63].rstrip("-")


def build_plan(store: Store, config: Config, statuses: tuple[str, ...] = (ACCEPTED,),
               evidence: list[QuotaAdvice] | None = None, at: datetime | None = None) -> QuotaPlan:
    """The plan as of `at` (default now); `evidence`, the quota advice of an evaluation, gives each team's
    always-busy GPUs per model (for schedulers that reserve them)."""
    at = at or utc_now()
    teams = store.team_table()
    teams = teams[teams["share"] > 0]
    capacity = capacity_by_model(store, at)
    plans = {row.team: TeamPlan(row.team, float(row.share), row.parent if isinstance(row.parent, str) else None)
             for row in teams.itertuples(index=False)}
    for (team, model), (guarantee, limit, source) in current_quotas(store).items():
        if team in plans:
            _set(plans[team], model, guarantee, limit, source)
    for rec in reversed(stored(store, statuses=statuses)):  # oldest first, so the newest wins
        if rec.kind == "quota" and rec.team in plans and rec.gpu_model:
            _set(plans[rec.team], rec.gpu_model, rec.action.get("guarantee_gpus"), rec.action.get("limit_gpus"),
                 f"recommendation {rec.id} ({rec.status})")
    for advice in evidence or []:
        if advice.team in plans and "always_busy_gpus" in advice.evidence:
            plans[advice.team].always_busy[advice.gpu_model] = math.floor(advice.evidence["always_busy_gpus"])
    capacities = dict(zip(capacity["gpu_model"], capacity["gpus"].astype(float)))
    _keep_what_is_used(plans, peak_use(store, config, at), capacities)
    return QuotaPlan(list(plans.values()), capacities, at)


def peak_use(store: Store, config: Config, at: datetime) -> dict[tuple[str, str], float]:
    """(team, GPU model) -> the most GPUs the team held in any hour of the policy window before `at` (hourly mean,
    rounded up: a job of 8 GPUs for the whole hour is 8)."""
    # only the GPUs held matter here, not idleness: the store's own threshold, so a changed [waste] setting not yet
    # rebuilt into the rollups cannot stop an export
    demand = hourly_demand(store, at - timedelta(days=config.quota.window_days), at, store.idle_util_pct)
    demand = demand[demand["gpu_model"].notna()]
    if demand.empty:
        return {}
    peaks = demand.groupby(["team", "gpu_model"])["allocated_gpus"].max()
    return {key: float(math.ceil(round(value, 6))) for key, value in peaks.items() if value > 0}


def _keep_what_is_used(plans: dict[str, TeamPlan], used: dict[tuple[str, str], float],
                       capacity: dict[str, float]) -> None:
    for (team, model), peak in sorted(used.items()):
        plan = plans.get(team)
        if plan is None:
            continue  # the unattributed bucket and teams with no share have no scheduler objects
        if model not in plan.models():
            plan.guarantee[model] = 0.0
            plan.limit[model] = max(capacity.get(model, 0.0), peak)
            plan.source[model] = f"used in the policy window (peak {peak:g} GPUs) with no quota: may borrow"
        elif plan.limit.get(model, capacity.get(model, 0.0)) < peak:
            plan.limit[model] = peak
            plan.source[model] = plan.source.get(model, "config") + f"; limit raised to its peak use {peak:g}"


def _set(plan: TeamPlan, model: str, guarantee: float | None, limit: float | None, source: str) -> None:
    if guarantee is not None:
        plan.guarantee[model] = float(guarantee)
    if limit is not None:
        plan.limit[model] = float(limit)
    plan.source[model] = source
