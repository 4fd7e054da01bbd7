"""What every placer works on: the cluster's free resources, a task, a placement, and which nodes can take it.

A placer answers "where should this task go?" for the replay of a trace and for the placement API alike, so each
policy is one file behind `Placer` and sees the same state. Nodes are kept sorted by name: every policy breaks
ties towards the lowest name, as the authors' simulator does (without it FGD loses about 5 points).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gpuledger.analytics.fragmentation import MILLI, NodeArrays, TaskShape, Workload, _access, fragmentation

# Kubernetes' defaults for a container that requests nothing (the scheduler counts these)
DEFAULT_CPU_MILLI = 100
DEFAULT_MEM_MIB = 200


@dataclass(frozen=True)
class Task:
    name: str
    shape: TaskShape
    mem_mib: int


@dataclass(frozen=True)
class Placement:
    node: int  # row in the cluster state
    slots: tuple[int, ...]  # GPU slots used (empty for a CPU-only task)


class ClusterState:
    """Free resources per node, changed by placing tasks, with each node's fragmentation for the target workload
    kept up to date (the FGD placer scores by its change, and the replay reports it)."""

    def __init__(self, nodes: NodeArrays, workload: Workload) -> None:
        order = np.argsort(np.asarray(nodes.names, dtype=object), kind="stable")
        self.names = [nodes.names[i] for i in order]
        self.model = nodes.model[order]
        self.cpu_free = nodes.cpu_free[order].astype(np.int64)
        self.mem_free = nodes.mem_free[order].astype(np.int64)
        self.gpu_free = nodes.gpu_free[order].astype(np.int64)
        self.gpu_count = nodes.gpu_count[order].astype(np.int64)
        self.gpu_ids = [nodes.gpu_ids[i] for i in order] if nodes.gpu_ids is not None else None
        self.model_id = np.unique(self.model, return_inverse=True)[1].reshape(-1)  # models as small integers
        self.workload = workload
        self.access = _access(self.model, workload.shapes)  # (N, M), fixed: models do not change
        self.frag = fragmentation(self.gpu_free, self.cpu_free, self.model, workload, self.access)
        self.capacity_milli = int(self.gpu_count.sum() * MILLI)
        self.allocated_milli = 0

    @property
    def frag_milli(self) -> float:
        return float(self.frag.sum())

    def feasible(self, task: Task) -> np.ndarray:
        """Nodes that can take the task now: CPU and memory left, an allowed GPU model, enough GPUs with enough
        left (what the scheduler's filters check)."""
        shape = task.shape
        ok = (self.cpu_free >= shape.cpu_milli) & (self.mem_free >= task.mem_mib)
        if shape.gpus:
            if shape.models:
                ok &= np.isin(self.model, list(shape.models))
            ok &= (self.gpu_free >= shape.gpu_milli).sum(axis=1) >= shape.gpus
        return ok

    def after(self, rows: np.ndarray, task: Task, slots: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(gpu_free, cpu_free) of `rows` as placing the task would leave them: on the given slot of each row (a
        shared GPU), else on the GPUs with the least room that still fit (what the scheduler's bookkeeping does)."""
        gpu = self.gpu_free[rows].copy()
        cpu = self.cpu_free[rows] - task.shape.cpu_milli
        shape = task.shape
        if not shape.gpus:
            return gpu, cpu
        if slots is not None:
            gpu[np.arange(len(rows)), slots] -= shape.gpu_milli
            return gpu, cpu
        # per row, the GPUs that fit with the least room first (feasible rows have at least `gpus` of them)
        room = np.where(gpu >= shape.gpu_milli, gpu, np.iinfo(np.int64).max)
        take = np.argsort(room, axis=1, kind="stable")[:, :shape.gpus]
        gpu[np.arange(len(rows))[:, None], take] -= shape.gpu_milli
        return gpu, cpu

    def apply(self, task: Task, placement: Placement) -> None:
        n, shape = placement.node, task.shape
        self.cpu_free[n] -= shape.cpu_milli
        self.mem_free[n] -= task.mem_mib
        for slot in placement.slots:
            self.gpu_free[n, slot] -= shape.gpu_milli
        self.allocated_milli += shape.total_gpu_milli
        self._refresh(n)

    def release(self, task: Task, placement: Placement) -> None:
        """A placed task leaves: its node gets back what it held."""
        n, shape = placement.node, task.shape
        self.cpu_free[n] += shape.cpu_milli
        self.mem_free[n] += task.mem_mib
        for slot in placement.slots:
            self.gpu_free[n, slot] += shape.gpu_milli
        self.allocated_milli -= shape.total_gpu_milli
        self._refresh(n)

    def _refresh(self, n: int) -> None:
        self.frag[n] = fragmentation(self.gpu_free[n:n + 1], self.cpu_free[n:n + 1], self.model[n:n + 1],
                                     self.workload, self.access[n:n + 1])[0]


def least_room_slots(free: np.ndarray, shape: TaskShape) -> list[int]:
    """The GPU slots a task takes on one node: those that fit it with the least room left first (packing)."""
    fitting = [i for i in np.argsort(free, kind="stable") if free[i] >= shape.gpu_milli]
    return fitting[:shape.gpus]


def best_fit_slot(free: np.ndarray, shape: TaskShape) -> tuple[int, ...]:
    """A shared task's GPU: the one with the least room that fits it (lowest index on ties); whole GPUs: the
    first free ones."""
    if not shape.gpus:
        return ()
    if shape.gpus == 1 and shape.gpu_milli < MILLI:
        fitting = np.nonzero(free >= shape.gpu_milli)[0]
        return (int(fitting[np.argmin(free[fitting])]),)
    return tuple(int(i) for i in np.nonzero(free >= shape.gpu_milli)[0][:shape.gpus])


def lowest_best(scores: np.ndarray, rows: np.ndarray) -> int:
    """The row with the highest score; ties go to the lowest row (the lowest node name)."""
    best = scores.max()
    return int(rows[np.nonzero(scores == best)[0][0]])


class ScoredPlacer:
    """A policy that scores every feasible node at once: the best goes, ties to the lowest name; a shared task
    takes the fitting GPU with the least room."""
    name = "scored"

    def scores(self, state: ClusterState, task: Task, rows: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def place(self, state: ClusterState, task: Task) -> Placement | None:
        rows = np.nonzero(state.feasible(task))[0]
        if not len(rows):
            return None
        node = lowest_best(self.scores(state, task, rows), rows)
        return Placement(node, best_fit_slot(state.gpu_free[node], task.shape))


class Placer(Protocol):
    """A placement policy: where a task goes now, or None when no node can take it."""
    name: str

    def place(self, state: ClusterState, task: Task) -> Placement | None: ...
