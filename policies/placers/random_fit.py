"""Random: any node that can take the task, and for a shared GPU any GPU on it that fits, uniformly (seeded)."""
from __future__ import annotations

import numpy as np

from gpuledger.analytics.fragmentation import MILLI
from gpuledger.policies.placers.base import ClusterState, Placement, Task


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
        if not shape.gpus:
            return Placement(node, ())
        fitting = np.nonzero(free >= shape.gpu_milli)[0]
        if shape.gpus == 1 and shape.gpu_milli < MILLI:
            return Placement(node, (int(self.rng.choice(fitting)),))
        return Placement(node, tuple(int(i) for i in fitting[:shape.gpus]))
