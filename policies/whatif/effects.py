"""Each quota change's simulated effect, as evidence on the advice, and advice held back when it harms others.

For every quota advice that would change something, the policy window's recorded jobs of that GPU model are
replayed ([whatif] model) twice: under the quotas in force, and with that one change applied. The evidence says
what the team and every other team would feel (p50/p95 and mean wait, p95 completion time, preemptions), before
and after. When another team's p95 wait grows by more than `harm_wait_minutes` and more than `harm_wait_fraction`
of what it was, the advice is `held_back` with the numbers: not proposed, not exported, shown with the reason.

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
from gpuledger.policies.recommendation import HELD_BACK
from gpuledger.policies.whatif import (ALL_TEAMS, advice_edit, current_plan, edited_plan, figures_of, half_life_s,
                                       present_capacity, replay, starting_usage)
from gpuledger.policies.whatif.workload import Workload, workload_of

SHOWN = ("jobs", "wait_p50_minutes", "wait_p95_minutes", "wait_mean_minutes", "completion_p95_hours", "preemptions")


def _of_model(workload: Workload, model: str) -> Workload:
    jobs = [j for j in workload.jobs if j.model == model]
    return Workload([replace(j, idx=i) for i, j in enumerate(jobs)], workload.assumed)


def _before_after(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Each SHOWN figure under both configurations; a figure unknown under either (no job finished, none waited)
    is left out rather than shown as a number: no advice rests on a missing value."""
    return {k: {"current": before[k], "proposed": after[k]} for k in SHOWN
            if before.get(k) is not None and after.get(k) is not None}


def simulate_effects(store: Store, config: Config, at: datetime, advice: list[QuotaAdvice]) -> list[QuotaAdvice]:
    """`advice` with each change's simulated effect in its evidence; harmful changes held back."""
    changes = [a for a in advice if a.status == "change"]
    if not changes:
        return advice
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
    baselines: dict[str, tuple[Workload, dict[str, Any]]] = {}
    for a in changes:
        if a.gpu_model not in baselines:
            mine = _of_model(workload, a.gpu_model)
            baselines[a.gpu_model] = (mine, figures_of(*replay(mine, capacity, plan, settings.model, settings,
                                                                  length, half_life, usage)) if mine.jobs else {})
        mine, before = baselines[a.gpu_model]
        if not mine.jobs:
            a.evidence["simulated_effect_unknown"] = f"no {a.gpu_model} job records in the policy window"
            continue
        changed = edited_plan(plan, {a.team: {a.gpu_model: advice_edit(a)}})
        after = figures_of(*replay(mine, capacity, changed, settings.model, settings, length, half_life, usage))
        _judge(a, before, after, settings, start, at, len(mine.jobs))
    return advice


def _judge(a: QuotaAdvice, before: dict, after: dict, settings, start: datetime, at: datetime, jobs: int) -> None:
    others, worst = {}, None
    for team in sorted(set(before) | set(after)):
        if team in (a.team, ALL_TEAMS):
            continue
        was, now = before.get(team, {}), after.get(team, {})
        others[team] = _before_after(was, now)
        p_was, p_now = was.get("wait_p95_minutes"), now.get("wait_p95_minutes")
        if p_was is None or p_now is None:
            continue
        bound = max(settings.harm_wait_minutes, settings.harm_wait_fraction * p_was)
        grown = p_now - p_was
        if worst is None or grown - bound > worst["p95_wait_growth_minutes"] - worst["bound_minutes"]:
            worst = {"team": team, "p95_wait_growth_minutes": grown, "bound_minutes": bound,
                     "p95_wait_minutes": {"current": p_was, "proposed": p_now}}
    a.evidence["simulated_effect"] = {
        "model": settings.model, "window_start": start, "window_end": at, "jobs_replayed": jobs,
        "team": _before_after(before.get(a.team, {}), after.get(a.team, {})), "others": others,
        **({"most_harmed": worst} if worst is not None else {})}
    if worst is not None and worst["p95_wait_growth_minutes"] > worst["bound_minutes"]:
        a.status = HELD_BACK
        a.reason += (f"; held back: replayed through the {settings.model}-like model over the policy window, "
                     f"{worst['team']}'s p95 wait would grow from {worst['p95_wait_minutes']['current']:.0f} to "
                     f"{worst['p95_wait_minutes']['proposed']:.0f} minutes, over the {worst['bound_minutes']:.0f}-"
                     "minute bound ([whatif] harm_wait_minutes, harm_wait_fraction)")
    else:
        mine = a.evidence["simulated_effect"]["team"].get("wait_p95_minutes")
        if mine is not None:
            a.reason += (f"; simulated ({settings.model}-like, policy window): {a.team}'s p95 wait "
                         f"{mine['current']:.0f} -> {mine['proposed']:.0f} min"
                         + (f", most affected other team {worst['team']} {worst['p95_wait_minutes']['current']:.0f}"
                            f" -> {worst['p95_wait_minutes']['proposed']:.0f} min" if worst else ""))
