"""The replay's clock: jobs arrive and end as events, and after each instant's events a scheduler model decides
what starts (and, where its scheduler preempts, what is evicted) on each GPU model's pool of GPUs.

Waiting jobs are kept per GPU model, team and GPU count, oldest first, so a scheduling pass looks at the oldest
waiting job of each (team, size) rather than at the whole queue: every model admits a team's jobs in submission
order (Kueue's BestEffortFIFO, KAI's and Slurm's age order within one fair-share factor), and a pass stays short
on a week of a 1,000-GPU cluster's jobs. GPUs are pooled per model: which node and GPU a job lands on is the
placement what-if's question, not this one's.

A preempted job loses the work it did (Kueue and KAI evict and requeue; nothing checkpoints in the record) and
waits again, first in its team's queue by its submission time. Each team's usage decays with the fair-share half
life, for the models that order by it.
"""
from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Protocol

from gpuledger.policies.whatif.workload import SimJob, Workload

END, ARRIVE, PASS = 0, 1, 2  # at one instant, ends free GPUs before arrivals are considered, then delayed passes


@dataclass(frozen=True)
class Quotas:
    """Per (team, GPU model): the guarantee and limit in GPUs; per team its share and its cohort."""
    guarantee: dict[tuple[str, str], float]
    limit: dict[tuple[str, str], float]
    share: dict[str, float]
    cohort: dict[str, str]

    def guarantee_of(self, team: str, model: str) -> float:
        return self.guarantee.get((team, model), 0.0)

    def limit_of(self, team: str, model: str, capacity: float) -> float:
        return self.limit.get((team, model), capacity)

    def share_of(self, team: str) -> float:
        return self.share.get(team, 1.0)


class SchedulerModel(Protocol):
    """What decides, after each instant's events, which waiting jobs of one GPU model start now. `pass_delay_s`:
    how long after a job's end the scheduler's next pass comes (0: at once). A submission is looked at at once
    either way (Slurm, Kueue and KAI all try a new job when it arrives); GPUs a job frees wait for the next pass,
    and over a chain of starts those delays add up."""
    name: str
    pass_delay_s: float

    def schedule(self, sim: "Simulation", model: str) -> None: ...


class Simulation:
    """One replay of a workload under one configuration. `run()` returns the jobs as they fared."""

    def __init__(self, workload: Workload, capacity: dict[str, int], quotas: Quotas, scheduler: SchedulerModel,
                 length_s: float, horizon_s: float, half_life_s: float, usage: dict[str, float] | None = None) -> None:
        self.jobs = [replace(j) for j in workload.jobs]  # each replay its own copies
        self.capacity = {**{j.model: 0 for j in self.jobs}, **capacity}  # a model retired: its jobs wait
        self.free = dict(self.capacity)
        self.quotas = quotas
        self.scheduler = scheduler
        self.length, self.horizon, self.half_life = length_s, horizon_s, half_life_s
        self.now = 0.0
        self.used: dict[tuple[str, str], int] = defaultdict(int)  # GPUs held per (team, model)
        self.running: dict[str, dict[int, SimJob]] = {m: {} for m in self.capacity}
        self.waiting: dict[str, dict[tuple[str, int], list]] = {m: {} for m in self.capacity}  # (submit, idx)
        self.usage: dict[str, float] = defaultdict(float, usage or {})  # decayed GPU-seconds per team
        self.holding: dict[str, int] = defaultdict(int)  # GPUs held per team, all models
        self._events: list[tuple[float, int, int, int]] = []
        self._last = 0.0

    # -- what a scheduler model reads and does
    def heads(self, model: str) -> Iterator[tuple[str, int, SimJob]]:
        """The oldest waiting job of each team and GPU count."""
        for (team, size), heap in self.waiting[model].items():
            if heap:
                yield team, size, self.jobs[heap[0][1]]

    def waiting_gpus(self, model: str) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for (team, size), heap in self.waiting[model].items():
            out[team] += size * len(heap)
        return out

    def start(self, job: SimJob) -> None:
        heapq.heappop(self.waiting[job.model][(job.team, job.gpus)])
        self._start(job)

    def preempt(self, job: SimJob) -> None:
        """Evict a running job: its GPUs are free now, its work is lost, and it waits again."""
        self._release(job)
        job.lost_gpu_s += job.gpus * (self.now - job.start)
        job.preemptions += 1
        job.start = None
        self._wait(job)

    def evict_for(self, job: SimJob, room: int, may_evict: Callable[[str, int, SimJob], bool]) -> bool:
        """Evict other teams' running jobs of `job`'s model, newest first, until `room` plus what they free fits
        it; `may_evict(team, held, victim)` says whether a victim may go while its team holds `held` GPUs (what
        this eviction leaves it). False, and nothing evicted, when the victims allowed do not free enough."""
        victims, freed, held = [], 0, {}
        for other in sorted(self.running[job.model].values(), key=lambda j: (-j.start, -j.idx)):
            if other.team == job.team:
                continue
            now = held.get(other.team, self.used[(other.team, job.model)])
            if not may_evict(other.team, now, other):
                continue
            victims.append(other)
            held[other.team] = now - other.gpus
            freed += other.gpus
            if room + freed >= job.gpus:
                for victim in victims:
                    self.preempt(victim)
                return True
        return False

    def shadow(self, model: str, gpus: int) -> tuple[float, int]:
        """When `gpus` GPUs of `model` are free at the earliest as running jobs end (their recorded run times), and
        how many more than that are free then: a backfill reservation."""
        free = self.free[model]
        for end, size in sorted((j.start + j.run, j.gpus) for j in self.running[model].values()):
            free += size
            if free >= gpus:
                return end, free - gpus
        return math.inf, 0

    # -- the clock
    def run(self) -> list[SimJob]:
        for job in self.jobs:
            if job.running_at_start:
                self._start(job)
            else:
                heapq.heappush(self._events, (max(job.submit, 0.0), ARRIVE, job.idx, 0))
        touched = set(self.capacity)
        delay = self.scheduler.pass_delay_s
        while True:
            for model in touched:
                self.scheduler.schedule(self, model)
            if not self._events or self._events[0][0] > self.horizon:
                break
            self._advance(self._events[0][0])
            touched = set()
            while self._events and self._events[0][0] == self.now:
                _, kind, idx, token = heapq.heappop(self._events)
                job = self.jobs[idx]
                if kind == ARRIVE:
                    self._wait(job)
                elif kind == PASS:
                    pass  # the pass an end asked for
                elif job.start is not None and token == job.preemptions:  # not an end a preemption cancelled
                    self._release(job)
                    job.end = self.now
                    if delay > 0:
                        heapq.heappush(self._events, (self.now + delay, PASS, idx, 0))
                        continue
                else:
                    continue
                touched.add(job.model)
        return self.jobs

    def _advance(self, t: float) -> None:
        dt = t - self._last
        if dt > 0:
            decay = 0.5 ** (dt / self.half_life) if self.half_life > 0 else 1.0
            for team in set(self.usage) | set(self.holding):
                self.usage[team] = self.usage[team] * decay + self.holding[team] * dt * (1.0 + decay) / 2.0
        self.now = self._last = t

    def _wait(self, job: SimJob) -> None:
        heapq.heappush(self.waiting[job.model].setdefault((job.team, job.gpus), []), (job.submit, job.idx))

    def _start(self, job: SimJob) -> None:
        job.start = self.now
        if job.first_start is None:
            job.first_start = self.now
        self.free[job.model] -= job.gpus
        self.used[(job.team, job.model)] += job.gpus
        self.holding[job.team] += job.gpus
        self.running[job.model][job.idx] = job
        heapq.heappush(self._events, (self.now + job.run, END, job.idx, job.preemptions))

    def _release(self, job: SimJob) -> None:
        self.free[job.model] += job.gpus
        self.used[(job.team, job.model)] -= job.gpus
        self.holding[job.team] -= job.gpus
        del self.running[job.model][job.idx]
        kept_from, kept_to = max(job.start, 0.0), min(self.now, self.length)
        job.served_gpu_s += job.gpus * max(0.0, kept_to - kept_from)
