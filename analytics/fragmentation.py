"""GPU fragmentation as FGD measures it (Weng et al., USENIX ATC '23): the idle GPU a typical task cannot use.

Why this measure: "idle GPUs" over-states what a cluster can still run. A GPU with 300 milli left is idle capacity
that no task asking 500 milli can use, and a node with four free GPUs but no free CPU runs nothing. FGD weighs,
for each node, its idle GPU that each task shape of the workload could not use, by how common the shape is.

Definitions (../shared/docs/schedulers/fgd.md, from the authors' simulator):
- A task shape m asks CPU c_m (milli), k_m GPUs of d_m milli each (d_m < 1000 only for a shared single GPU), maybe
  on some GPU models only. A CPU-only shape has d_m = 0.
- F_n(m), the part of node n's idle GPU that m cannot use: when m fits on n (model allowed, k_m GPUs with at least
  d_m milli left, CPU left), the idle milli of the GPUs with less than d_m left; otherwise, and for CPU-only
  shapes, all of n's idle GPU milli.
- The target workload M is the most common shapes covering 95% of tasks, with popularity p_m renormalised over them.
  F_n(M) = Σ p_m F_n(m); the cluster's is the sum over nodes.

Everything is in milli-GPU and vectorised over nodes (and over candidate placements, for the FGD placer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

MILLI = 1000  # one whole GPU
DEFAULT_COVERAGE = 0.95  # the shapes kept cover this share of tasks (the authors' experiments)


@dataclass(frozen=True)
class TaskShape:
    """What a task asks, as far as fragmentation is concerned (memory is not part of FGD's measure)."""
    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for a CPU-only task
    gpus: int
    models: frozenset[str] = frozenset()  # allowed GPU models; empty: any

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.gpus


@dataclass(frozen=True)
class Workload:
    """The target workload: task shapes and how common each is (sums to 1)."""
    shapes: tuple[TaskShape, ...]
    popularity: tuple[float, ...]

    @staticmethod
    def typical(tasks: Iterable[TaskShape], coverage: float = DEFAULT_COVERAGE) -> "Workload":
        """The most common shapes, in decreasing count (ties: first seen first), until they cover `coverage` of
        the tasks; the shape that crosses the line is kept."""
        counts: dict[TaskShape, int] = {}
        for task in tasks:
            counts[task] = counts.get(task, 0) + 1
        if not counts:
            raise ValueError("no tasks to derive a target workload from")
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])  # stable: ties keep first-seen order
        kept, covered = [], 0
        for shape, count in ranked:
            if covered >= coverage * total:
                break
            kept.append((shape, count))
            covered += count
        return Workload(tuple(s for s, _ in kept), tuple(c / covered for _, c in kept))


@dataclass
class NodeArrays:
    """Free resources of a set of nodes, one row each: what the measure and the placers work on.

    `gpu_free` has one column per GPU slot (the widest node's count); slots a node does not have hold 0, which no
    GPU task fits and which adds nothing to idle sums."""
    names: list[str]
    model: np.ndarray  # (N,) GPU model name per node ("" for a CPU-only node)
    cpu_free: np.ndarray  # (N,) milli-CPU
    mem_free: np.ndarray  # (N,) MiB
    gpu_free: np.ndarray  # (N, G) milli-GPU per slot
    gpu_count: np.ndarray  # (N,) GPUs the node has
    cpu_total: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.cpu_total is None:
            self.cpu_total = self.cpu_free.copy()


def _access(models: np.ndarray, shapes: Sequence[TaskShape]) -> np.ndarray:
    """(N, M): whether each node's GPU model is allowed for each shape."""
    out = np.ones((len(models), len(shapes)), dtype=bool)
    for j, shape in enumerate(shapes):
        if shape.models:
            out[:, j] = np.isin(models, list(shape.models))
    return out


def fragmentation(gpu_free: np.ndarray, cpu_free: np.ndarray, models: np.ndarray, workload: Workload,
                  access: np.ndarray | None = None) -> np.ndarray:
    """F_n(M) in milli-GPU for each row (a node, or a node as a placement would leave it). `access` (rows x
    shapes) may be passed when the same nodes are measured often."""
    shapes = workload.shapes
    demand = np.array([s.gpu_milli for s in shapes], dtype=np.int64)  # (M,)
    count = np.array([s.gpus for s in shapes], dtype=np.int64)
    cpu = np.array([s.cpu_milli for s in shapes], dtype=np.int64)
    p = np.asarray(workload.popularity, dtype=float)
    if access is None:
        access = _access(models, shapes)
    free = gpu_free[:, None, :]  # (N, 1, G)
    enough = free >= demand[None, :, None]  # (N, M, G)
    idle = gpu_free.sum(axis=1)  # (N,)
    too_small = np.where(enough, 0, free).sum(axis=2)  # (N, M): idle milli of the GPUs too small for m
    fits = (access & (enough.sum(axis=2) >= count[None, :]) & (cpu_free[:, None] >= cpu[None, :])
            & (demand[None, :] > 0))
    per_shape = np.where(fits, too_small, idle[:, None])
    return per_shape @ p


@dataclass(frozen=True)
class FragReport:
    """The cluster's fragmentation: amount (milli-GPU), idle GPU, capacity, and the shares an admin reads."""
    frag_milli: float
    idle_milli: float
    capacity_milli: float

    @property
    def share_of_capacity(self) -> float:
        return self.frag_milli / self.capacity_milli if self.capacity_milli else 0.0

    @property
    def share_of_idle(self) -> float:
        return self.frag_milli / self.idle_milli if self.idle_milli else 0.0


def cluster_fragmentation(nodes: NodeArrays, workload: Workload) -> tuple[np.ndarray, FragReport]:
    """Per-node F_n(M) and the cluster's report."""
    per_node = fragmentation(nodes.gpu_free, nodes.cpu_free, nodes.model, workload)
    capacity = float(nodes.gpu_count.sum() * MILLI)
    return per_node, FragReport(float(per_node.sum()), float(nodes.gpu_free.sum()), capacity)


__all__ = ["MILLI", "TaskShape", "Workload", "NodeArrays", "fragmentation", "cluster_fragmentation", "FragReport"]
