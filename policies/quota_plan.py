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

import pandas as pd

from gpuledger.analytics.config import Config, is_namespace
from gpuledger.analytics.plan_inputs import gres_types, job_shapes, mig_profiles, team_namespaces
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.dra_claims import dra_drivers
from gpuledger.analytics.usage import capacity_by_model, hourly_demand
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import InputError
from gpuledger.collector.gpu_catalog import UNKNOWN_MODEL
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
    share_source: str = "config"  # where `share` comes from: the config, or the scheduler's report (whatif/reported.py)

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
    # where the numbers come from, for the plan's header (emitters/__init__.py `plan_header`): the advice statuses
    # asked for, the recommendations applied ("<id> (<status>): <team> <model>"), each model's guarantees in force
    # summed before any advice, and every change gpuledger made so the plan can be applied
    statuses: tuple[str, ...] = (ACCEPTED,)
    advice: list[str] = field(default_factory=list)
    in_force: dict[str, float] = field(default_factory=dict)
    adjustments: list[str] = field(default_factory=list)
    # what the scheduler objects need besides the numbers (`applicable_plan` fills them): team -> the Kubernetes
    # namespaces it submits from and why those; GPU model -> MIG profile -> instances present; GPU model -> the
    # Slurm GPU type and why that one
    namespaces: dict[str, tuple[str, ...]] = field(default_factory=dict)
    namespace_basis: dict[str, str] = field(default_factory=dict)
    mig: dict[str, dict[str, int]] = field(default_factory=dict)
    gres: dict[str, tuple[str, str]] = field(default_factory=dict)
    # the Kubernetes DRA drivers whose devices the window's jobs claimed (a site that allocates GPUs through
    # ResourceClaims): the Kueue plan maps their device classes to the GPU quota
    dra_drivers: tuple[str, ...] = ()

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
    in_force: dict[str, float] = {}
    for plan in plans.values():
        for model, gpus in plan.guarantee.items():
            in_force[model] = in_force.get(model, 0.0) + gpus
    applied: dict[tuple[str, str], str] = {}  # (team, model) -> the recommendation that set it (the newest)
    for rec in reversed(stored(store, statuses=statuses)):  # oldest first, so the newest wins
        if rec.kind == "quota" and rec.team in plans and rec.gpu_model:
            _set(plans[rec.team], rec.gpu_model, rec.action.get("guarantee_gpus"), rec.action.get("limit_gpus"),
                 f"recommendation {rec.id} ({rec.status})")
            applied[(rec.team, rec.gpu_model)] = f"{rec.id} ({rec.status}): {rec.team} {rec.gpu_model}"
    for advice in evidence or []:
        if advice.team in plans and "always_busy_gpus" in advice.evidence:
            plans[advice.team].always_busy[advice.gpu_model] = math.floor(advice.evidence["always_busy_gpus"])
    capacities = dict(zip(capacity["gpu_model"], capacity["gpus"].astype(float)))
    adjustments = _keep_what_is_used(plans, peak_use(store, config, at), capacities)
    return QuotaPlan(list(plans.values()), capacities, at, statuses=tuple(statuses), advice=[applied[k] for k in sorted(applied)],
                     in_force=in_force, adjustments=adjustments)


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
                       capacity: dict[str, float]) -> list[str]:
    """Give every team an entry for each model it used and a limit no lower than its peak; returns what changed."""
    changed = []
    for (team, model), peak in sorted(used.items()):
        plan = plans.get(team)
        if plan is None:
            continue  # the unattributed bucket and teams with no share have no scheduler objects
        if model not in plan.models():
            plan.guarantee[model] = 0.0
            plan.limit[model] = max(capacity.get(model, 0.0), peak)
            plan.source[model] = f"used in the policy window (peak {peak:g} GPUs) with no quota: may borrow"
            changed.append(f"{team} {model}: no quota, but used (peak {peak:g} GPUs): guarantee 0, limit "
                           f"{plan.limit[model]:g}")
        elif plan.limit.get(model, capacity.get(model, 0.0)) < peak:
            was = plan.limit.get(model, capacity.get(model, 0.0))
            plan.limit[model] = peak
            plan.source[model] = plan.source.get(model, "config") + f"; limit raised to its peak use {peak:g}"
            changed.append(f"{team} {model}: limit raised from {was:g} to its peak use {peak:g}")
    return changed


def _set(plan: TeamPlan, model: str, guarantee: float | None, limit: float | None, source: str) -> None:
    if guarantee is not None:
        plan.guarantee[model] = float(guarantee)
    if limit is not None:
        plan.limit[model] = float(limit)
    plan.source[model] = source


# --- a plan a scheduler can apply as is --------------------------------------------------------------------------
def gres_type(model: str) -> str:
    """A model's Slurm GPU type where nothing recorded names it: the model in lower case."""
    return model.lower().replace(" ", "-")


class PlanNotApplicable(InputError):
    """A plan a scheduler could not run as is: GPUs under no guarantee that advice left there, or a job shape the
    policy window saw that no queue of the plan could start. The message names each model and the shortfall."""


def applicable_plan(store: Store, config: Config, statuses: tuple[str, ...] = (ACCEPTED,),
                    evidence: list[QuotaAdvice] | None = None, at: datetime | None = None,
                    fill: bool = False) -> QuotaPlan:
    """`build_plan`'s plan made fit to apply: with the namespaces each team submits from, the MIG profiles and the
    Slurm GPU types present, and checked (`fill_stranded`, `unstartable`). GPUs that the quotas in force leave under
    no guarantee are shared out by share and the header says so; GPUs that advice leaves there are refused unless
    `fill` (then shared out the same way); a job shape of the window that could not start is refused."""
    at = at or utc_now()
    plan = build_plan(store, config, statuses, evidence, at)
    start = at - timedelta(days=config.quota.window_days)
    plan.namespaces, plan.namespace_basis = _namespaces(plan, config, team_namespaces(store, start, at))
    plan.mig = {}
    for row in mig_profiles(store, at).itertuples(index=False):
        plan.mig.setdefault(row.gpu_model, {})[row.mig_profile] = int(row.instances)
    plan.gres = site_gres(store, config, plan, at)
    plan.dra_drivers = tuple(dra_drivers(store, start, at))
    shapes = job_shapes(store, start, at)
    keep_shapes(plan, shapes)
    problems = fill_stranded(plan, fill)
    problems += unstartable(plan, shapes)
    if problems:
        shown = problems[:12] + ([f"and {len(problems) - 12} more"] if len(problems) > 12 else [])
        raise PlanNotApplicable("the quota plan cannot be applied: " + "; ".join(shown))
    return plan


def _namespaces(plan: QuotaPlan, config: Config, seen: pd.DataFrame) -> tuple[dict[str, tuple[str, ...]],
                                                                             dict[str, str]]:
    """Per team: the namespaces it submits from, and why those. `[teams.<team>] namespaces` where given; else the
    namespaces its samples and jobs were seen in during the policy window, with those `[attribution]
    namespace_to_team` bills to it; else the namespace named like the team. Only Kubernetes namespace names count
    (a name from telemetry that is not one cannot hold a LocalQueue)."""
    by_team: dict[str, list[str]] = {}
    for row in seen.itertuples(index=False):
        if is_namespace(row.namespace):
            by_team.setdefault(row.team, []).append(row.namespace)
    for namespace, team in sorted(config.namespace_to_team.items()):
        if is_namespace(namespace) and namespace not in by_team.get(team, []):
            by_team.setdefault(team, []).append(namespace)
    out, basis = {}, {}
    for team in plan.teams:
        configured = config.teams[team.team].namespaces if team.team in config.teams else ()
        if configured:
            out[team.team], basis[team.team] = tuple(configured), f"[teams.{team.team}] namespaces"
        elif by_team.get(team.team):
            out[team.team] = tuple(sorted(by_team[team.team]))
            basis[team.team] = "seen in the policy window"
        else:
            out[team.team], basis[team.team] = (k8s_name(team.team),), "none seen: the team's name"
    return out, basis


def site_gres(store: Store, config: Config, plan: QuotaPlan, at: datetime) -> dict[str, tuple[str, str]]:
    """Per GPU model of the plan: the Slurm GPU type the site names it by, and why (`_gres`), from the sacct
    records of the policy window before `at`."""
    return _gres(plan, config, gres_types(store, at - timedelta(days=config.quota.window_days), at))


_MIG_GRES = re.compile(r"^(?P<card>[A-Za-z0-9]+?)[_-]\d+g\.\d+gb", re.IGNORECASE)  # `a100_3g.20gb`: card a100


def _gres(plan: QuotaPlan, config: Config, recorded: pd.DataFrame) -> dict[str, tuple[str, str]]:
    """Per GPU model of the plan: the Slurm GPU type its GPUs go by, and why. The type sacct's AllocTRES named for
    the model's jobs (the most jobs; a whole-GPU type before a MIG slice's card), else `[slurm_gres]`, else the
    model's name in lower case (what gres.conf must then call it)."""
    whole: dict[str, dict[str, int]] = {}  # model -> whole-GPU type -> jobs
    cards: dict[str, dict[str, int]] = {}  # model -> the card a MIG slice's type starts with -> jobs
    for row in recorded.itertuples(index=False):
        for written in str(row.gres_type).split(","):
            mig = _MIG_GRES.match(written)
            counts = (cards if mig else whole).setdefault(row.gpu_model, {})
            kind = mig.group("card") if mig else written
            counts[kind] = counts.get(kind, 0) + int(row.jobs)
    out = {}
    for model in sorted(set(plan.capacity) | {m for t in plan.teams for m in t.models()}):
        counts = whole.get(model) or cards.get(model)
        if counts:
            kind, jobs = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
            out[model] = (kind, f"sacct AllocTRES of {jobs} job(s)")
        elif model in config.slurm_gres:
            out[model] = (config.slurm_gres[model], "[slurm_gres]")
        else:
            out[model] = (gres_type(model), "the model's name: no sacct record or [slurm_gres] entry "
                                                          "names its type")
    return out


def _guaranteed(plan: QuotaPlan, model: str) -> float:
    return sum(t.guarantee.get(model, 0.0) for t in plan.teams)


def fill_stranded(plan: QuotaPlan, fill: bool = False) -> list[str]:
    """Cover each model's GPUs with guarantees: Kueue admits at most the nominal quotas of a cohort summed (and the
    other targets read a guarantee summing under the GPUs present as GPUs nobody was promised), so a GPU under
    no guarantee is stranded. GPUs the quotas in force leave uncovered are shared out to the teams with an entry
    for the model (all teams where none has) in proportion to their shares, whole GPUs by largest remainder, and
    each such change is recorded in `plan.adjustments`. GPUs that advice uncovered (the guarantees in force did
    cover them) are a problem returned, unless `fill`: then they are shared out the same way."""
    problems = []
    for model, capacity in sorted(plan.capacity.items()):
        if model == UNKNOWN_MODEL or capacity <= 0 or not plan.teams:
            continue
        stranded = round(capacity - _guaranteed(plan, model), 6)
        if stranded <= 0:
            continue
        from_advice = round(min(stranded, max(0.0, plan.in_force.get(model, 0.0) - _guaranteed(plan, model))), 6)
        advised = [a for a in plan.advice if a.endswith(f" {model}")]
        if from_advice > 0 and not fill:
            problems.append(f"{model}: {stranded:g} of its {capacity:g} GPUs would be under no guarantee, "
                            f"{from_advice:g} of them left so by advice ({'; '.join(advised) or 'recommendations'}), "
                            f"and Kueue admits at most the guarantees summed: fill them (emit --fill, or fill=true) to "
                            f"share them out by the teams' shares, or decide that advice again")
            continue
        receivers = [t for t in plan.teams if model in t.models()] or list(plan.teams)
        added = _by_share(stranded, receivers)
        for team in receivers:
            if added.get(team.team):
                team.guarantee[model] = team.guarantee.get(model, 0.0) + added[team.team]
                team.limit[model] = max(plan.limit_of(team, model), team.guarantee[model])
                team.source[model] = (team.source.get(model, "no quota") +
                                      f"; +{added[team.team]:g} of {stranded:g} GPUs no guarantee covered, by share")
        cause = "advice and the quotas in force" if from_advice > 0 else "the quotas in force"
        plan.adjustments.append(
            f"{model}: {stranded:g} of its {capacity:g} GPUs were under no guarantee ({cause}) and would be stranded: "
            f"shared out by share: " + ", ".join(f"{t} +{g:g}" for t, g in added.items()))
    return problems


def _by_share(amount: float, teams: list[TeamPlan]) -> dict[str, float]:
    """`amount` GPUs split over `teams` in proportion to their shares: whole GPUs by largest remainder (ties to the
    larger share, then the name), a fraction left over (MIG capacity) to the largest share."""
    ranked = sorted(teams, key=lambda t: (-t.share, t.team))
    weight = {t.team: t.share if t.share > 0 else 0.0 for t in ranked}
    if not sum(weight.values()):
        weight = {t.team: 1.0 for t in ranked}
    whole = int(math.floor(amount + 1e-9))
    exact = {t: whole * w / sum(weight.values()) for t, w in weight.items()}
    out = {t: float(math.floor(v + 1e-9)) for t, v in exact.items()}
    order = sorted(ranked, key=lambda t: (-(exact[t.team] - out[t.team]), -t.share, t.team))
    for team in order[:whole - int(sum(out.values()))]:
        out[team.team] += 1.0
    rest = round(amount - whole, 6)
    if rest > 0:
        out[ranked[0].team] += rest
    return {t: g for t, g in out.items() if g > 0}


def _model_of(plan: QuotaPlan, recorded: object) -> str | None:
    """The plan's model a job record names (the model, or a Slurm GPU type of one); None: not one of the plan's."""
    name = recorded if isinstance(recorded, str) and recorded else None
    if name in plan.capacity:
        return name
    by_gres = {kind.lower(): model for model, (kind, _) in plan.gres.items()}
    model = by_gres.get((name or "").lower(), name)
    return model if model in plan.capacity else None


def keep_shapes(plan: QuotaPlan, shapes: pd.DataFrame) -> None:
    """No plan takes away what a team ran: a team that ran a job of N GPUs of a model in the policy window gets an
    entry for the model (guarantee 0, limit its GPUs: it may borrow) where it has none, and a limit of at least N.
    Each change is recorded in `plan.adjustments` (the samples' peak use did this already where they saw the job)."""
    teams = {t.team: t for t in plan.teams}
    for row in shapes.itertuples(index=False):
        team, model = teams.get(row.team), _model_of(plan, row.gpu_model)
        if team is None or model is None or plan.capacity.get(model, 0) <= 0:
            continue
        gpus = min(float(row.gpus), plan.capacity[model])
        if model not in team.models():
            team.guarantee[model], team.limit[model] = 0.0, plan.capacity[model]
            team.source[model] = f"ran {int(row.jobs)} job(s) of {gpus:g} GPUs in the policy window with no quota"
            plan.adjustments.append(f"{team.team} {model}: no quota, but ran {int(row.jobs)} job(s) of {gpus:g} GPUs "
                                    f"(e.g. {row.example}): guarantee 0, limit {plan.capacity[model]:g}")
        elif plan.limit_of(team, model) < gpus:
            was = plan.limit_of(team, model)
            team.limit[model] = gpus
            team.source[model] = team.source.get(model, "config") + f"; limit raised to its {gpus:g}-GPU jobs"
            plan.adjustments.append(f"{team.team} {model}: limit raised from {was:g} to {gpus:g}, the size of jobs "
                                    f"it ran (e.g. {row.example})")


def unstartable(plan: QuotaPlan, shapes: pd.DataFrame) -> list[str]:
    """The job shapes of the policy window the plan could not start, each in words: a job of N GPUs of model M
    needs its team's limit of M at least N (a job with no team in the plan: some team's) and the guarantees of M
    summed (Kueue's cohort nominal quota) at least N. A job whose model was not recorded may use any model; one of
    a model no longer present is not checked (no plan can start it)."""
    present = {m for m, c in plan.capacity.items() if c > 0 and m != UNKNOWN_MODEL}
    teams = {t.team: t for t in plan.teams}
    problems = []
    for row in shapes.itertuples(index=False):
        gpus = float(row.gpus)
        model = _model_of(plan, row.gpu_model)
        if model is None and isinstance(row.gpu_model, str) and row.gpu_model:
            continue  # a model no longer present, or a type no sample maps: no plan can be checked against it
        candidates = [model] if model is not None else sorted(present)
        if model is not None and model not in present:
            continue
        owner = teams.get(row.team)
        holders = [owner] if owner else list(plan.teams)

        def room(m: str) -> tuple[float, float]:
            limit = max((plan.limit_of(t, m) for t in holders if m in t.models()), default=0.0)
            return limit, _guaranteed(plan, m)

        if any(min(room(m)) >= gpus for m in candidates):
            continue
        best = max(candidates, key=lambda m: min(room(m)), default=None)
        what = f"{gpus:g} GPU(s) of {best if model else 'any model'}"
        jobs = f"{int(row.jobs)} job(s) of {what} (e.g. {row.example})"
        if best is None:
            problems.append(f"team {row.team} ran {jobs} in the policy window, but no GPU is present")
            continue
        limit, cohort = room(best)
        who = f"team {row.team}'s limit" if owner else "no team's limit"
        if limit < gpus:
            problems.append(f"{best}: team {row.team} ran {jobs} in the policy window, but {who} of {best} is "
                            f"{limit:g}: {gpus - limit:g} short")
        if cohort < gpus:
            problems.append(f"{best}: team {row.team} ran {jobs} in the policy window, but the guarantees of "
                            f"{best} sum to {cohort:g} (Kueue's cohort quota): {gpus - cohort:g} short")
    return problems
