"""FGD: place a task where the cluster's fragmentation grows least (Weng et al., USENIX ATC '23).

Each feasible node (for a shared GPU, each GPU of it that fits) is scored by how its fragmentation for the target
workload changes, mapped as the authors' scheduler plugin maps it, int(100 * sigmoid(-ΔF / 1000)): a node whose
fragmentation does not change scores 50, and changes under a few hundredths of a GPU fall on the same integer, where
the lowest node name wins. That rounding is part of the policy's measured results, so it is kept.
"""
from __future__ import annotations

import numpy as np

from gpuledger.analytics.fragmentation import MILLI, fragmentation
from gpuledger.policies.placers.base import ClusterState, Placement, Task, least_room_slots, lowest_best


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


class FgdPlacer:
    name = "fgd"

    def place(self, state: ClusterState, task: Task) -> Placement | None:
        rows = np.nonzero(state.feasible(task))[0]
        if not len(rows):
            return None
        shape = task.shape
        if shape.gpus == 1 and shape.gpu_milli < MILLI:  # a shared GPU: every GPU that fits is a candidate
            free = state.gpu_free[rows]
            cand_row, cand_slot = np.nonzero(free >= shape.gpu_milli)  # row-major: nodes, then slots, ascending
            nodes = rows[cand_row]
            gpu, cpu = state.after(nodes, task, cand_slot)
            score = _scores(state.frag[nodes], _frag_of(state, nodes, gpu, cpu))
            best = score.max()
            pick = int(np.nonzero(score == best)[0][0])  # lowest node, then lowest GPU, among the best
            return Placement(int(nodes[pick]), (int(cand_slot[pick]),))
        gpu, cpu = state.after(rows, task)
        score = _scores(state.frag[rows], _frag_of(state, rows, gpu, cpu))
        node = lowest_best(score, rows)
        return Placement(node, tuple(int(i) for i in least_room_slots(state.gpu_free[node], shape)))
