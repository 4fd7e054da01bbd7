"""The quota plan: each team's share, department, and guarantee and limit per GPU model, as gpuledger would
have the scheduler run them. Emitters turn it into scheduler objects.

A team's numbers are the ones in force (the last applied decision, else the site config), replaced by its
open recommendation where there is one: `accepted` only, or `proposed` too (the default, to review what the
advice would change before deciding).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import capacity_by_model
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import InputError
from gpuledger.policies.quota import QuotaAdvice, current_quotas
from gpuledger.policies.recommendation import ACCEPTED, PROPOSED, stored

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


def build_plan(store: Store, config: Config, statuses: tuple[str, ...] = (PROPOSED, ACCEPTED),
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
    return QuotaPlan(list(plans.values()), dict(zip(capacity["gpu_model"], capacity["gpus"].astype(float))), at)


def _set(plan: TeamPlan, model: str, guarantee: float | None, limit: float | None, source: str) -> None:
    if guarantee is not None:
        plan.guarantee[model] = float(guarantee)
    if limit is not None:
        plan.limit[model] = float(limit)
    plan.source[model] = source
