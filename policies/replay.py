"""Replay a cluster trace through a placement policy, as the FGD paper evaluates policies (§6).

The trace's tasks arrive one by one in a seeded random order and are never deleted. The workload is inflated with
random copies of its own tasks until the GPU it asks reaches `inflation` (130%) of the cluster's capacity, so the
cluster runs full and the policies differ in how much of it they manage to allocate. After each arrival the
replay records the arrived load, the GPU allocated and the cluster's fragmentation (FGD's measure, for the target
workload of the original tasks), all as shares of GPU capacity; the table reports each at 10% steps of arrived
load, averaging the arrivals whose load rounds to the step (how the authors' analysis reads its logs).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from gpuledger.analytics.fragmentation import NodeArrays, Workload
from gpuledger.policies.placers import ClusterState, Task, make_placer

DEFAULT_INFLATION = 1.3


@dataclass
class ReplayResult:
    policy: str
    seed: int
    tasks: int  # arrived, after inflation
    placed: int
    capacity_gpus: float
    seconds: float
    # one row per arrival: arrived, allocated and fragmented GPU as percent of capacity
    arrived_pct: np.ndarray = field(repr=False)
    allocated_pct: np.ndarray = field(repr=False)
    frag_pct: np.ndarray = field(repr=False)

    def at(self, step_pct: int) -> tuple[float, float] | None:
        """(allocated %, fragmentation %) at an arrived-load step: the mean over arrivals whose load rounds to it
        (within one point when none does), None when the replay never got there."""
        rounded = np.round(self.arrived_pct)
        hit = rounded == step_pct
        if not hit.any():
            hit = np.abs(rounded - step_pct) <= 1
        if not hit.any():
            return None
        return float(self.allocated_pct[hit].mean()), float(self.frag_pct[hit].mean())

    @property
    def final_allocation_pct(self) -> float:
        return float(self.allocated_pct[-1]) if len(self.allocated_pct) else 0.0

    def table(self, steps: Sequence[int] = tuple(range(10, 131, 10))) -> list[dict[str, float]]:
        rows = []
        for step in steps:
            found = self.at(step)
            if found is not None:
                rows.append({"arrived_pct": step, "allocated_pct": round(found[0], 2),
                             "fragmentation_pct": round(found[1], 2)})
        return rows


def arrival_order(tasks: Sequence[Task], capacity_milli: int, inflation: float, seed: int) -> list[Task]:
    """The tasks shuffled (from name order) with `seed`, then random copies of them appended while the total GPU
    asked stays within `inflation` of capacity."""
    rng = np.random.default_rng(seed)
    order = [tasks[i] for i in rng.permutation(len(tasks))]
    asked = sum(t.shape.total_gpu_milli for t in order)
    target = inflation * capacity_milli
    while True:
        copy = tasks[int(rng.integers(len(tasks)))]
        if asked + copy.shape.total_gpu_milli > target:
            break
        order.append(copy)
        asked += copy.shape.total_gpu_milli
    return order


def replay(nodes: NodeArrays, tasks: Sequence[Task], policy: str, seed: int = 42,
           inflation: float = DEFAULT_INFLATION, coverage: float = 0.95,
           progress: Callable[[int, int], None] | None = None) -> ReplayResult:
    """Place every task of the inflated trace with `policy`; `progress(done, total)` is called as it goes."""
    workload = Workload.typical((t.shape for t in tasks), coverage)
    state = ClusterState(nodes, workload)
    placer = make_placer(policy, seed)
    order = arrival_order(tasks, state.capacity_milli, inflation, seed)
    capacity = state.capacity_milli
    arrived = np.empty(len(order))
    allocated = np.empty(len(order))
    frag = np.empty(len(order))
    asked, placed, began = 0, 0, time.perf_counter()
    frag_total = state.frag_milli
    for i, task in enumerate(order):
        asked += task.shape.total_gpu_milli
        where = placer.place(state, task)
        if where is not None:
            before = state.frag[where.node]
            state.apply(task, where)
            frag_total += state.frag[where.node] - before
            placed += 1
        arrived[i] = 100.0 * asked / capacity
        allocated[i] = 100.0 * state.allocated_milli / capacity
        frag[i] = 100.0 * frag_total / capacity
        if progress and (i % 100 == 0 or i == len(order) - 1):
            progress(i + 1, len(order))
    return ReplayResult(policy, seed, len(order), placed, capacity / 1000.0, time.perf_counter() - began,
                        arrived, allocated, frag)


__all__ = ["replay", "ReplayResult", "arrival_order", "DEFAULT_INFLATION"]
