"""The simulated site's scheduler: a Kueue-like admission under the quotas the simulated site declares.

Why it exists: a what-if replays recorded jobs through a model of the scheduler under the quotas in force, and its
backtest compares that replay with what was measured. A demo history made by some other rule (first fit on any
node, no quotas) is one its configuration never produced, so its backtest could only say "wrong". The simulator's
jobs are therefore admitted the way the site it declares would admit them: one ClusterQueue per team in one cohort,
`nominalQuota` = the team's guarantee of the model, borrowing up to its limit while the cohort has unused quota,
BestEffortFIFO queues, workloads that need no borrowing before borrowers, then the oldest (Kueue's documented
entry ordering; ../shared/docs/schedulers/kueue.md). `reclaimWithinCohort` is Kueue's default, Never: nothing is
preempted, which the simulated site declares (SITE_RECLAIM) so a replay of its history runs under the same rule.

Placement after admission: a job takes GPUs of its model free now, on the node that fits it most tightly, else
spread over the nodes with most GPUs free (a multi-pod job); a node reserved from an instant on (the demo's
showcase) takes only jobs that end before it. This is the site's scheduler, written from Kueue's rules; gpuledger's
own model of Kueue (policies/whatif/kueue_like.py) is a separate reading of the same rules, so the backtest of a
replay against this history measures the model, not a copy of it.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

SITE_RECLAIM = "never"  # the simulated Kueue's reclaimWithinCohort (Kueue's default)


class Job(Protocol):
    team: str
    gpus: int
    submit: float
    start: float
    end: float
    node: int
    gpu_indices: tuple[int, ...]
    also_on: tuple[tuple[int, tuple[int, ...]], ...]
    want_model: str | None


@dataclass(frozen=True)
class SiteQuotas:
    """Per (team, GPU model): nominal quota (the guarantee) and limit; GPUs per model present."""
    nominal: dict[tuple[str, str], float]
    limit: dict[tuple[str, str], float]
    capacity: dict[str, int]

    def pool(self, model: str) -> float:
        """What the cohort can admit of a model: its queues' nominal quota, never more than the GPUs present."""
        return min(float(self.capacity.get(model, 0)),
                   sum(v for (_, m), v in self.nominal.items() if m == model))


@dataclass
class _Node:
    model: str
    free_at: np.ndarray  # per GPU: when it is free (epoch seconds)
    reserved_from: float  # from this instant the node is not the workload's (inf: never)


def admit(jobs: Sequence[Job], durations: Sequence[float], node_models: Sequence[str], node_gpus: Sequence[int],
          quotas: SiteQuotas, reserved_from: dict[int, float], until: float,
          on_start: Callable[[Job], None]) -> None:
    """Start each of `jobs` (its `want_model` set) when the simulated Kueue admits it and place it; set `start`,
    `end`, `node`, `gpu_indices`, `also_on`. A job not admitted by `until` keeps start = end = inf (pending).
    `on_start(job)` runs as each job starts (sizing its memory and utilisation)."""
    nodes = [_Node(m, np.zeros(n), reserved_from.get(i, math.inf)) for i, (m, n) in enumerate(zip(node_models,
                                                                                                   node_gpus))]
    for node in nodes:
        node.free_at[:] = -math.inf
    by_model: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        by_model.setdefault(node.model, []).append(i)
    events: list[tuple[float, int, int]] = []  # (time, 0 end / 1 arrival, job)
    for i, job in enumerate(jobs):
        job.start = job.end = math.inf
        job.node = -1
        heapq.heappush(events, (job.submit, 1, i))
    waiting: dict[str, list[int]] = {m: [] for m in by_model}
    used: dict[tuple[str, str], int] = {}
    in_use: dict[str, int] = {m: 0 for m in by_model}
    while events and events[0][0] < until:
        now = events[0][0]
        touched: set[str] = set()
        while events and events[0][0] == now:
            _, kind, i = heapq.heappop(events)
            job = jobs[i]
            model = job.want_model or ""
            if kind == 0:
                used[(job.team, model)] -= job.gpus
                in_use[model] -= job.gpus
            elif model in waiting:
                waiting[model].append(i)  # arrivals come in submission order: each list stays sorted
            touched.add(model)
        for model in touched & set(waiting):
            while True:
                pick = _next(jobs, durations, waiting[model], nodes, by_model[model], quotas, used, in_use[model],
                             model, now)
                if pick is None:
                    break
                i, gpus = pick
                job = jobs[i]
                waiting[model].remove(i)
                job.start, job.end = now, now + durations[i]
                _place(nodes, job, gpus)
                used[(job.team, model)] = used.get((job.team, model), 0) + job.gpus
                in_use[model] += job.gpus
                heapq.heappush(events, (job.end, 0, i))
                on_start(job)


def _next(jobs: Sequence[Job], durations: Sequence[float], queue: list[int], nodes: list[_Node],
          mine: list[int], quotas: SiteQuotas, used: dict[tuple[str, str], int], in_use: int, model: str,
          now: float) -> tuple[int, list[tuple[int, np.ndarray]]] | None:
    """The job the simulated Kueue starts next on `model`, and the GPUs it gets: the oldest that fits its queue's
    nominal quota, else the oldest that may borrow; None when none can start now."""
    capacity = float(quotas.capacity.get(model, 0))
    room = quotas.pool(model) - in_use
    borrower = None
    for i in queue:
        job = jobs[i]
        if job.gpus > room:
            continue
        held = used.get((job.team, model), 0)
        within = held + job.gpus <= quotas.nominal.get((job.team, model), 0.0) + 1e-9
        if not within and (borrower is not None
                           or held + job.gpus > quotas.limit.get((job.team, model), capacity) + 1e-9):
            continue
        gpus = _gpus_for(nodes, mine, job.gpus, now, now + durations[i])
        if gpus is None:
            continue
        if within:
            return i, gpus
        borrower = (i, gpus)
    return borrower


def _gpus_for(nodes: list[_Node], mine: list[int], gpus: int, now: float,
              ends: float) -> list[tuple[int, np.ndarray]] | None:
    """GPUs free now for a job ending at `ends`: all on the node it fits most tightly, else spread over the nodes
    with most free (most first); None when the model's usable free GPUs are too few."""
    free = []
    for n in mine:
        node = nodes[n]
        if ends > node.reserved_from:
            continue
        idle = np.flatnonzero(node.free_at <= now)
        if len(idle):
            free.append((n, idle))
    fitting = [(len(idle), n, idle) for n, idle in free if len(idle) >= gpus]
    if fitting:
        _, n, idle = min(fitting, key=lambda f: (f[0], f[1]))
        return [(n, idle[:gpus])]
    if sum(len(idle) for _, idle in free) < gpus:
        return None
    out, left = [], gpus
    for n, idle in sorted(free, key=lambda f: (-len(f[1]), f[0])):
        take = idle[:left]
        out.append((n, take))
        left -= len(take)
        if not left:
            break
    return out


def _place(nodes: list[_Node], job: Job, gpus: list[tuple[int, np.ndarray]]) -> None:
    """Give `job` the chosen GPUs until it ends: the first node is its node, the others `also_on`."""
    for n, idx in gpus:
        nodes[n].free_at[idx] = job.end
    (first, idx), *rest = gpus
    job.node, job.gpu_indices = first, tuple(int(g) for g in sorted(idx))
    job.also_on = tuple((n, tuple(int(g) for g in sorted(i))) for n, i in rest)
