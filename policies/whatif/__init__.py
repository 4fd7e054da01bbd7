"""What-if: replay a window's recorded jobs through a model of the scheduler under the quotas in force and under a
proposed set (the open recommendations, a file, edits), and report what each team would feel: queue waits, job
completion times, GPU-hours served, preemptions, and the difference.

The workload is the scheduler's own job records (analytics/job_replay.py; workload.py says what is assumed for
jobs the record leaves open). The models (one file each: kueue_like.py, kai_like.py, slurm_like.py) follow the
objects gpuledger emits for each scheduler, and each file names the rules it follows and where the scheduler has
them. Both configurations replay the same jobs on the same clock, so the difference is the quotas' alone, and a
capacity change ("16 more H200s", "retire the A100s") is one more configuration of the same replay.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Callable

import numpy as np
import pandas as pd

from gpuledger.analytics.config import WHATIF_MODELS, Config, WhatIfConfig
from gpuledger.analytics.job_replay import prior_usage, replay_jobs
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import capacity_by_model, covered_hours
from gpuledger.collector.errors import InputError
from gpuledger.policies.model_names import ModelNames
from gpuledger.policies.quota import QuotaAdvice
from gpuledger.policies.quota_plan import QuotaPlan, build_plan
from gpuledger.policies.recommendation import APPLIED, OPEN, stored
from gpuledger.policies.whatif.backtest import ALL as ALL_TEAMS
from gpuledger.policies.whatif.backtest import Backtest, backtest
from gpuledger.policies.whatif.engine import Quotas, SchedulerModel, Simulation
from gpuledger.policies.whatif.kai_like import KaiLike
from gpuledger.policies.whatif.kueue_like import KueueLike
from gpuledger.policies.whatif.reported import READ_MAX_AGE, reported_notes, with_reported
from gpuledger.policies.whatif.slurm_like import SlurmLike
from gpuledger.policies.whatif.workload import SimJob, Workload, workload_of

_MODELS = {"kueue": KueueLike, "kai": KaiLike, "slurm": SlurmLike}
assert tuple(_MODELS) == WHATIF_MODELS  # the closed set is config's; every name has its model
CONFIGURATIONS = ("current", "proposed")
FIGURES = ("jobs", "started", "still_waiting", "wait_p50_minutes", "wait_p95_minutes", "wait_mean_minutes",
           "completion_p50_hours", "completion_p95_hours", "gpu_hours", "preemptions", "lost_gpu_hours")
PROPOSAL, IN_FORCE, BOTH = "the proposed quotas", "the quotas in force", "both configurations"


def scheduler_model(name: str, settings: WhatIfConfig) -> SchedulerModel:
    if name not in _MODELS:
        raise InputError(f"unknown scheduler model {name!r}: one of {', '.join(WHATIF_MODELS)}")
    return _MODELS[name](settings)


def quotas_of(plan: QuotaPlan) -> Quotas:
    """A plan's guarantees, limits, shares and cohorts as the replay reads them; a team the plan does not know
    (unattributed work, a team without a share) has no guarantee, may borrow up to the model's GPUs, share 1."""
    guarantee = {(t.team, m): float(v) for t in plan.teams for m, v in t.guarantee.items()}
    limit = {(t.team, m): float(plan.limit_of(t, m)) for t in plan.teams for m in t.models()}
    return Quotas(guarantee, limit, {t.team: float(t.share) for t in plan.teams},
                  {t.team: t.parent or "" for t in plan.teams})


def edited_plan(plan: QuotaPlan, edits: dict[str, dict[str, dict[str, float]]]) -> QuotaPlan:
    """`plan` with edits {team: {GPU model: {"guarantee": N, "limit": N}}} applied (either key may be left out)."""
    by_team = {t.team: t for t in plan.teams}
    teams = {t.team: type(t)(t.team, t.share, t.parent, dict(t.guarantee), dict(t.limit), dict(t.source),
                             share_source=t.share_source)
             for t in plan.teams}
    for team, models in edits.items():
        if team not in by_team:
            raise InputError(f"unknown team {team!r} in the proposal: teams are {', '.join(sorted(by_team))}")
        if not isinstance(models, dict):
            raise InputError(f"the proposal for {team!r} must map GPU models to guarantee and limit")
        for model, numbers in models.items():
            if not isinstance(numbers, dict) or not set(numbers) <= {"guarantee", "limit"} or not numbers:
                raise InputError(f"{team} {model}: give guarantee and/or limit, got {numbers!r}")
            for key, value in numbers.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                        or value < 0:
                    raise InputError(f"{team} {model} {key}: a number of GPUs at least 0, got {value!r}")
                getattr(teams[team], key)[model] = float(value)
                teams[team].source[model] = "proposal"
    return QuotaPlan(list(teams.values()), dict(plan.capacity), plan.made)


def promised(plan: QuotaPlan) -> dict[str, float]:
    """GPU model -> the guarantees of all teams added up."""
    out: dict[str, float] = {}
    for team in plan.teams:
        for gpu_model, guarantee in team.guarantee.items():
            out[gpu_model] = out.get(gpu_model, 0.0) + guarantee
    return out


def check_plan(plan: QuotaPlan, capacity: dict[str, int], model: str, label: str,
               tolerated: dict[str, float] | None = None) -> list[str]:
    """Errors for a plan a scheduler could not run on `capacity`: a guarantee above its limit, guarantees over
    the GPUs present (where the scheduler has guarantees) beyond what is `tolerated` (the over-commitment already
    in force, which a proposal inherits); notes for what is allowed but worth saying."""
    notes = []
    for team in plan.teams:
        for gpu_model, guarantee in team.guarantee.items():
            if tolerated is not None and gpu_model not in capacity and team.source.get(gpu_model) == "proposal":
                raise InputError(f"{label}: no {gpu_model} GPU is present (present: {', '.join(sorted(capacity))}); "
                                 "add them to the proposal's capacity to try a model the cluster does not have")
            limit = plan.limit_of(team, gpu_model)
            if guarantee > limit + 1e-9:
                raise InputError(f"{label}: {team.team}'s {gpu_model} guarantee {guarantee:g} is above its limit "
                                 f"{limit:g}")
    for gpu_model, total in sorted(promised(plan).items()):
        present = capacity.get(gpu_model, 0)
        if model != "slurm" and total > present + 1e-9:
            over = (f"{label} exceed capacity: {gpu_model} guarantees add up to {total:g} GPUs, {present:g} "
                    "are present")
            if tolerated is not None and total > tolerated.get(gpu_model, 0.0) + 1e-9:
                raise InputError(over)
            notes.append(over + " (they cannot all be honoured at once; the replay runs them as they are)")
        if model == "kueue" and total < present - 1e-9:
            notes.append(f"{label}: Kueue admits at most the cohort's nominal quota: {total:g} of the {present:g} "
                         f"{gpu_model} GPUs (the rest have no quota to run under)")
    return notes


def present_capacity(store: Store, at: datetime) -> dict[str, int]:
    """Whole GPUs per model present at `at` (the live node inventory; MIG slices count as their fractions)."""
    frame = capacity_by_model(store, at)
    return {str(m): int(math.floor(float(g) + 1e-9)) for m, g in zip(frame["gpu_model"], frame["gpus"])
            if float(g) >= 1.0}


@dataclass
class WhatIf:
    """One what-if's answer: the figures per configuration and team, the difference, and what was assumed."""
    model: str
    start: datetime
    end: datetime
    capacity: dict[str, dict[str, int]]
    workload: Workload
    figures: dict[str, dict[str, dict[str, Any]]]  # configuration -> team (and ALL_TEAMS) -> FIGURES
    utilisation: dict[str, float | None]
    quotas: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    backtest: Backtest | None = None  # the replay of the quotas in force against the record

    def difference(self) -> dict[str, dict[str, float | None]]:
        """proposed - current, per team and figure (null where either is unknown)."""
        out = {}
        for team, now in self.figures["current"].items():
            then = self.figures["proposed"].get(team, {})
            out[team] = {k: (then[k] - now[k] if then.get(k) is not None and now.get(k) is not None else None)
                         for k in FIGURES}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "start": self.start, "end": self.end, "capacity": self.capacity,
                "jobs": len(self.workload.jobs), "assumptions": self.workload.notes(), "quotas": self.quotas,
                "configurations": {c: {"teams": self.figures[c], "utilisation": self.utilisation[c]}
                                   for c in CONFIGURATIONS},
                "difference": self.difference(), "notes": self.notes, "seconds": round(self.seconds, 3),
                "calibrated": self.backtest.calibrated if self.backtest else False,
                "backtest": self.backtest.to_dict() if self.backtest else None}


def quantile_or_none(values: list[float], q: float) -> float | None:
    """The q-quantile of `values`; None (unknown, never 0) for none."""
    return float(np.quantile(values, q)) if values else None


def figures_of(jobs: list[SimJob], horizon_s: float) -> dict[str, dict[str, Any]]:
    """Per team and for all teams: the FIGURES of the replayed jobs. A wait is counted from submission to the first
    start; a job still waiting at the replay's horizon counts with what it had waited by then (a lower bound;
    `still_waiting` says how many). Jobs running when the window opened count for GPU-hours only."""
    groups: dict[str, list[SimJob]] = {}
    for job in jobs:
        groups.setdefault(job.team, []).append(job)
    groups[ALL_TEAMS] = list(jobs)
    out = {}
    for team, mine in sorted(groups.items()):
        arrived = [j for j in mine if not j.running_at_start]
        waits = [((j.first_start if j.first_start is not None else horizon_s) - j.submit) / 60.0 for j in arrived]
        done = [(j.end - j.submit) / 3600.0 for j in arrived if j.end is not None]
        out[team] = {"jobs": len(arrived), "started": sum(j.first_start is not None for j in arrived),
                     "still_waiting": sum(j.first_start is None for j in arrived),
                     "wait_p50_minutes": quantile_or_none(waits, 0.5),
                     "wait_p95_minutes": quantile_or_none(waits, 0.95),
                     "wait_mean_minutes": float(np.mean(waits)) if waits else None,
                     "completion_p50_hours": quantile_or_none(done, 0.5),
                     "completion_p95_hours": quantile_or_none(done, 0.95),
                     "gpu_hours": sum(j.served_gpu_s for j in mine) / 3600.0,
                     "preemptions": sum(j.preemptions for j in mine),
                     "lost_gpu_hours": sum(j.lost_gpu_s for j in mine) / 3600.0}
    return out


def never_started(jobs: list[SimJob], plan: QuotaPlan, capacity: dict[str, int], model: str,
                  label: str) -> list[str]:
    """Why the jobs no replay started never did, counted: what the configuration rules out is a finding (a job
    larger than its team's limit, or than a Kueue cohort's nominal quota), the rest still waited at the horizon."""
    quotas, promised_gpus = quotas_of(plan), promised(plan)
    reasons: dict[str, int] = {}
    for job in jobs:
        if job.first_start is not None:
            continue
        present = capacity.get(job.model, 0)
        if job.gpus > present:
            why = f"ask more {job.model} GPUs than are present"
        elif job.gpus > quotas.limit_of(job.team, job.model, present):
            why = f"ask more {job.model} GPUs than their team's limit"
        elif model == "kueue" and job.gpus > promised_gpus.get(job.model, 0.0):
            why = (f"ask more {job.model} GPUs than the Kueue cohort holds in nominal quota "
                   f"({promised_gpus.get(job.model, 0.0):g})")
        else:
            why = "still waited when the replay ended (the window, then as long again to drain)"
        reasons[why] = reasons.get(why, 0) + 1
    return [f"{label}: {n} job(s) never start: they {why}" for why, n in sorted(reasons.items())]


def replay(workload: Workload, capacity: dict[str, int], plan: QuotaPlan, model: str, settings: WhatIfConfig,
           length_s: float, half_life_s: float, usage: dict[str, float] | None = None) -> tuple[list[SimJob], float]:
    """One configuration's replay: the jobs as they fared, and the horizon it ran to (the window, then as long
    again for the queue to drain, with no new arrivals). `usage`: each team's decayed GPU-seconds before the
    window (analytics/job_replay.py prior_usage), where fair share starts from."""
    horizon = 2.0 * length_s
    sim = Simulation(workload, capacity, quotas_of(plan), scheduler_model(model, settings), length_s, horizon,
                     half_life_s, usage)
    jobs = sim.run()
    for job in jobs:
        if job.start is not None and job.end is None:
            job.served_gpu_s += job.gpus * max(0.0, length_s - max(job.start, 0.0))  # inside the window only
    return jobs, horizon


def compare(workload: Workload, start: datetime, end: datetime, plans: dict[str, QuotaPlan],
            capacity: dict[str, dict[str, int]], model: str, config: Config,
            usage: dict[str, float] | None = None) -> WhatIf:
    """Replay `workload` under each configuration of CONFIGURATIONS and gather the figures."""
    began = time.perf_counter()
    length = (end - start).total_seconds()
    figures, utilisation, notes = {}, {}, []
    tested: Backtest | None = None
    for name in CONFIGURATIONS:
        notes += (check_plan(plans[name], capacity[name], model, PROPOSAL, promised(plans["current"]))
                  if name == "proposed" else check_plan(plans[name], capacity[name], model, IN_FORCE))
        jobs, horizon = replay(workload, capacity[name], plans[name], model, config.whatif, length,
                               half_life_s(config), usage)
        figures[name] = figures_of(jobs, horizon)
        if name == "current":
            tested = backtest(workload.jobs, jobs, length, config.whatif)
            if not tested.calibrated:
                notes.append(f"uncalibrated: {tested.why_not()}; the difference below is not an effect to act on")
        notes += never_started(jobs, plans[name], capacity[name], model,
                               PROPOSAL if name == "proposed" else IN_FORCE)
        gpus = sum(capacity[name].values())
        utilisation[name] = (figures[name][ALL_TEAMS]["gpu_hours"] / (gpus * length / 3600.0)
                             if gpus and length else None)
    rows = []
    current, proposed = ({t.team: t for t in plans[c].teams} for c in CONFIGURATIONS)
    for team in sorted(current):
        for gpu_model in sorted(set(current[team].models()) | set(proposed[team].models())):
            now, then = current[team], proposed[team]
            row = {"team": team, "gpu_model": gpu_model,
                   "current_guarantee_gpus": now.guarantee.get(gpu_model),
                   "current_limit_gpus": plans["current"].limit_of(now, gpu_model),
                   "proposed_guarantee_gpus": then.guarantee.get(gpu_model),
                   "proposed_limit_gpus": plans["proposed"].limit_of(then, gpu_model)}
            row["changed"] = (row["current_guarantee_gpus"] != row["proposed_guarantee_gpus"]
                              or row["current_limit_gpus"] != row["proposed_limit_gpus"])
            rows.append(row)
    if model == "slurm" and any(r["current_guarantee_gpus"] != r["proposed_guarantee_gpus"] for r in rows):
        notes.append("Slurm has no guarantee: under the Slurm-like model only limits (GrpTRES) and shares change "
                     "what runs")
    return WhatIf(model, start, end, capacity, workload, figures, utilisation, rows, merged(notes),
                  time.perf_counter() - began, tested)


def merged(notes: list[str]) -> list[str]:
    """The notes, each said once where it holds for both configurations."""
    out = []
    for note in notes:
        if note.startswith(PROPOSAL) and IN_FORCE + note[len(PROPOSAL):] in notes:
            continue
        if note.startswith(IN_FORCE) and PROPOSAL + note[len(IN_FORCE):] in notes:
            note = BOTH + note[len(IN_FORCE):]
        out.append(note)
    return out


def current_plan(store: Store, config: Config, at: datetime) -> QuotaPlan:
    """The quotas in force at `at`: the config and every applied decision, and over them whatever the scheduler
    reports running (policies/whatif/reported.py)."""
    return with_reported(store, build_plan(store, config, statuses=(APPLIED,), at=at), at, READ_MAX_AGE, config)


# the recommender's `evaluate(store, config, at)` (policies/recommender.py), given by the caller: the recommender
# simulates its quota advice's effects with this package, so this package does not import it (no import circle)
Advise = Callable[[Store, Config, datetime], Any]


def run_whatif(store: Store, config: Config, start: datetime, end: datetime, model: str | None = None,
               edits: dict | None = None, use_recommendations: bool = True,
               capacity: dict[str, int] | None = None, advise: Advise | None = None) -> WhatIf:
    """The what-if of a window: the quotas in force against the proposal (the open recommendations unless
    `use_recommendations` is false, then `edits`), on the GPUs present at the window's end, or `capacity` (GPU
    model -> GPUs: the proposal's inventory, for "buy 16 H200s" or "retire the A100s")."""
    model = model or config.whatif.model
    scheduler_model(model, config.whatif)  # an unknown model fails before any work
    config, reported = in_force(store, config)
    if not end > start:
        raise InputError(f"the window must end after it starts ({start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M})")
    present = present_capacity(store, end)
    # models named as the product prints them anywhere (h100, the Kueue flavor) read as the rate card's (H100)
    names = ModelNames(present)
    if capacity:  # a name no model goes by (a typo) was added as GPUs no job could use, without a word
        names.require(capacity)
    capacity = {names.resolve(m): n for m, n in (capacity or {}).items()}
    edits = {team: {names.resolve(m): v for m, v in models.items()} if isinstance(models, dict) else models
             for team, models in (edits or {}).items()}
    proposed_capacity = {**present, **capacity}
    proposed_capacity = {m: int(n) for m, n in proposed_capacity.items() if n >= 0}
    if not present and not capacity:
        raise InputError(f"no GPU is present at {end:%Y-%m-%d %H:%M} UTC to replay the jobs on: give the capacity")
    if not present:
        present = dict(proposed_capacity)
    records = replay_jobs(store, start, end)
    if records.empty:
        raise InputError(f"no job records between {start:%Y-%m-%d %H:%M} and {end:%Y-%m-%d %H:%M} UTC: a what-if "
                         "replays the scheduler's recorded jobs (gpuledger import sacct|squeue|kube-state, or serve --jobs-from)")
    start, clipped = evidence_start(store, records, start, end)
    union = {m: max(present.get(m, 0), proposed_capacity.get(m, 0)) for m in {*present, *proposed_capacity}}
    workload = workload_of(records, start, end, union)
    if not workload.jobs:
        raise InputError("none of the window's job records can be replayed: " + "; ".join(
            f"{n['jobs']} {n['meaning']}" for n in workload.notes()))
    plans = {"current": current_plan(store, config, end)}
    base, advised = (advised_plan(store, config, end, advise) if use_recommendations else (plans["current"], []))
    plans["proposed"] = edited_plan(base, edits) if edits else base
    # a limit not set is the model's GPUs: those each configuration replays on
    plans = {"current": replace(plans["current"], capacity={**plans["current"].capacity, **present}),
             "proposed": replace(plans["proposed"], capacity={**plans["proposed"].capacity, **proposed_capacity})}
    answer = compare(workload, start, end, plans, {"current": present, "proposed": proposed_capacity}, model, config,
                     starting_usage(store, config, start))
    answer.notes[:0] = clipped + advised + reported + reported_notes(plans["current"])
    return answer


SCHEDULER_RECLAIM = "scheduler.kueue_reclaim"  # store meta: reclaimWithinCohort as the scheduler reports it


def in_force(store: Store, config: Config) -> tuple[Config, list[str]]:
    """`config` with what the scheduler itself reports in place of the config's guess: the config holds only where
    nothing is read. Today that is the Kueue cohort's reclaimWithinCohort (store meta SCHEDULER_RECLAIM, recorded by
    whatever read the scheduler; the demo's simulated site records its own)."""
    reported = store.meta(SCHEDULER_RECLAIM)
    if reported not in (None, config.whatif.kueue_reclaim):
        note = (f"reclaimWithinCohort is {reported!r} as the scheduler reports it ([whatif] kueue_reclaim "
                f"{config.whatif.kueue_reclaim!r} applies only where nothing is read)")
        return replace(config, whatif=replace(config.whatif, kueue_reclaim=reported)), [note]
    return config, []


def half_life_s(config: Config) -> float:
    return config.fairshare.half_life_days * 86400.0


def starting_usage(store: Store, config: Config, start: datetime) -> dict[str, float]:
    """Each team's decayed usage at `start` (four half lives of history): where a replay's fair share starts."""
    return prior_usage(store, start, half_life_s(config), timedelta(seconds=4 * half_life_s(config)))


def advice_edit(advice: QuotaAdvice) -> dict[str, float]:
    """A quota advice's guarantee and limit as a proposal's edit for its team and model."""
    return {"guarantee": float(advice.guarantee or 0), "limit": float(advice.limit or 0)}


def advised_plan(store: Store, config: Config, at: datetime,
                 advise: Advise | None = None) -> tuple[QuotaPlan, list[str]]:
    """The quotas in force with the open recommendations; where none is stored yet (a server refreshes them every
    [quota] refresh_minutes), the quota changes the policy advises at `at` (`advise`: the recommender's evaluate),
    evaluated now and not stored."""
    # the open advice over the quotas in force as the scheduler reports them (never over the advice itself)
    plan = with_reported(store, build_plan(store, config, statuses=OPEN, at=at), at, READ_MAX_AGE, config)
    if any(r.kind == "quota" for r in stored(store, statuses=OPEN)):
        return plan, []
    if advise is None:
        return plan, ["no open recommendation is stored and no policy was evaluated: the proposal is the quotas in "
                      "force"]
    edits: dict[str, dict[str, dict[str, float]]] = {}
    for advice in advise(store, config, at).quota:
        if advice.status == "change" and advice.team in {t.team for t in plan.teams}:
            edits.setdefault(advice.team, {})[advice.gpu_model] = advice_edit(advice)
    note = (f"no open recommendation is stored: the proposal is the policy's quota advice at {at:%Y-%m-%d %H:%M} "
            f"UTC, evaluated now and not stored ({sum(len(m) for m in edits.values())} change(s))")
    return (edited_plan(plan, edits) if edits else plan), [note]


def evidence_start(store: Store, records, start: datetime, end: datetime) -> tuple[datetime, list[str]]:
    """The window's start, moved up to the first sample or job record where the store holds nothing before it: a
    window longer than the history would count GPU-hours present that no evidence shows (utilisation too low)."""
    hours = [h for row in covered_hours(store, start, end)["hours"] for h in row]
    instants = [pd.Timestamp(v) for v in (*hours, records["submit_ts"].min(), records["start_ts"].min())
                if v is not None and not pd.isna(v)]
    instants = [t.tz_localize("UTC") if t.tzinfo is None else t for t in instants]  # hours are UTC, unmarked
    first = min(instants).to_pydatetime() if instants else start
    if first <= start:
        return start, []
    first = first.replace(second=0, microsecond=0)
    return first, [f"the window starts at {first:%Y-%m-%d %H:%M} UTC, the first sample or job record: the store "
                   f"holds nothing from the {start:%Y-%m-%d %H:%M} asked"]


def default_window(config: Config, end: datetime, days: float | None = None) -> tuple[datetime, datetime]:
    return end - timedelta(days=days if days is not None else config.quota.window_days), end


__all__ = ["run_whatif", "compare", "WhatIf", "SCHEDULER_RECLAIM", "in_force", "FIGURES", "CONFIGURATIONS", "ALL_TEAMS", "edited_plan",
           "current_plan", "quotas_of", "replay", "figures_of", "default_window"]
