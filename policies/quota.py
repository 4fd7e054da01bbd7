"""Quota advice per team and GPU model: a guarantee and a limit, bound by evidence, shares and capacity.

What the numbers mean (the same in every scheduler gpuledger emits for):
- **guarantee**: GPUs of this model the team is promised. The scheduler gives them back to the team when it
  asks, reclaiming them from others if needed (KAI `quota`, Kueue `nominalQuota`, Volcano `deserved`).
  Guarantees of one model never add up to more than the GPUs of that model present.
- **limit**: the most GPUs of this model the team may hold, borrowing what others leave idle (KAI `limit`,
  Kueue nominal + `borrowingLimit`, Volcano `capability`, Slurm `GrpTRES=gres/gpu:<model>`). gpuledger sets
  it to the model's capacity: idle GPUs should be borrowable, and borrowed GPUs are reclaimable.

How a guarantee is chosen, from the policy window (`[quota] window_days`, default 14) ending at the instant
evaluated, never from a window a caller happens to view:
1. Evidence first: a model whose samples cover under `min_coverage` of the window's hours gets no number,
   only `insufficient_data` and the reason.
2. Demand: the 95th percentile of the team's hourly busy GPUs (allocated, with a utilisation reading, and not
   idle), hours weighted by age with the fairshare half-life, plus the GPUs of its jobs queued for at least
   `pending_min_wait_minutes`; then `headroom` on top. Busy demand rests on measured hours only: an hour in
   which the team held GPUs without any utilisation reading is left out (not counted as 0 busy), and within an
   hour only the GPUs with a reading count. A team that held the model's GPUs in the window without a single
   reading gets `insufficient_data` with the reason "no utilisation data" (see `UNMEASURED`).
3. Shares bound it: every team first gets its demand up to its fair part of the model (capacity x share
   over all shares). What is left is shared out to teams wanting more, in proportion to what they want,
   except teams the fairshare algorithm finds over-served: they get no more than their fair part.
4. Idle-held GPUs count against a raise: a raise is cut by the GPUs the team held idle on average.
5. Steps are bounded: one change moves a guarantee by at most `max_change` of its current value (at least
   one GPU), and changes under `min_change_gpus` and `min_change_fraction` are not advised.
6. Capacity is a hard bound, above the step bound: guarantees are trimmed, largest excess over the fair part
   first, until they fit.
7. GPUs no guarantee covers (freed by cuts, or left so by the quotas in force) go to teams whose jobs waited and
   that are not over-served, up to their targets (the one furthest below first), past the step bound: under Kueue
   a cohort admits at most its queues' nominal quota summed, so a GPU under no guarantee stands idle while jobs
   wait. The changes of one model are therefore one proposal, replayed
   and judged together (policies/whatif/effects.py): a cut nobody gains from is held back there, and an exported
   plan refuses GPUs that accepted advice left under no guarantee unless asked to share them out
   (policies/quota_plan.py `fill_stranded`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import NO_UTILISATION, capacity_by_model, covered_hours, hourly_demand, pending_jobs
from gpuledger.analytics.workloads import waiting_demand
from gpuledger.policies.fairshare import fairshare_at
from gpuledger.policies.recommendation import APPLIED, stored

HOURS_PER_WEEK = 168.0


@dataclass
class QuotaAdvice:
    team: str
    gpu_model: str
    status: str  # "change" | "hold" | "insufficient_data"
    current: float | None  # the guarantee in force (last applied decision, else the site config)
    guarantee: int | None = None
    limit: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The value below which a share `q` of the total weight lies (0 for no values)."""
    if len(values) == 0 or weights.sum() <= 0:
        return 0.0
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, q * cumulative[-1])])


def current_quotas(store: Store) -> dict[tuple[str, str], tuple[float | None, float | None, str]]:
    """(team, model) -> (guarantee, limit, where it comes from): the last applied decision, else the config."""
    out: dict[tuple[str, str], tuple[float | None, float | None, str]] = {}
    for row in store.team_quotas().itertuples(index=False):
        out[(row.team, row.gpu_model)] = (_number(row.guarantee_gpus), _number(row.limit_gpus), "config")
    applied = [r for r in stored(store, statuses=(APPLIED,)) if r.kind == "quota"]
    for rec in sorted(applied, key=lambda r: r.decided_at):  # the latest decision wins
        out[(rec.team, rec.gpu_model)] = (rec.action.get("guarantee_gpus"), rec.action.get("limit_gpus"),
                                          f"decision {rec.id}")
    return out


def _number(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


# Where a team held a model's GPUs in the policy window but none of them had a utilisation reading (the Philly and
# Helios traces), its quota advice is `insufficient_data` with this reason, rather than falling back to allocated
# demand: the rule is "unknown is never zero; say so instead of guessing". Allocated demand would turn every GPU
# held (idle or not) into demand and raise guarantees for GPUs that may sit idle, and zero busy demand would lower
# them for work that may be busy; either is a guess the evidence cannot back. Its guarantee in force stays held
# out of the capacity the other teams share.
UNMEASURED = NO_UTILISATION


class _ModelEvidence:
    """The window's evidence for one GPU model: covered hours, and per team the hourly busy and idle GPUs."""

    def __init__(self, demand: pd.DataFrame, hours: list, at: datetime, half_life_hours: float) -> None:
        self.hours = pd.DatetimeIndex(pd.to_datetime(hours, utc=True)) if len(hours) else pd.DatetimeIndex([])
        age_h = (pd.Timestamp(at) - self.hours).total_seconds().to_numpy() / 3600.0
        self.weights = np.power(2.0, -age_h / half_life_hours) if len(age_h) else np.zeros(0)
        columns = ["allocated_gpus", "measured_gpus", "idle_gpus"]
        self.by_team = {team: frame.set_index("hour")[columns].reindex(self.hours).fillna(0.0)
                        for team, frame in demand.groupby("team")}

    def team(self, team: str) -> dict[str, float]:
        frame = self.by_team.get(team)
        if frame is None or not len(self.hours):
            return {"p95_busy_gpus": 0.0, "always_busy_gpus": 0.0, "mean_busy_gpus": 0.0, "mean_allocated_gpus": 0.0,
                    "idle_allocated_gpu_hours": 0.0, "mean_idle_gpus": 0.0, "allocated_gpu_hours": 0.0,
                    "measured_gpu_hours": 0.0}
        # busy: measured and not idle. An hour the team held GPUs in without any reading is unknown: left out
        known = ((frame["measured_gpus"] > 0) | (frame["allocated_gpus"] <= 0)).to_numpy()
        busy = (frame["measured_gpus"] - frame["idle_gpus"]).clip(lower=0).to_numpy()[known]
        weights = self.weights[known]
        allocated, measured = float(frame["allocated_gpus"].sum()), float(frame["measured_gpus"].sum())
        seen = {"p95_busy_gpus": weighted_quantile(busy, weights, 0.95),
                "always_busy_gpus": weighted_quantile(busy, weights, 0.05),
                "mean_busy_gpus": float(busy.mean()) if len(busy) else 0.0,
                "mean_allocated_gpus": float(frame["allocated_gpus"].mean()),
                "idle_allocated_gpu_hours": float(frame["idle_gpus"].sum()),
                "mean_idle_gpus": float(frame["idle_gpus"].mean()),
                "allocated_gpu_hours": allocated, "measured_gpu_hours": measured,
                "unmeasured_hours": int((~known).sum())}
        if allocated > 0:  # the share of the GPU-hours held that busy demand rests on (absent: nothing held)
            seen["util_coverage"] = min(1.0, measured / allocated)
        return seen


def _queued(pending: pd.DataFrame, team: str, model: str, home_model: str | None) -> tuple[float, int, float]:
    """GPUs, jobs and the longest wait (minutes) of the team's queued jobs for `model`; a job that names no
    model counts for the team's home model (where it is busiest)."""
    mine = pending[(pending["team"] == team)
                   & ((pending["gpu_model"] == model) | (pending["gpu_model"].isna() & (home_model == model)))]
    return float(mine["gpus"].sum()), len(mine), float(mine["waited_minutes"].max()) if len(mine) else 0.0


def _waited(waiting: pd.DataFrame, team: str, model: str, home_model: str | None,
            window_hours: float) -> dict[str, Any]:
    """The team's queue waits for `model` over the policy window, from the schedulers' job records: GPUs waiting
    on average (waiting GPU-hours over the window's hours), jobs that waited, their p95 and longest wait; a job
    that names no model waits for the team's home model."""
    mine = waiting[(waiting["team"] == team)
                   & ((waiting["gpu_model"] == model) | ((waiting["gpu_model"] == "any") & (home_model == model)))]
    hours = float(mine["waiting_gpu_hours"].sum())
    waits: dict[str, Any] = {"waiting_gpu_hours": hours, "jobs_waited": int(mine["jobs_waited"].sum()),
                             "mean_waiting_gpus": hours / window_hours if window_hours else 0.0}
    p95 = mine["p95_wait_minutes"].dropna()
    if len(p95):  # no wait figure where no job with a submission time waited
        waits.update({"p95_wait_minutes": float(p95.max()),
                      "waits_from": sorted({s for sources in mine["sources"] for s in sources if s})})
    return waits


def _share_out(targets: dict[str, float], fair: dict[str, float], capacity: float,
               over_served: dict[str, bool]) -> dict[str, float]:
    """Step 3: demand up to the fair part for all, then the rest to those wanting more and not over-served."""
    base = {t: min(targets[t], fair[t]) for t in targets}
    spare = max(0.0, capacity - sum(base.values()))
    wants = {t: targets[t] - base[t] for t in targets if not over_served.get(t, False)}
    total = sum(wants.values())
    return {t: base[t] + (min(wants[t], spare * wants[t] / total) if t in wants and total > 0 else 0.0)
            for t in targets}


def _fit_capacity(guarantees: dict[str, int], fair: dict[str, float], capacity: float) -> list[str]:
    """Step 6: trim, largest excess over the fair part first, until the guarantees fit; the teams trimmed."""
    trimmed = []
    while sum(guarantees.values()) > math.floor(capacity + 1e-9):
        team = max((t for t in guarantees if guarantees[t] > 0), key=lambda t: (guarantees[t] - fair[t], t))
        guarantees[team] -= 1
        trimmed.append(team)
    return trimmed


def _cover_waiting(guarantees: dict[str, int], targets: dict[str, float], waiting: dict[str, bool],
                   over: dict[str, bool], capacity: float) -> dict[str, str]:
    """Step 7: the GPUs no guarantee covers go to waiting teams that are not over-served, up to their targets.
    Returns a note per team given some."""
    freed = math.floor(capacity + 1e-9) - sum(guarantees.values())
    notes: dict[str, str] = {}
    given: dict[str, int] = {}
    while freed > 0:
        takers = [t for t in guarantees if waiting[t] and not over[t] and targets[t] - guarantees[t] >= 0.5]
        if not takers:
            break
        team = max(takers, key=lambda t: (targets[t] - guarantees[t], t))
        guarantees[team] += 1
        given[team] = given.get(team, 0) + 1
        freed -= 1
    for team, gpus in given.items():
        notes[team] = f"given {gpus} GPU(s) no guarantee covered: its jobs waited while they stood idle"
    return notes


def evaluate_quotas(store: Store, config: Config, at: datetime) -> list[QuotaAdvice]:
    """Quota advice for every team with a share and every GPU model it holds, is promised or waits for."""
    policy = config.quota
    start = at - timedelta(days=policy.window_days)
    teams = store.team_table()
    teams = teams[teams["share"] > 0]
    if teams.empty:
        return []
    shares = dict(zip(teams["team"], teams["share"].astype(float)))
    total_share = sum(shares.values())
    capacity = dict(zip(*[capacity_by_model(store, at)[c] for c in ("gpu_model", "gpus")]))
    coverage = dict(zip(*[covered_hours(store, start, at)[c] for c in ("gpu_model", "hours")]))
    demand = hourly_demand(store, start, at, config.waste.idle_util_pct)
    demand = demand[demand["team"].isin(shares)]
    pending = pending_jobs(store, at, policy.pending_min_wait_minutes)
    waiting = waiting_demand(store, start, at, at)
    fair_state = fairshare_at(store, config, at)
    current = current_quotas(store)
    held = {key: guarantee for key, (guarantee, _, _) in current.items()}  # the guarantee in force
    # the clock hours the window touches (a window that starts mid-hour touches one more than its length): the
    # same hours `covered_hours` counts in, so coverage is never over 1
    window_hours = float(len(pd.date_range(pd.Timestamp(start).floor("h"), pd.Timestamp(at) - pd.Timedelta(1, "us"),
                                           freq="h")))
    rates = store.current_rates()
    busiest = (demand.groupby(["team", "gpu_model"])["allocated_gpus"].sum().reset_index()
               .sort_values("allocated_gpus").groupby("team").tail(1).set_index("team")["gpu_model"].to_dict())
    models = sorted(set(capacity) | {m for (t, m) in current if t in shares} | set(demand["gpu_model"].dropna()))
    advice: list[QuotaAdvice] = []
    for model in models:
        involved = sorted({t for (t, m) in current if m == model and t in shares}
                          | set(demand.loc[demand["gpu_model"] == model, "team"])
                          | {t for t in shares if _queued(pending, t, model, busiest.get(t))[1]}
                          | {t for t in shares
                             if _waited(waiting, t, model, busiest.get(t), window_hours)["waiting_gpu_hours"] > 0})
        if not involved:
            continue
        gpus = float(capacity.get(model, 0.0))
        hours = list(coverage.get(model, []))
        covered = len(hours) / window_hours
        window = {"policy_window_start": start, "policy_window_end": at, "covered_hours": len(hours),
                  "window_hours": window_hours, "coverage": covered, "min_coverage": policy.min_coverage,
                  "capacity_gpus": gpus}
        if covered < policy.min_coverage or gpus <= 0:
            why = (f"no {model} GPU is present at {at:%Y-%m-%d %H:%M} UTC" if gpus <= 0 else
                   f"samples of {model} cover {covered:.0%} of the {policy.window_days:g}-day policy window's "
                   f"hours, under the {policy.min_coverage:.0%} needed")
            advice += [QuotaAdvice(t, model, "insufficient_data", held.get((t, model)), evidence=window,
                                   reason=f"not enough data to advise {t}'s {model} guarantee: {why}")
                       for t in involved]
            continue
        half_life_hours = config.fairshare.half_life_days * 24.0
        evidence = _ModelEvidence(demand[demand["gpu_model"] == model], hours, at, half_life_hours)
        seen_by_team = {team: evidence.team(team) for team in involved}
        unmeasured = [t for t in involved
                      if seen_by_team[t]["allocated_gpu_hours"] > 0 and seen_by_team[t]["measured_gpu_hours"] <= 0]
        for team in unmeasured:
            advice.append(QuotaAdvice(
                team, model, "insufficient_data", held.get((team, model)),
                evidence={**window, **seen_by_team[team]},
                reason=(f"not enough data to advise {team}'s {model} guarantee: {UNMEASURED} (its "
                        f"{seen_by_team[team]['allocated_gpu_hours']:.0f} GPU-hours held in the policy window have no "
                        "utilisation reading, so its busy demand is unknown)")))
        involved = [t for t in involved if t not in unmeasured]
        if not involved:
            continue
        # the guarantees in force of teams without readings stay promised: the others share what is left
        room = gpus - min(gpus, sum(held.get((t, model)) or 0.0 for t in unmeasured))
        facts: dict[str, dict[str, Any]] = {}
        targets, fair, over = {}, {}, {}
        for team in involved:
            seen = seen_by_team[team]
            queued, jobs, waited = _queued(pending, team, model, busiest.get(team))
            waits = _waited(waiting, team, model, busiest.get(team), window_hours)
            # what waits is demand the telemetry cannot show: queued now, or waiting on average over the window
            queue_demand = max(queued, waits["mean_waiting_gpus"])
            state = fair_state.loc[team] if team in fair_state.index else None
            fair[team] = gpus * shares[team] / total_share
            over[team] = bool(state["over_served"]) if state is not None else False
            targets[team] = (seen["p95_busy_gpus"] + queue_demand) * (1.0 + policy.headroom)
            facts[team] = {**window, **seen, "queued_gpus": queued, "queued_jobs": jobs, "longest_wait_minutes": waited,
                           **waits, "queue_demand_gpus": queue_demand,
                           "demand_gpus": seen["p95_busy_gpus"] + queue_demand, "headroom": policy.headroom,
                           "target_gpus": targets[team], "share": shares[team], "norm_share": shares[team] / total_share,
                           "fair_share_gpus": fair[team], "fairshare_algorithm": config.fairshare.algorithm,
                           "fairshare_factor": float(state["fairshare"]) if state is not None else None,
                           "over_served": over[team]}
        shared = _share_out(targets, fair, room, over)
        guarantees: dict[str, int] = {}
        for team in involved:
            wanted, bounds = shared[team], []
            now = held.get((team, model))
            if wanted < targets[team] - 1e-9:
                bounds.append("over-served: held to its fair part" if over[team] else "share of what was left")
            if (now is not None and wanted < now and facts[team]["queue_demand_gpus"] > 0
                    and now <= fair[team] + 1e-9):
                wanted = now  # its jobs wait while it holds no more than its fair part: never cut
                bounds.append(f"not cut: its jobs waited ({facts[team]['queue_demand_gpus']:.1f} GPUs on average) "
                              f"while its guarantee is within its fair part")
            if now is not None and wanted > now and facts[team]["mean_idle_gpus"] >= 0.05:
                cut = min(wanted - now, facts[team]["mean_idle_gpus"])
                wanted -= cut
                bounds.append(f"raise cut by {cut:.1f} GPUs held idle on average")
            if now is not None:
                step = max(1.0, policy.max_change * now)
                if abs(wanted - now) > step:
                    wanted = now + math.copysign(step, wanted - now)
                    bounds.append(f"step bounded to {step:g} GPUs ({policy.max_change:.0%} of {now:g})")
            guarantees[team] = max(0, int(math.floor(wanted + 0.5)))
            if over[team] and guarantees[team] > max(fair[team], now or 0.0):  # rounding must not lift it
                guarantees[team] = max(int(math.floor(fair[team] + 1e-9)), int(now or 0))
            facts[team]["bounded_by"] = bounds
        for team in _fit_capacity(guarantees, fair, room):
            facts[team]["bounded_by"].append(f"trimmed so guarantees fit the {gpus:g} {model} GPUs")
        waited = {t: facts[t]["queue_demand_gpus"] > 0 for t in involved}
        for team, note in _cover_waiting(guarantees, targets, waited, over, room).items():
            facts[team]["bounded_by"].append(note)
        for team in involved:
            advice.append(_advice(team, model, guarantees[team], gpus, current.get((team, model)), facts[team],
                                  rates.get(model), config))
    return advice


def _advice(team: str, model: str, guarantee: int, limit: float, current: tuple | None, facts: dict[str, Any],
            rate: float | None, config: Config) -> QuotaAdvice:
    now, now_limit, source = current if current else (None, None, None)
    delta = guarantee - (now or 0.0)
    facts.update({"current_guarantee_gpus": now, "current_limit_gpus": now_limit, "current_from": source,
                  "guarantee_gpus": guarantee, "limit_gpus": limit,
                  # a guarantee moves a promise, not money: GPUs under a lowered guarantee stay borrowable, so
                  # the cluster's cost does not change; what the moved promise is worth at the rate card is shown as
                  # such, never as a saving (reclaim and resize advice carry real savings: effect_usd_per_week)
                  "effect_gpu_hours_per_week": delta * HOURS_PER_WEEK,
                  "guarantee_usd_per_week": delta * HOURS_PER_WEEK * rate if rate is not None else None})
    threshold = max(config.quota.min_change_gpus, config.quota.min_change_fraction * (now or 0.0))
    changes = (now is None and guarantee > 0) or (now is not None and abs(delta) >= threshold) \
        or (now_limit is not None and now_limit != limit)
    verb = "set" if now is None else ("raise" if delta > 0 else "lower" if delta < 0 else "keep")
    target = "to" if now is None else (f"from {now:g} to" if delta else "at")
    money = (f" (worth ${abs(facts['guarantee_usd_per_week']):,.0f}/week at the rate card)"
             if facts["guarantee_usd_per_week"] is not None else "")
    effect = ("of guarantee added" if delta > 0 else
              "of guarantee released to the pool; the GPUs stay borrowable, so no cost is saved")
    reason = (f"{verb} {team}'s {model} guarantee {target} {guarantee} "
              f"(limit {limit:g}): p95 busy {facts['p95_busy_gpus']:.1f} GPUs, {facts['queued_gpus']:g} queued now"
              + (f", {facts['mean_waiting_gpus']:.1f} waiting on average (p95 wait "
                 f"{facts['p95_wait_minutes']:.0f} min, {facts['jobs_waited']} jobs)"
                 if facts["mean_waiting_gpus"] > 0 and "p95_wait_minutes" in facts else "") + ", "
              f"fair part {facts['fair_share_gpus']:.1f} of {limit:g}, "
              f"{facts['idle_allocated_gpu_hours']:.0f} GPU-h held idle")
    if delta:
        reason += f"; {abs(delta) * HOURS_PER_WEEK:,.0f} GPU-h/week{money} {effect}"
    if facts.get("util_coverage", 1.0) < 1.0 - 1e-9:  # busy demand rests on the measured GPU-hours only
        reason += (f"; busy demand from the {facts['util_coverage']:.0%} of its GPU-hours with a utilisation reading"
                   + (f" ({facts['unmeasured_hours']} hours without any left out)"
                      if facts["unmeasured_hours"] else ""))
    if facts["bounded_by"]:
        reason += "; " + "; ".join(facts["bounded_by"])
    return QuotaAdvice(team, model, "change" if changes else "hold", now, guarantee, limit, facts, reason)
