"""Fragmentation of the cluster (FGD's measure) and placement advice a scheduler extender or plugin can call.

The state is each node's newest samples: which GPUs (and which parts of them) jobs hold. The target workload is the
shapes of the jobs of the window. GPU telemetry does not see CPU or memory, so only GPUs constrain a placement here;
a scheduler applies its own CPU and memory filters to the nodes it gets back.
"""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter

from gpuledger.analytics import fragmentation as frag
from gpuledger.analytics.config import Config
from gpuledger.analytics.records import records
from gpuledger.analytics.store import Store
from gpuledger.collector.errors import InputError
from gpuledger.collector.gpu_catalog import mig_fraction, models_with_profile
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.analytics import topology as topo
from gpuledger.deploy.api.deps import CaughtUp, ConfigDep, Days, End, StoreDep, window
from gpuledger.deploy.api.models import Fragmentation, PlacementAnswer, PlacementRequest
from gpuledger.policies.placers import ClusterState, Task
from gpuledger.policies.emitters.topology import podset_annotations
from gpuledger.policies.placers.fgd import rank
from gpuledger.policies.placers.gang import GangSearch, place_gang
from gpuledger.policies.model_names import ModelNames
from gpuledger.policies.placers.topology import keep_within_islands

router = APIRouter(tags=["placement"], dependencies=[CaughtUp])  # deps.caught_up


@router.get("/v1/fragmentation", response_model=Fragmentation)
def fragmentation(caller: ReadCaller, store: StoreDep, days: float = Days, end: datetime | None = End) -> dict:
    """How much idle GPU the typical job of the window cannot use, per node and in all, what it costs per day at
    the rate card, and its recorded history over the window."""
    start, stop, _ = window(days, end)
    at, nodes, workload = frag.current_state(store, end, days)
    hist = records(frag.history(store, start, stop))
    empty = {"at": at, "workload": [], "gpus": float(nodes.gpu_count.sum()), "idle_gpus": 0.0,
             "fragmented_gpus": 0.0, "fragmented_share_of_idle": 0.0, "fragmented_share_of_capacity": 0.0,
             "stranded_usd_per_day": 0.0, "nodes": [], "history": hist, "enough_data": False}
    if not nodes.names:
        return {**empty, "reason": "no node has reported in the last 10 minutes"}
    if workload is None:
        return {**empty, "reason": f"no job held a GPU in the last {days:g} day(s): no workload to measure against"}
    per_node = frag.node_report(nodes, workload)
    rates = store.current_rates()
    per_node["stranded_usd_per_day"] = [g * rates[m] * 24 if m in rates else None
                                        for g, m in zip(per_node["fragmented_gpus"], per_node["gpu_model"])]
    idle, fragmented, gpus = (float(per_node[c].sum()) for c in ("idle_gpus", "fragmented_gpus", "gpus"))
    return {"at": at, "enough_data": True, "reason": None,
            "workload": [{"gpus": s.gpus, "gpu_milli": s.gpu_milli, "share": p}
                         for s, p in zip(workload.shapes, workload.popularity)],
            "gpus": gpus, "idle_gpus": idle, "fragmented_gpus": fragmented,
            "fragmented_share_of_idle": fragmented / idle if idle else 0.0,
            "fragmented_share_of_capacity": fragmented / gpus if gpus else 0.0,
            "stranded_usd_per_day": float(per_node["stranded_usd_per_day"].fillna(0).sum()),
            "nodes": records(per_node.sort_values(["fragmented_gpus", "node"], ascending=[False, True])),
            "history": hist}


@router.post("/v1/placement", response_model=PlacementAnswer)
def placement(request: PlacementRequest, caller: ReadCaller, store: StoreDep, config: ConfigDep,
              days: float = Days) -> dict:
    """Where a task should go: every node (and, for a part of a GPU, every GPU) that can take it now, ranked by
    how little it raises the cluster's fragmentation (FGD), with each alternative's score. A scheduler extender's
    prioritize call, or a KAI/Volcano plugin, can take the first candidate or weigh the scores with its own.

    With `[topology] keep_within = "island"` (the default) a multi-GPU task is kept inside one NVLink island: the
    candidates that can are ranked first, with that island's GPUs, then nodes whose topology is unknown, then those
    that would split it (each says which, `within_island`). The answer carries the pod-set annotations that ask
    Kueue or KAI to keep the job inside the configured level, when `[topology] scheduler_objects` is on.

    With `pods` > 1 the answer's `gang` places that many pods of the shape at once on one GPU model (any mix with
    `mix_models`) inside one clique or rack (as `keep_within` says), nodes of unknown clique or rack never taken as
    together; a gang that does not fit gets the same object with nothing placed, the reason, and each group tried.
    `gpu_model` takes rate-card names or the Kueue flavor names gpuledger emits for them, in any case."""
    milli = 1000
    if request.gpu_fraction is not None and request.mig_profile is not None:
        raise InputError("give gpu_fraction or mig_profile, not both")
    if (request.gpu_fraction is not None or request.mig_profile) and request.gpus != 1:
        raise InputError("a part of a GPU (gpu_fraction, mig_profile) is for one GPU: set gpus to 1")
    if (request.gpu_fraction is not None or request.mig_profile) and request.pods != 1:
        raise InputError("a gang of pods takes whole GPUs: no gpu_fraction or mig_profile with pods > 1")
    at, nodes, workload = frag.current_state(store, None, days)
    # the models asked are read against those present too: a model outside the catalogue is kept verbatim
    models = (ModelNames(str(m) for m in nodes.model).require(request.gpu_model) if request.gpu_model
              else frozenset())
    if request.gpu_fraction is not None:
        milli = max(1, round(request.gpu_fraction * 1000))
    elif request.mig_profile:
        models, milli = _mig_models(request.mig_profile, models)
    level = config.topology.level_label()
    annotations = (podset_annotations(request.scheduler, config.topology, level)
                   if request.scheduler and config.topology.scheduler_objects and level else {})
    note = None
    if request.scheduler and not annotations:  # asked for, and none: say why rather than answer {} silently
        note = (f"no {request.scheduler} annotations: [topology] scheduler_objects is off (set it to true so the "
                f"plans carry the Topology and placements the annotations that keep a job inside one "
                f"{config.topology.keep_within})" if not config.topology.scheduler_objects else
                f"no {request.scheduler} annotations: [topology] levels name no node label for keep_within = "
                f"{config.topology.keep_within!r}")
    answer = {"at": at, "request_gpu_milli": milli, "candidates": [], "feasible": 0, "within_island": 0,
              "keep_within": config.topology.keep_within, "annotations": annotations, "annotations_note": note}
    reason = ("no node has reported in the last 10 minutes" if not nodes.names else
              f"no job held a GPU in the last {days:g} day(s): nothing to score against" if workload is None else None)
    if reason is not None:
        # a gang is still answered with its object: nothing placed, and why
        gang = _no_gang(config, request, reason) if request.pods > 1 else None
        return {**answer, "reason": reason, "gang": gang}
    state = ClusterState(nodes, workload)
    shape = frag.TaskShape(0, milli, request.gpus, models)
    ranked = rank(state, Task("request", shape, 0))
    islands = topo.slot_islands(store, at, state.gpu_ids, state.gpu_free.shape[1])
    gang = _gang(store, config, at, state, shape, request, islands) if request.pods > 1 else None
    if not len(ranked.nodes):
        return {**answer, "reason": "no node has the GPUs free that the request needs", "gang": gang}
    candidates = keep_within_islands(state, shape, ranked.nodes, [ranked.slots(i) for i in range(len(ranked.nodes))],
                                     islands, rank_by_islands=config.topology.keep_within != "node")
    out = []
    for c in candidates[:request.limit]:
        out.append({"node": state.names[c.node], "gpu_model": state.model[c.node],
                    "gpus": _gpu_names(state, c.node, c.slots), "within_island": c.within,
                    "island": c.island, "score": int(ranked.score[c.rank]),
                    "fragmentation_before_gpus": float(ranked.before[c.rank]) / 1000,
                    "fragmentation_after_gpus": float(ranked.after[c.rank]) / 1000})
    return {**answer, "candidates": out, "feasible": len(ranked.nodes),
            "within_island": sum(c.within is True for c in candidates), "gang": gang}


def _gpu_names(state: ClusterState, node: int, slots: tuple[int, ...]) -> list[str]:
    """The GPUs (UUIDs) of a node's slots; a slot's number where the state does not know its GPU."""
    ids = state.gpu_ids[node] if state.gpu_ids else []
    return [ids[s] if s < len(ids) else str(s) for s in slots]


def _no_gang(config: Config, request: PlacementRequest, reason: str) -> dict:
    """The gang object when nothing could be tried (no state or no workload): nothing placed, and why."""
    return {"pods": request.pods, "scope": config.topology.keep_within, "mix_models": request.mix_models,
            "group": None, "gpu_model": None, "placed": [], "reason": reason, "groups_considered": 0,
            "groups_fitting": 0, "tried": [], "nodes_without_group": [], "fragmentation_added_gpus": None}


def _gang(store: Store, config: Config, at: datetime, state: ClusterState, shape: frag.TaskShape,
          request: PlacementRequest, islands: list) -> dict:
    """`pods` pods of the shape placed at once on one GPU model (unless mix_models) inside one group of [topology]
    keep_within (policies/placers/gang.py), with every group tried and why it was or was not chosen."""
    scope, pods = config.topology.keep_within, request.pods
    groups = topo.node_groups(store, at, state.names, scope, config.topology.rack_label)
    search = place_gang(state, shape, pods, groups, islands, rank_by_islands=scope != "node",
                        mix_models=request.mix_models)
    tried = [{"group": t.group, "gpu_model": t.gpu_model, "nodes": t.nodes, "gpus_free": t.gpus_free,
              "pods_fit": t.pods_fit, "fits": t.fits, "chosen": t.chosen, "reason": t.reason,
              "fragmentation_added_gpus": None if t.fragmentation_added_milli is None
              else t.fragmentation_added_milli / 1000} for t in search.tried]
    answer = {**_no_gang(config, request, ""), "groups_considered": len(tried), "tried": tried,
              "nodes_without_group": [n for n, g in zip(state.names, groups) if g is None]}
    plan = search.plan
    if plan is None:
        return {**answer, "reason": _why_not(search, shape, pods, scope, bool(answer["nodes_without_group"]))}
    placed = [{"node": state.names[c.node], "gpu_model": str(state.model[c.node]), "within_island": c.within,
               "island": c.island, "gpus": _gpu_names(state, c.node, c.slots)} for c in plan.pods]
    on = {p["gpu_model"] for p in placed}
    return {**answer, "group": plan.group, "gpu_model": on.pop() if len(on) == 1 else None, "placed": placed,
            "reason": None, "groups_fitting": plan.groups_fitting,
            "fragmentation_added_gpus": plan.fragmentation_added_milli / 1000}


def _why_not(search: GangSearch, shape: frag.TaskShape, pods: int, scope: str, ungrouped: bool) -> str:
    """One line on why no group takes the gang; each group tried says its own."""
    where = "the cluster" if scope in ("island", "node") else f"any {scope}"
    kept = "" if search.tried and search.tried[0].gpu_model is None else " of one GPU model"
    if not search.tried:
        asked = f" of the models asked ({', '.join(sorted(shape.models))})" if shape.models else ""
        if scope in ("island", "node"):
            return f"no node{asked} has reported"
        return (f"no node{asked} is known to be in a {scope}"
                + (" (nodes of unknown clique or rack are never placed on)" if ungrouped else ""))
    most = max(t.pods_fit for t in search.tried)
    line = (f"no group{kept} in {where} takes all {pods} pods of {shape.gpus} GPU(s) now; the most any could take "
            f"is {most} (see tried)")
    if search.mixed_would_fit:
        line += f"; mixing GPU models (mix_models) would have room in {search.mixed_would_fit}"
    return line


def _mig_models(profile: str, asked: frozenset[str]) -> tuple[frozenset[str], int]:
    """The GPU models that can take a MIG slice of this profile (of those asked for, if any), and the slice's
    share of a card in thousandths (the largest among them, so no candidate is short). A card without MIG, or
    one whose geometry lacks the profile, is never offered."""
    owners = models_with_profile(profile)
    allowed = [m for m in owners if not asked or m in asked]
    if not allowed:
        among = f" among {', '.join(sorted(asked))}" if asked else ""
        raise InputError(f"no GPU model{among} offers MIG profile {profile!r}; the cards that do: "
                         f"{', '.join(owners) or 'none in the catalogue'}")
    return frozenset(allowed), max(round(mig_fraction(m, profile) * 1000) for m in allowed)
