"""Each quota change's simulated effect, as evidence on the advice, and advice with no net gain held back.

For every quota advice that would change something, the policy window's recorded jobs of that GPU model are
replayed ([whatif] model, under the settings the scheduler reports) twice: under the quotas in force, and with
that one change applied. First, the replay of the quotas in force is checked against the record (backtest.py):
a replay that does not give back the measured waits is no ground for advice, so the advice becomes
`insufficient_data` with the backtest's numbers. Then the evidence says what each team would feel (p50/p95 and
mean wait, p95 completion time, preemptions, and the GPU-hours its jobs wait, valued at the rate card), before and
after, and names who gains and who pays. The advice is `held_back` (not proposed, not exported, shown with the
reason) when any team's p95 wait, the advised team's own included, grows by more than `harm_wait_minutes` and
more than `harm_wait_fraction` of what it was, or when no team's wait shortens: moving a promise that helps
nobody is not advice (where demand waits and capacity is short, more GPUs would help; the capacity review says).

Where the window has no job records, or none of them can be replayed, the effect is unknown and says so
(`simulated_effect` is absent and `simulated_effect_unknown` gives the reason); nothing is held back on a guess.
"""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from gpuledger.analytics.config import Config
from gpuledger.analytics.job_replay import replay_jobs
from gpuledger.analytics.store import Store
from gpuledger.policies.quota import QuotaAdvice
from gpuledger.policies.recommendation import HELD_BACK, INSUFFICIENT_DATA
from gpuledger.policies.whatif import (ALL_TEAMS, advice_edit, current_plan, edited_plan, figures_of, half_life_s,
                                       in_force, present_capacity, replay, starting_usage)
from gpuledger.collector.samples import UNATTRIBUTED
from gpuledger.policies.whatif.backtest import Backtest, backtest
from gpuledger.policies.whatif.workload import SimJob, Workload, workload_of

SHOWN = ("jobs", "wait_p50_minutes", "wait_p95_minutes", "wait_mean_minutes", "completion_p95_hours", "preemptions",
         "waited_gpu_hours", "waited_usd")
GAIN_MINUTES, GAIN_FRACTION = 1.0, 0.05  # a wait shortened by more than both is a gain (less is replay noise)


def _waited(jobs: list[SimJob], horizon_s: float, rate: float | None) -> dict[str, dict[str, float | None]]:
    """Per team: the GPU-hours its arrived jobs spent waiting (GPUs x wait, to the horizon for those that never
    started), and that valued at the model's rate card: what the wait costs in GPUs held back from the team."""
    out: dict[str, dict[str, float | None]] = {}
    for job in jobs:
        if job.running_at_start:
            continue
        began = job.first_start if job.first_start is not None else horizon_s
        mine = out.setdefault(job.team, {"waited_gpu_hours": 0.0})
        mine["waited_gpu_hours"] += job.gpus * max(0.0, began - job.submit) / 3600.0
    for mine in out.values():
        mine["waited_usd"] = mine["waited_gpu_hours"] * rate if rate is not None else None
    return out


def _with_waits(figures: dict[str, dict[str, Any]], jobs: list[SimJob], horizon_s: float,
                rate: float | None) -> dict[str, dict[str, Any]]:
    waited = _waited(jobs, horizon_s, rate)
    return {team: {**f, **waited.get(team, {"waited_gpu_hours": 0.0, "waited_usd": 0.0 if rate is not None else None})}
            for team, f in figures.items()}


def _of_model(workload: Workload, model: str) -> Workload:
    jobs = [j for j in workload.jobs if j.model == model]
    return Workload([replace(j, idx=i) for i, j in enumerate(jobs)], workload.assumed)


def _before_after(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Each SHOWN figure under both configurations; a figure unknown under either (no job finished, none waited)
    is left out rather than shown as a number: no advice rests on a missing value."""
    return {k: {"current": before[k], "proposed": after[k]} for k in SHOWN
            if before.get(k) is not None and after.get(k) is not None}


def simulate_effects(store: Store, config: Config, at: datetime, advice: list[QuotaAdvice]) -> list[QuotaAdvice]:
    """`advice` with each change's simulated effect in its evidence; changes without a calibrated net gain held
    back or marked insufficient_data."""
    changes = [a for a in advice if a.status == "change"]
    if not changes:
        return advice
    config, reported = in_force(store, config)
    settings, start = config.whatif, at - timedelta(days=config.quota.window_days)
    capacity = present_capacity(store, at)
    records = replay_jobs(store, start, at)
    workload = workload_of(records, start, at, capacity) if len(records) and capacity else None
    if workload is None or not workload.jobs:
        why = ("no job records in the policy window to replay" if not len(records) else
               "no GPU present to replay the jobs on" if not capacity else "none of the window's jobs can be replayed")
        for a in changes:
            a.evidence["simulated_effect_unknown"] = why
        return advice
    plan = current_plan(store, config, at)
    length, half_life = (at - start).total_seconds(), half_life_s(config)
    usage = starting_usage(store, config, start)
    rates = store.current_rates()
    baselines: dict[str, tuple[Workload, dict[str, Any], Any]] = {}
    afters: dict[str, dict[str, Any]] = {}
    for a in changes:
        if a.gpu_model not in baselines:
            mine = _of_model(workload, a.gpu_model)
            if mine.jobs:
                jobs, horizon = replay(mine, capacity, plan, settings.model, settings, length, half_life, usage)
                baselines[a.gpu_model] = (mine, _with_waits(figures_of(jobs, horizon), jobs, horizon,
                                                            rates.get(a.gpu_model)),
                                          backtest(mine.jobs, jobs, length, settings))
            else:
                baselines[a.gpu_model] = (mine, {}, None)
        mine, before, tested = baselines[a.gpu_model]
        if not mine.jobs:
            a.evidence["simulated_effect_unknown"] = f"no {a.gpu_model} job records in the policy window"
            continue
        a.evidence["backtest"] = _evidence_of(tested, reported)
        if not tested.calibrated:
            a.status = INSUFFICIENT_DATA
            a.evidence["simulated_effect_unknown"] = tested.why_not()
            a.reason += (f"; not advised: {tested.why_not()} over the {a.gpu_model} jobs of the policy window, so "
                         "its simulated effect cannot be trusted")
            continue
        group = [b for b in changes if b.gpu_model == a.gpu_model]
        if a is group[0]:  # one model's changes are one proposal: replayed once, together
            edits: dict[str, dict[str, dict[str, float]]] = {}
            for b in group:
                edits.setdefault(b.team, {})[b.gpu_model] = advice_edit(b)
            jobs, horizon = replay(mine, capacity, edited_plan(plan, edits), settings.model, settings, length,
                                   half_life, usage)
            afters[a.gpu_model] = _with_waits(figures_of(jobs, horizon), jobs, horizon, rates.get(a.gpu_model))
        if len(group) > 1:
            a.evidence["applied_together_with"] = [f"{b.team} {b.gpu_model} guarantee {b.guarantee}" for b in group
                                                   if b is not a]
        _judge(a, before, afters[a.gpu_model], settings, start, at, len(mine.jobs), tested)
    return advice


def _evidence_of(tested: Backtest, reported: Any) -> dict[str, Any]:
    """The backtest as advice evidence: per team, the figures both sides have (a team with no job that arrived has
    no wait to compare, and evidence carries no missing value); the per-(team, model) rows stay in the what-if."""
    whole = tested.to_dict()
    whole.pop("pairs")
    whole["teams"] = [{k: v for k, v in row.items()
                       if v is not None and not (isinstance(v, dict) and None in v.values())} for row in tested.teams]
    return {k: v for k, v in {**whole, "settings_reported": reported}.items() if v is not None}


def _judge(a: QuotaAdvice, before: dict, after: dict, settings, start: datetime, at: datetime, jobs: int,
           tested) -> None:
    """Who gains and who pays, in minutes and dollars; held back when a team pays beyond the bound or none gains.
    The unattributed bucket (jobs billed to no team) is listed when it pays but bounds nothing: no quota is its
    own, so no quota advice could protect it."""
    others, worst, gains, pays = {}, None, [], []
    for team in sorted(set(before) | set(after)):
        if team == ALL_TEAMS:
            continue
        was, now = before.get(team, {}), after.get(team, {})
        if team != a.team:
            others[team] = _before_after(was, now)
        p_was, p_now = was.get("wait_p95_minutes"), now.get("wait_p95_minutes")
        m_was, m_now = was.get("wait_mean_minutes"), now.get("wait_mean_minutes")
        if p_was is None or p_now is None:
            continue
        entry = {"team": team, "p95_wait_minutes": {"current": p_was, "proposed": p_now},
                 "mean_wait_minutes": {"current": m_was, "proposed": m_now},
                 "waited_gpu_hours_change": now.get("waited_gpu_hours", 0.0) - was.get("waited_gpu_hours", 0.0),
                 "waited_usd_change": (now["waited_usd"] - was["waited_usd"]
                                       if now.get("waited_usd") is not None and was.get("waited_usd") is not None
                                       else None)}
        drop = max(p_was - p_now, (m_was - m_now) if m_was is not None and m_now is not None else 0.0)
        base = max(p_was, m_was or 0.0)
        if drop > GAIN_MINUTES and drop > GAIN_FRACTION * base:
            gains.append(entry)
        rise = max(p_now - p_was, (m_now - m_was) if m_was is not None and m_now is not None else 0.0)
        if rise > GAIN_MINUTES and rise > GAIN_FRACTION * base:
            pays.append(entry)
        if team == UNATTRIBUTED:  # jobs billed to no team: no quota of theirs to protect; shown in pays, no bound
            continue
        bound = max(settings.harm_wait_minutes, settings.harm_wait_fraction * p_was)
        grown = p_now - p_was
        if worst is None or grown - bound > worst["p95_wait_growth_minutes"] - worst["bound_minutes"]:
            worst = {"team": team, "p95_wait_growth_minutes": grown, "bound_minutes": bound,
                     "p95_wait_minutes": {"current": p_was, "proposed": p_now}}
    a.evidence["simulated_effect"] = {
        "model": settings.model, "window_start": start, "window_end": at, "jobs_replayed": jobs,
        "calibrated": tested.calibrated, "backtest_worst": tested.worst,
        "team": _before_after(before.get(a.team, {}), after.get(a.team, {})), "others": others,
        "gains": gains, "pays": pays, **({"most_harmed": worst} if worst is not None else {})}
    error = (f" (backtest: {tested.worst['team']}'s p95 wait replayed within {abs(tested.worst['error_minutes']):.0f}"
             f" min of the measured {tested.worst['measured']:.0f})" if tested.worst else "")
    if worst is not None and worst["p95_wait_growth_minutes"] > worst["bound_minutes"]:
        a.status = HELD_BACK
        a.reason += (f"; held back: replayed through the {settings.model}-like model over the policy window, "
                     f"{worst['team']}'s p95 wait would grow from {worst['p95_wait_minutes']['current']:.0f} to "
                     f"{worst['p95_wait_minutes']['proposed']:.0f} minutes, over the {worst['bound_minutes']:.0f}-"
                     "minute bound ([whatif] harm_wait_minutes, harm_wait_fraction)" + error)
    elif not gains:
        a.status = HELD_BACK
        a.reason += (f"; held back: replayed through the {settings.model}-like model over the policy window, no "
                     "team's wait would shorten, so the change gains nobody anything" + error
                     + (f"; {a.team}'s jobs wait on {a.gpu_model}: more GPUs, not moved quota, would shorten that"
                        f" (gpuledger capacity)" if (before.get(a.team, {}).get("wait_p95_minutes") or 0) > 0 else ""))
    else:
        named = ", ".join(f"{g['team']} {g['p95_wait_minutes']['current']:.0f} -> "
                          f"{g['p95_wait_minutes']['proposed']:.0f} min" for g in gains)
        paid = ", ".join(f"{p['team']} {p['p95_wait_minutes']['current']:.0f} -> "
                         f"{p['p95_wait_minutes']['proposed']:.0f} min" for p in pays)
        a.reason += (f"; simulated ({settings.model}-like, policy window): gains p95 wait {named}"
                     + (f"; pays {paid}" if paid else "; nobody pays") + error)
