"""Best fit: the node that the task leaves with the least CPU and GPU (each weighted a half, over the largest node
spec: 128 CPUs, 8 GPUs), scored and min-max normalised to integers as the scheduler framework does; a shared task
goes on the fitting GPU with the least room."""
from __future__ import annotations

import numpy as np

from gpuledger.policies.placers.base import ClusterState, ScoredPlacer, Task

MAX_CPU_MILLI, MAX_GPU_MILLI = 128_000, 8_000


def normalise(raw: np.ndarray) -> np.ndarray:
    """The framework's score normalisation: integers to 0..100 over the lowest and highest (all 0 when equal)."""
    lo, hi = raw.min(), raw.max()
    return np.zeros_like(raw) if hi == lo else (raw - lo) * 100 // (hi - lo)


class BestFitPlacer(ScoredPlacer):
    name = "bestfit"

    def scores(self, state: ClusterState, task: Task, rows: np.ndarray) -> np.ndarray:
        shape = task.shape
        left = ((state.cpu_free[rows] - shape.cpu_milli) / MAX_CPU_MILLI * 0.5
                + (state.gpu_free[rows].sum(axis=1) - shape.total_gpu_milli) / MAX_GPU_MILLI * 0.5)
        return normalise(np.trunc((1.0 - left) * 100).astype(np.int64))
