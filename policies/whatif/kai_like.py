"""KAI-like: deserved quota, over-quota weight, and reclaim by fair share, in the order of time-based fair share.

Rules, and where KAI has them (NVIDIA/KAI-Scheduler; ../shared/docs/schedulers/kai-time-based-fairshare.md), for
the queues gpuledger emits (policies/emitters/kai.py: quota = guarantee, limit, overQuotaWeight = share):
- Each team's fair share of a model is recomputed at every pass from what it asks (held plus waiting): first
  min(deserved, asked, limit), then what is left split by over-quota weight among the teams still asking, in
  rounds, each capped at what it asks and its limit (plugins/proportion/resource_division).
- GPUs go first to the team furthest below its fair share (allocated / fair share, lowest first); between equal
  ratios, to the team with less decayed usage per weight (time-based fair share); within a team, oldest first. A
  team may run over its fair share on GPUs nobody else asks for, never over its limit.
- Reclaim: a team whose oldest waiting job keeps it within its fair share, but does not fit the free GPUs, evicts
  jobs of teams above their fair share, newest first, as long as each stays at or above it (plugins/reclaim).
"""
from __future__ import annotations

from gpuledger.analytics.config import WhatIfConfig
from gpuledger.policies.whatif.engine import Simulation


def fair_shares(asked: dict[str, float], deserved: dict[str, float], limit: dict[str, float], weight: dict[str, float],
                capacity: float) -> dict[str, float]:
    """Deserved first, then the rest by weight in rounds, capped at what each asks and its limit."""
    want = {t: min(asked[t], limit[t]) for t in asked}
    fair = {t: min(deserved[t], want[t]) for t in asked}
    left = capacity - sum(fair.values())
    while left > 1e-9:
        hungry = {t: weight[t] for t in asked if want[t] - fair[t] > 1e-9 and weight[t] > 0}
        total = sum(hungry.values())
        if not hungry or total <= 0:
            break
        given = 0.0
        for team, w in hungry.items():
            part = min(left * w / total, want[team] - fair[team])
            fair[team] += part
            given += part
        left -= given
        if given <= 1e-9:
            break
    return fair


class KaiLike:
    name = "kai"
    pass_delay_s = 0.0  # Kueue and KAI reconcile on every change

    def __init__(self, settings: WhatIfConfig) -> None:
        self.settings = settings

    def schedule(self, sim: Simulation, model: str) -> None:
        if not sim.waiting[model]:
            return
        capacity = sim.capacity[model]
        waiting = sim.waiting_gpus(model)
        # sorted: the rounds add floats team by team, and a set's order changes with the process's hash seed
        teams = sorted(set(waiting) | {t for (t, m), n in sim.used.items() if m == model and n > 0})
        q = sim.quotas
        asked = {t: sim.used[(t, model)] + waiting.get(t, 0) for t in teams}
        fair = fair_shares(asked, {t: q.guarantee_of(t, model) for t in teams},
                           {t: q.limit_of(t, model, capacity) for t in teams}, {t: q.share_of(t) for t in teams},
                           capacity)
        while True:
            best, best_key, reclaimer = None, None, None
            for team, size, job in sim.heads(model):
                used = sim.used[(team, model)]
                if used + size > q.limit_of(team, model, capacity):
                    continue
                ratio = used / fair[team] if fair[team] > 0 else float("inf")
                key = (ratio, sim.usage[team] / max(q.share_of(team), 1e-9), job.submit, job.idx)
                if size <= sim.free[model]:
                    if best_key is None or key < best_key:
                        best, best_key = job, key
                elif used + size <= fair[team] + 1e-9 and (reclaimer is None or key < reclaimer[0]):
                    reclaimer = (key, job)
            if best is not None:
                sim.start(best)
                continue
            # a victim may go as long as its team stays at or above its fair share
            if reclaimer is None or not sim.evict_for(
                    reclaimer[1], sim.free[model],
                    lambda team, held, victim: held - victim.gpus >= fair.get(team, 0.0) - 1e-9):
                return
