"""Random: any node that can take the task, and for a shared GPU any GPU on it that fits, uniformly (seeded)."""
from __future__ import annotations

import numpy as np

from gpuledger.analytics.fragmentation import MILLI
from gpuledger.policies.placers.base import ClusterState, Placement, Task, best_fit_slot


class RandomPlacer:
    name = "random"

    def __init__(self, seed: int = 42) -> None:
        self.rng = np.random.default_rng(seed)

    def place(self, state: ClusterState, task: Task) -> Placement | None:
        rows = np.nonzero(state.feasible(task))[0]
        if not len(rows):
            return None
        node = int(self.rng.choice(rows))
        shape, free = task.shape, state.gpu_free[node]
        if shape.gpus == 1 and shape.gpu_milli < MILLI:
            return Placement(node, (int(self.rng.choice(np.nonzero(free >= shape.gpu_milli)[0])),))
        return Placement(node, best_fit_slot(free, shape))  # whole GPUs: the first free ones, as every policy
