"""FGD: place a task where the cluster's fragmentation grows least (Weng et al., USENIX ATC '23).

Each feasible node (for a shared GPU, each GPU of it that fits) is scored by how its fragmentation for the target
workload changes, mapped as the authors' scheduler plugin maps it, int(100 * sigmoid(-ΔF / 1000)): a node whose
fragmentation does not change scores 50, and changes under a few hundredths of a GPU fall on the same integer, where
the lowest node name wins. That rounding is part of the policy's measured results, so it is kept.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuledger.analytics.fragmentation import MILLI, fragmentation
from gpuledger.policies.placers.base import ClusterState, Placement, Task, least_room_slots


def _scores(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    return np.floor(100.0 / (1.0 + np.exp(-(before - after) / MILLI)))


def _frag_of(state: ClusterState, rows: np.ndarray, gpu: np.ndarray, cpu: np.ndarray) -> np.ndarray:
    """F_n(M) of candidate states, computed once per distinct state (nodes of one model, CPU and GPU layout are
    alike, and the measure does not depend on the order of a node's GPUs)."""
    key = np.ascontiguousarray(np.column_stack([state.model_id[rows], cpu, np.sort(gpu, axis=1)]), dtype=np.int32)
    rows_as_bytes = key.view(np.dtype((np.void, key.dtype.itemsize * key.shape[1]))).ravel()  # 6x np.unique(axis=0)
    _, first, inverse = np.unique(rows_as_bytes, return_index=True, return_inverse=True)
    values = fragmentation(gpu[first], cpu[first], state.model[rows[first]], state.workload,
                           state.access[rows[first]])
    return values[inverse.reshape(-1)]


@dataclass(frozen=True)
class Candidates:
    """Every placement FGD considered for a task, best first: node rows, the score and the node's fragmentation
    (milli-GPU) before and after; `slots(i)` the GPU slots of the i-th."""
    state: ClusterState
    task: Task
    nodes: np.ndarray
    shared_slot: np.ndarray | None  # the GPU of each candidate, for a shared-GPU task
    score: np.ndarray
    before: np.ndarray
    after: np.ndarray

    def slots(self, i: int) -> tuple[int, ...]:
        if self.shared_slot is not None:
            return (int(self.shared_slot[i]),)
        return tuple(int(s) for s in least_room_slots(self.state.gpu_free[self.nodes[i]], self.task.shape))


def rank(state: ClusterState, task: Task) -> Candidates:
    """Score every place the task could go: each feasible node, and for a shared GPU each GPU of it that fits;
    best first, ties to the lowest node name and then the lowest GPU."""
    rows = np.nonzero(state.feasible(task))[0]
    shape = task.shape
    shared = None
    if shape.gpus == 1 and shape.gpu_milli < MILLI:
        cand_row, shared = np.nonzero(state.gpu_free[rows] >= shape.gpu_milli)  # nodes, then GPUs, ascending
        nodes = rows[cand_row]
        gpu, cpu = state.after(nodes, task, shared)
    else:
        nodes = rows
        gpu, cpu = state.after(rows, task)
    after = _frag_of(state, nodes, gpu, cpu) if len(nodes) else np.zeros(0)
    before = state.frag[nodes]
    score = _scores(before, after)
    order = np.argsort(-score, kind="stable")  # candidates are in (node, GPU) order: stable keeps ties lowest
    return Candidates(state, task, nodes[order], None if shared is None else shared[order], score[order],
                      before[order], after[order])


class FgdPlacer:
    name = "fgd"

    def place(self, state: ClusterState, task: Task) -> Placement | None:
        ranked = rank(state, task)
        if not len(ranked.nodes):
            return None
        return Placement(int(ranked.nodes[0]), ranked.slots(0))
