"""A gang of pods kept inside one group of nodes: the multi-node NVLink clique (GB200 NVL72) or the rack that
`[topology] keep_within` names, so the job's collectives stay on NVLink or one switch instead of crossing the data
centre.

Why a group at a time: a pod placed on the best node of the whole cluster can leave the rest of the gang nowhere
inside the same clique. So each group whose nodes are known to be in it is tried whole: its pods are placed one
after another as the API places one task (FGD's ranking, then keep_within_islands: each pod inside one NVLink island
where a node has one that holds it), and the group that fits every pod while raising the cluster's fragmentation
least is chosen (the lowest group name on ties). Nodes whose clique or rack is unknown are in no group: unknown is
never taken as "together". For `island` and `node` scopes the whole cluster is one group.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuledger.analytics.fragmentation import TaskShape
from gpuledger.policies.placers.base import ClusterState, Placement, Task
from gpuledger.policies.placers.fgd import rank
from gpuledger.policies.placers.topology import TopoCandidate, keep_within_islands


@dataclass(frozen=True)
class GangPlan:
    group: str
    pods: list[TopoCandidate]  # where each pod goes (node row, GPU slots, island)
    fragmentation_added_milli: float  # the cluster's fragmented milli-GPU with the gang placed, less before
    groups_fitting: int  # groups that could take the whole gang


def _place_in(state: ClusterState, shape: TaskShape, pods: int, allowed: np.ndarray, islands: list[np.ndarray],
              rank_by_islands: bool) -> tuple[list[TopoCandidate], float] | None:
    """Every pod placed on the allowed nodes (and given back after): where each goes and the fragmentation it
    adds; None when one does not fit."""
    placed: list[tuple[Task, Placement, TopoCandidate]] = []
    before = float(state.frag.sum())
    try:
        for n in range(pods):
            task = Task(f"pod-{n}", shape, 0)
            ranked = rank(state, task)
            keep = np.nonzero(allowed[ranked.nodes])[0]
            if not len(keep):
                return None
            first = keep_within_islands(state, shape, ranked.nodes[keep], [ranked.slots(int(i)) for i in keep],
                                        islands, rank_by_islands)[0]
            where = Placement(first.node, first.slots)
            state.apply(task, where)
            placed.append((task, where, first))
        return [c for _, _, c in placed], float(state.frag.sum()) - before
    finally:
        for task, where, _ in reversed(placed):
            state.release(task, where)


def place_gang(state: ClusterState, shape: TaskShape, pods: int, groups: list[str | None],
               islands: list[np.ndarray], rank_by_islands: bool = True) -> GangPlan | None:
    """The group (per node row in `groups`; None: in none) that takes all `pods` with the least fragmentation
    added; None when no group can. The state is left as it was."""
    members: dict[str, list[int]] = {}
    for row, group in enumerate(groups):
        if group is not None:
            members.setdefault(group, []).append(row)
    best: tuple[tuple[float, str], list[TopoCandidate]] | None = None
    fitting = 0
    feasible = state.feasible(Task("pod", shape, 0))
    # pods each node could hold now: a group short of `pods` is skipped before any pod is ranked (a request for
    # hundreds of pods costs one count per group, not hundreds of rankings)
    room = np.where(feasible, (state.gpu_free >= shape.gpu_milli).sum(axis=1) // max(shape.gpus, 1), 0)
    for group in sorted(members):
        if int(room[members[group]].sum()) < pods:
            continue
        allowed = np.zeros(len(groups), dtype=bool)
        allowed[members[group]] = True
        found = _place_in(state, shape, pods, allowed, islands, rank_by_islands)
        if found is None:
            continue
        fitting += 1
        if best is None or (found[1], group) < best[0]:
            best = ((found[1], group), found[0])
    if best is None:
        return None
    return GangPlan(best[0][1], best[1], best[0][0], fitting)
