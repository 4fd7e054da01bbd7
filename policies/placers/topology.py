"""Topology-aware ranking: keep a multi-GPU task inside one NVLink island.

Why on top of the placers and not inside them: FGD and best fit score nodes by what a placement leaves free, and
take a node's first free GPUs; neither knows that GPUs 4-7 and 8-11 of a node are on different NVSwitch boards, so
an 8-GPU job lands across two islands and runs its all-reduce over PCIe. Here every candidate the placer ranked is
given the GPUs of the one island that holds the task with the least room to spare (best fit among islands, lowest
island on ties), and candidates are ordered: inside one island first, then nodes whose topology is unknown, then
those that can only split the task; the placer's order is kept within each group.

A task of one GPU, or a part of one, fits any island: the order is the placer's. The placement what-if replays
through IslandKeeper, the same rule for a placer that gives one choice.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuledger.analytics.fragmentation import MILLI, TaskShape
from gpuledger.collector.topology import UNKNOWN_ISLAND
from gpuledger.policies.placers.base import ClusterState, Placement, Placer, Task, least_room_slots



@dataclass(frozen=True)
class TopoCandidate:
    rank: int  # the candidate's place in the placer's ranking
    node: int  # row in the cluster state
    slots: tuple[int, ...]
    within: bool | None  # inside one island; None: the node's topology is unknown
    island: int | None  # the island taken, when within


def island_slots(free: np.ndarray, islands: np.ndarray, shape: TaskShape) -> tuple[tuple[int, ...], int] | None:
    """The slots of the island that holds the task with the fewest fitting GPUs to spare (lowest island on ties),
    least room first within it; None when no island holds it."""
    fits = free >= shape.gpu_milli
    best: tuple[int, int, np.ndarray] | None = None
    for island in np.unique(islands[islands != UNKNOWN_ISLAND]):
        members = np.nonzero((islands == island) & fits)[0]
        if len(members) >= shape.gpus and (best is None or len(members) - shape.gpus < best[0]):
            best = (len(members) - shape.gpus, int(island), members)
    if best is None:
        return None
    inside = least_room_slots(free[best[2]], shape)
    return tuple(int(best[2][i]) for i in inside), best[1]


def keep_within_islands(state: ClusterState, shape: TaskShape, nodes: np.ndarray, slots: list[tuple[int, ...]],
                        islands: list[np.ndarray], rank_by_islands: bool = True) -> list[TopoCandidate]:
    """The placer's candidates (`nodes`, best first, with the slots it chose) re-ordered so that those keeping the
    task inside one island come first, on that island's GPUs. `islands`: per node row, each GPU slot's island
    (UNKNOWN_ISLAND: no topology). `rank_by_islands` False: the placer's order and GPUs, each said to be inside one
    island or not."""
    whole = whole_multi_gpu(shape)
    out = []
    for rank, (node, chosen) in enumerate(zip(nodes, slots)):
        node = int(node)
        where = islands[node][:state.gpu_free.shape[1]]
        if (where[:int(state.gpu_count[node])] == UNKNOWN_ISLAND).any():
            out.append(TopoCandidate(rank, node, chosen, None, None))
            continue
        taken = {int(where[s]) for s in chosen}
        if not whole or not rank_by_islands:
            out.append(TopoCandidate(rank, node, chosen, len(taken) == 1, taken.pop() if len(taken) == 1 else None))
            continue
        found = island_slots(state.gpu_free[node], where, shape)
        if found is None:
            out.append(TopoCandidate(rank, node, chosen, False, None))
        else:
            out.append(TopoCandidate(rank, node, found[0], True, found[1]))
    if not rank_by_islands:
        return out
    order = {True: 0, None: 1, False: 2}
    return sorted(out, key=lambda c: (order[c.within], c.rank))


def whole_multi_gpu(shape: TaskShape) -> bool:
    """A task of several whole GPUs: the kind an island matters to."""
    return shape.gpus > 1 and shape.gpu_milli == MILLI


def spans_islands(islands: np.ndarray, slots: tuple[int, ...]) -> bool | None:
    """Whether the slots lie in more than one island; None when any of them has no topology."""
    taken = {int(islands[s]) for s in slots}
    return None if UNKNOWN_ISLAND in taken else len(taken) > 1


@dataclass
class IslandKeeper:
    """A placer whose multi-GPU tasks are kept inside one NVLink island, for the placement what-if (the API ranks
    the placer's candidates instead, keep_within_islands, which needs FGD's full ranking). The placer chooses;
    when its GPUs span islands, the task takes the best-fitting island of that node, else the best-fitting island
    of the feasible node with the fewest fitting GPUs to spare that has one holding it (lowest node on ties), else
    it is split as the placer chose. A node of unknown topology keeps the placer's choice."""
    placer: Placer
    islands: list[np.ndarray]  # per node row, each GPU slot's island (UNKNOWN_ISLAND: no topology)

    @property
    def name(self) -> str:
        return self.placer.name

    def place(self, state: ClusterState, task: Task) -> Placement | None:
        choice = self.placer.place(state, task)
        if choice is None or not whole_multi_gpu(task.shape) or not spans_islands(self.islands[choice.node],
                                                                                  choice.slots):
            return choice
        found = island_slots(state.gpu_free[choice.node], self.islands[choice.node], task.shape)
        if found is not None:
            return Placement(choice.node, found[0])
        best: tuple[int, int, tuple[int, ...]] | None = None
        for node in np.nonzero(state.feasible(task))[0]:
            found = island_slots(state.gpu_free[node], self.islands[node], task.shape)
            if found is None:
                continue
            spare = int((state.gpu_free[node] >= task.shape.gpu_milli).sum()) - task.shape.gpus
            if best is None or spare < best[0]:
                best = (spare, int(node), found[0])
        return Placement(best[1], best[2]) if best else choice
