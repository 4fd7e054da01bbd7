"""Slurm-like: GrpTRES limits, multifactor priority with fair share, and backfill.

Rules, and where Slurm has them (SchedMD/slurm; ../shared/docs/schedulers/slurm.md):
- A team's jobs may hold at most its limit of a model's GPUs (`GrpTRES=gres/gpu:<type>=N`, enforced with
  AccountingStorageEnforce=limits): a job that would go over waits with reason AssocGrpGRES and blocks nobody
  (src/slurmctld/job_scheduler.c skips it). Slurm has no guarantee: a plan's guarantees change nothing here.
- Priority = PriorityWeightFairshare x F + PriorityWeightAge x min(age / PriorityMaxAge, 1) (priority_multifactor.c),
  F the classic factor 2^(-U/S): U the team's usage decayed with PriorityDecayHalfLife over the cluster's, S its
  share over all shares; F is recomputed every PriorityCalcPeriod, as slurmctld does. Ties go to the older job.
- The highest-priority job that does not fit gets a reservation at the earliest time enough GPUs free up (its
  shadow time, from running jobs' run times); lower-priority jobs start in front of it only if they fit now and end
  before the shadow time or fit in the GPUs left over at that time (EASY backfill; sched/backfill). Jobs are taken
  as running for their recorded run time, as if their time limits were exact; the scan looks at the oldest job of
  each team and size, at most `backfill_depth` jobs a pass (bf_max_job_test).
- A submitted job is tried at once (schedule on submit); GPUs freed by a job's end go to waiting jobs at the next
  scheduling pass, `slurm_pass_delay_s` later (slurmctld's background loop looks each second whether a pass is due;
  measured on the real slurmctld of tests/test_slurm_scale.py: about a second per start, which over a chain of
  starts in a busy queue adds up).
"""
from __future__ import annotations

from gpuledger.analytics.config import WhatIfConfig
from gpuledger.policies.whatif.engine import Simulation


class SlurmLike:
    name = "slurm"

    def __init__(self, settings: WhatIfConfig) -> None:
        self.settings = settings
        self.pass_delay_s = settings.slurm_pass_delay_s
        self._factors: dict[str, float] = {}
        self._calculated = -float("inf")

    def factors(self, sim: Simulation) -> dict[str, float]:
        if sim.now - self._calculated >= self.settings.slurm_calc_period_s or not self._factors:
            # sorted, so the float sums (and so ties between factors) do not depend on the hash seed
            teams = sorted(set(sim.usage) | {t for jobs in sim.waiting.values() for t, _ in jobs})
            total_usage = sum(sim.usage[t] for t in sorted(sim.usage))
            total_share = sum(sim.quotas.share_of(t) for t in teams) or 1.0
            self._factors = {t: (2.0 ** (-(sim.usage[t] / total_usage) / (sim.quotas.share_of(t) / total_share))
                                 if total_usage > 0 and sim.quotas.share_of(t) > 0 else 1.0) for t in teams}
            self._calculated = sim.now
        return self._factors

    def schedule(self, sim: Simulation, model: str) -> None:
        if sim.free[model] <= 0 or not sim.waiting[model]:
            return
        s = self.settings
        factors, max_age = self.factors(sim), s.slurm_max_age_days * 86400.0
        capacity = sim.capacity[model]
        passed: set[tuple[str, int]] = set()  # queues this pass is done with
        shadow, extra, looked = None, 0, 0
        while sim.free[model] > 0 and looked < s.backfill_depth:
            best, best_key = None, None
            for team, size, job in sim.heads(model):
                if (team, size) in passed:
                    continue
                if sim.used[(team, model)] + size > sim.quotas.limit_of(team, model, capacity):
                    passed.add((team, size))  # over its GrpTRES: waits, blocks nobody
                    continue
                age = min(max(sim.now - job.submit, 0.0) / max_age, 1.0)
                key = (s.slurm_fairshare_weight * factors.get(team, 1.0) + s.slurm_age_weight * age,
                       -job.submit, -job.idx)
                if best_key is None or key > best_key:
                    best, best_key = job, key
            if best is None:
                return
            looked += 1
            if shadow is None:
                if best.gpus <= sim.free[model]:
                    sim.start(best)
                else:  # the top job waits for GPUs: it gets the reservation
                    shadow, extra = sim.shadow(model, best.gpus)
                    passed.add((best.team, best.gpus))
                continue
            if best.gpus <= sim.free[model] and (sim.now + best.run <= shadow or best.gpus <= extra):
                if sim.now + best.run > shadow:
                    extra -= best.gpus
                sim.start(best)
            else:
                passed.add((best.team, best.gpus))
