"""Dot product (Tetris-style alignment): prefer the node whose free (CPU, GPU) vector, over the largest node spec,
is least aligned with the task's request, i.e. the smallest dot product; a shared task goes on the fitting GPU with
the least room. A baseline from the FGD paper's comparison; the scoring here is ours, so its figures are not the
paper's."""
from __future__ import annotations

import numpy as np

from gpuledger.policies.placers.base import ClusterState, ScoredPlacer, Task
from gpuledger.policies.placers.bestfit import MAX_CPU_MILLI, MAX_GPU_MILLI


class DotProductPlacer(ScoredPlacer):
    name = "dotprod"

    def scores(self, state: ClusterState, task: Task, rows: np.ndarray) -> np.ndarray:
        shape = task.shape
        dot = (state.cpu_free[rows] / MAX_CPU_MILLI * shape.cpu_milli / MAX_CPU_MILLI
               + state.gpu_free[rows].sum(axis=1) / MAX_GPU_MILLI * shape.total_gpu_milli / MAX_GPU_MILLI)
        return np.trunc(100 * (1 - dot / 2)).astype(np.int64)
