"""A gang of pods kept on one GPU model inside one group of nodes: the multi-node NVLink clique (GB200 NVL72) or the
rack that `[topology] keep_within` names, so the job's collectives stay on NVLink or one switch instead of crossing
the data centre.

Why one GPU model: a data-parallel job steps at its slowest rank, so a gang split over an H100 and an A100 runs every
pod at the A100's pace (and meets kernels built for another architecture, and another memory size). So the groups
tried are (group, GPU model) pairs, and a gang mixes models only when the request says it may (`mix_models`).

Why a group at a time: a pod placed on the best node of the whole cluster can leave the rest of the gang nowhere
inside the same clique. So each group whose nodes are known to be in it is tried whole: its pods are placed one
after another as the API places one task (FGD's ranking, then keep_within_islands: each pod inside one NVLink island
where a node has one that holds it), and the group that fits every pod while raising the cluster's fragmentation
least is chosen (the lowest group name, then model, on ties). Nodes whose clique or rack is unknown are in no group:
unknown is never taken as "together". For `island` and `node` scopes the whole cluster is one group (one per model).

Every group tried is reported with how many pods it could take now and why it was not chosen, so a gang that does
not fit says why rather than only that it does not.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuledger.analytics.fragmentation import MILLI, TaskShape
from gpuledger.policies.placers.base import ClusterState, Placement, Task
from gpuledger.policies.placers.fgd import rank
from gpuledger.policies.placers.topology import TopoCandidate, keep_within_islands


@dataclass(frozen=True)
class GroupTried:
    """One group the gang was tried in: its clique or rack (or "cluster") and, unless models may mix, its model."""
    group: str
    gpu_model: str | None  # None: every model of the group (mix_models)
    nodes: int  # nodes of the group (of an allowed model)
    gpus_free: int  # GPUs with room for one of a pod's GPUs
    pods_fit: int  # pods it could take now, each pod's GPUs on one node
    fits: bool  # every pod placed
    chosen: bool
    fragmentation_added_milli: float | None  # when it fits: the cluster's fragmented milli-GPU added
    reason: str  # why it was chosen or not, for an admin


@dataclass(frozen=True)
class GangPlan:
    group: str
    gpu_model: str | None  # the model of the group chosen; None when models may mix
    pods: list[TopoCandidate]  # where each pod goes (node row, GPU slots, island)
    fragmentation_added_milli: float  # the cluster's fragmented milli-GPU with the gang placed, less before
    groups_fitting: int  # groups that could take the whole gang


@dataclass(frozen=True)
class GangSearch:
    """What placing a gang found: the plan (None when no group takes every pod) and every group tried."""
    plan: GangPlan | None
    tried: list[GroupTried]
    mixed_would_fit: str | None  # models kept apart and nothing placed: a group with room for the gang mixed


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


def _short(room: int, pods: int, free: int, nodes: int, shape: TaskShape) -> str:
    """Why a group short of room cannot take the gang."""
    if not free:
        return f"no GPU free on its {nodes} node(s)"
    return (f"room for {room} of {pods} pods now: {free} GPU(s) free on {nodes} node(s), and each pod needs "
            f"{shape.gpus} GPU(s) on one node")


def place_gang(state: ClusterState, shape: TaskShape, pods: int, groups: list[str | None],
               islands: list[np.ndarray], rank_by_islands: bool = True, mix_models: bool = False) -> GangSearch:
    """The group (per node row in `groups`; None: in none) of one GPU model (any mix with `mix_models`) that takes
    all `pods` with the least fragmentation added, and every group tried with its reason. Only nodes of the
    shape's models (any, when it names none) are tried. The state is left as it was."""
    members: dict[tuple[str, str], list[int]] = {}
    for row, group in enumerate(groups):
        model = str(state.model[row])
        if group is None or (shape.models and model not in shape.models):
            continue
        members.setdefault((group, "" if mix_models else model), []).append(row)
    feasible = state.feasible(Task("pod", shape, 0))
    fitting_gpus = (state.gpu_free >= shape.gpu_milli).sum(axis=1)
    # pods each node could hold now: a group short of `pods` is skipped before any pod is ranked (a request for
    # hundreds of pods costs one count per group, not hundreds of rankings)
    room = np.where(feasible, fitting_gpus // max(shape.gpus, 1), 0)
    found: dict[tuple[str, str], tuple[list[TopoCandidate], float] | None] = {}
    for key in sorted(members):
        rows = members[key]
        if int(room[rows].sum()) < pods:
            continue
        allowed = np.zeros(len(groups), dtype=bool)
        allowed[rows] = True
        found[key] = _place_in(state, shape, pods, allowed, islands, rank_by_islands)
    fitting = {key: f for key, f in found.items() if f is not None}
    best = min(fitting, key=lambda k: (fitting[k][1], k)) if fitting else None
    tried = []
    for key in sorted(members):
        rows = members[key]
        pods_fit, free = int(room[rows].sum()), int(fitting_gpus[rows].sum())
        placed = fitting.get(key)
        if key == best:
            reason = f"chosen: takes all {pods} pods, adding the least fragmentation"
        elif placed is not None:
            reason = (f"takes all {pods} pods too, but adds {placed[1] / MILLI:.2f} fragmented GPUs against "
                      f"{fitting[best][1] / MILLI:.2f}" if placed[1] != fitting[best][1] else
                      f"takes all {pods} pods too, adding as much fragmentation: the lower name is chosen")
        elif key in found:
            reason = f"room for {pods_fit} pods counted, but they did not all fit when placed one after another"
        else:
            reason = _short(pods_fit, pods, free, len(rows), shape)
        tried.append(GroupTried(key[0], key[1] or None, len(rows), free, pods_fit, placed is not None,
                                key == best, None if placed is None else placed[1], reason))
    # best first, then those closest to taking the gang: what an admin reads first
    tried.sort(key=lambda t: (not t.chosen, not t.fits, -t.pods_fit, t.group, t.gpu_model or ""))
    if best is None:
        return GangSearch(None, tried, None if mix_models else _mixed_room(members, room, pods))
    plan = GangPlan(best[0], best[1] or None, fitting[best][0], fitting[best][1], len(fitting))
    return GangSearch(plan, tried, None)


def _mixed_room(members: dict[tuple[str, str], list[int]], room: np.ndarray, pods: int) -> str | None:
    """The first group (by name) whose nodes of all models together have room for every pod: a gang kept on one
    model that mixing would place (a pod's GPUs are on one node, so room counted per node is exact for whole
    GPUs)."""
    together: dict[str, int] = {}
    for (group, _), rows in members.items():
        together[group] = together.get(group, 0) + int(room[rows].sum())
    return next((g for g in sorted(together) if together[g] >= pods), None)

