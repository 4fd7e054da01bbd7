"""Kueue-like: a ClusterQueue per team in one cohort, nominal quota, borrowing limit, and reclaim within the cohort.

Rules, and where Kueue has them (kubernetes-sigs/kueue; ../shared/docs/schedulers/kueue.md), for the objects
gpuledger emits (policies/emitters/kueue.py: nominalQuota = guarantee, borrowingLimit = limit - guarantee, no
lendingLimit, every team's queue under one root cohort):
- The cohort can admit at most the sum of its queues' nominal quotas of a model (pkg/cache: a cohort's
  capacity is its members' quota), and never more GPUs than are present.
- A workload is admitted when its queue's usage plus its request stays within nominal quota, or, borrowing, within
  nominal + borrowingLimit while the cohort has unused quota. Queues are BestEffortFIFO: a team's oldest
  admissible workload goes first, an inadmissible head does not block the ones behind it.
- Across queues, workloads that need no borrowing go first, then the oldest (the scheduler's entry ordering,
  pkg/scheduler/scheduler.go: borrowing last, then priority, then creation time; priorities are not in the record).
- reclaimWithinCohort (`kueue_reclaim = "any"`): a workload that fits its queue's nominal quota but not the free
  GPUs evicts workloads of queues that are borrowing, newest first, until it fits (pkg/scheduler/preemption).
  An evicted workload is requeued and starts over.
"""
from __future__ import annotations

from gpuledger.analytics.config import WhatIfConfig
from gpuledger.policies.whatif.engine import Simulation


class KueueLike:
    name = "kueue"
    pass_delay_s = 0.0  # Kueue and KAI reconcile on every change

    def __init__(self, settings: WhatIfConfig) -> None:
        self.reclaim = settings.kueue_reclaim == "any"

    def schedule(self, sim: Simulation, model: str) -> None:
        if not sim.waiting[model]:
            return
        capacity = sim.capacity[model]
        teams = {t for t, _ in sim.waiting[model]} | {t for t, m in sim.quotas.guarantee if m == model}
        pool = min(capacity, sum(sim.quotas.guarantee_of(t, model) for t in teams))
        while True:
            in_use = capacity - sim.free[model]
            room = min(sim.free[model], pool - in_use)
            best, best_key, reclaimer = None, None, None
            for team, size, job in sim.heads(model):
                used, nominal = sim.used[(team, model)], sim.quotas.guarantee_of(team, model)
                within_nominal = used + size <= nominal
                if size <= room and (within_nominal or used + size <= sim.quotas.limit_of(team, model, capacity)):
                    key = (not within_nominal, job.submit, job.idx)
                    if best_key is None or key < best_key:
                        best, best_key = job, key
                elif within_nominal and (reclaimer is None or (job.submit, job.idx) < (reclaimer.submit,
                                                                                           reclaimer.idx)):
                    reclaimer = job
            if best is not None:
                sim.start(best)
                continue
            # a borrower's workload may go while its queue still borrows (holds more than its nominal quota)
            if reclaimer is None or not self.reclaim or not sim.evict_for(
                    reclaimer, room, lambda team, held, _: held > sim.quotas.guarantee_of(team, model)):
                return
