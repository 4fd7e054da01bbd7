"""Placement what-if: the recorded arrivals replayed through each placer (fgd, bestfit, dotprod, random) on a node
inventory, with departures: what fragmentation, stranded dollars and waits each placer would have given.

Jobs arrive at their submission and leave after their run time; a job waits first in first out, and a pass tries
at most `depth` waiting jobs, so a job that fits may start ahead of one that does not (no reservations: the
question is where jobs go, not the queue's order). A gang (a job of more GPUs than one node holds, as tasks of at
most a node's GPUs each) starts only when every task is placed at once; otherwise what was placed is given back.

Figures per placer, over the window: GPU allocated and fragmented (FGD's measure for the target workload, shares
of capacity, time-weighted), stranded GPU-hours (fragmented GPUs held unusable by the typical task) and their
dollars at each model's rate (GPUs of a model without a rate are counted apart, never as $0), queue waits, and
the gang jobs that would have started earlier than the record says they did.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from gpuledger.analytics.fragmentation import MILLI, NodeArrays, TaskShape, Workload, allocation_state, recent_workload
from gpuledger.analytics.job_replay import replay_jobs
from gpuledger.analytics.store import Store
from gpuledger.collector.errors import InputError
from gpuledger.analytics.topology import slot_islands
from gpuledger.collector.topology import UNKNOWN_ISLAND
from gpuledger.policies.placers import POLICIES, ClusterState, Placement, Task, make_placer
from gpuledger.policies.placers.base import Placer
from gpuledger.policies.placers.topology import IslandKeeper, spans_islands, whole_multi_gpu
from gpuledger.policies.whatif import quantile_or_none
from gpuledger.policies.whatif.workload import workload_of

DEPTH = 64  # waiting jobs one pass tries


@dataclass(frozen=True)
class Arrival:
    """A recorded job as the placement replay sees it: its tasks (a gang when more than one), when it was
    submitted and how long it ran (seconds), and how long it waited in the record (None: unknown)."""
    name: str
    tasks: tuple[Task, ...]
    submit: float
    run: float
    recorded_wait: float | None = None

    @property
    def gang(self) -> bool:
        return len(self.tasks) > 1 or self.tasks[0].shape.gpus > 1


def tasks_for(gpus: int, model: str | None, per_node: int, name: str) -> tuple[Task, ...]:
    """A job of `gpus` whole GPUs as tasks of at most `per_node` GPUs each (a gang when it needs several nodes)."""
    models = frozenset({model}) if model else frozenset()
    count = max(1, math.ceil(gpus / max(per_node, 1)))
    sizes = [gpus // count + (1 if i < gpus % count else 0) for i in range(count)]
    return tuple(Task(f"{name}#{i}", TaskShape(0, MILLI, size, models), 0) for i, size in enumerate(sizes))


def emptied(nodes: NodeArrays) -> NodeArrays:
    """The inventory with nothing placed: every GPU slot a node has, whole and free."""
    free = np.zeros_like(nodes.gpu_free)
    for row, count in enumerate(nodes.gpu_count):
        free[row, :int(count)] = MILLI
    return NodeArrays(nodes.names, nodes.model, nodes.cpu_free.copy(), nodes.mem_free.copy(), free,
                      nodes.gpu_count.copy(), nodes.gpu_ids)


def replay_placement(nodes: NodeArrays, arrivals: Sequence[Arrival], policy: str, workload: Workload,
                     rates: dict[str, float], end_s: float, seed: int = 42, islands: list[np.ndarray] | None = None,
                     keep_within: bool = False) -> dict[str, Any]:
    """One placer over the arrivals, from an empty `nodes` until `end_s` (seconds, the window's end). `islands`
    (per node, each GPU slot's NVLink island) counts the multi-GPU tasks placed across islands; `keep_within`
    keeps them inside one where a node's island holds them (policies/placers/topology.py IslandKeeper)."""
    began = time.perf_counter()
    state = ClusterState(nodes, workload)
    placer: Placer = make_placer(policy, seed)
    if keep_within and islands:
        placer = IslandKeeper(placer, islands)
    split = {"multi_gpu_tasks": 0, "split_tasks": 0, "unknown_topology_tasks": 0}
    models = np.asarray(state.model, dtype=object)
    rate_per_node = np.array([rates.get(str(m), np.nan) for m in models], dtype=float)
    events = [(a.submit, 1, i) for i, a in enumerate(arrivals) if a.submit < end_s]
    heapq.heapify(events)
    waiting: list[int] = []
    held: dict[int, list[Placement]] = {}
    started: dict[int, float] = {}
    priced = ~np.isnan(rate_per_node)
    last, frag_s, alloc_s, stranded_usd, unpriced = 0.0, 0.0, 0.0, 0.0, 0.0  # frag_s: fragmented milli-GPU-s
    capacity = state.capacity_milli or 1

    def advance(t: float) -> None:
        nonlocal last, frag_s, alloc_s, stranded_usd, unpriced
        dt = min(t, end_s) - last
        if dt > 0:
            frag = state.frag
            frag_s += float(frag.sum()) * dt
            alloc_s += state.allocated_milli * dt
            stranded_usd += float((frag[priced] / MILLI * rate_per_node[priced]).sum()) * dt / 3600.0
            unpriced += float(frag[~priced].sum()) / MILLI * dt
            last = min(t, end_s)

    def try_start(i: int, now: float) -> bool:
        placed: list[Placement] = []
        for task in arrivals[i].tasks:
            where = placer.place(state, task)
            if where is None:
                for task_back, back in zip(arrivals[i].tasks, placed):
                    state.release(task_back, back)
                return False
            state.apply(task, where)
            placed.append(where)
        held[i], started[i] = placed, now
        for task, where in zip(arrivals[i].tasks, placed):
            if whole_multi_gpu(task.shape):
                split["multi_gpu_tasks"] += 1
                spans = spans_islands(islands[where.node], where.slots) if islands else None
                if spans is None:
                    split["unknown_topology_tasks"] += 1
                elif spans:
                    split["split_tasks"] += 1
        heapq.heappush(events, (now + arrivals[i].run, 0, i))
        return True

    while events and events[0][0] < end_s:
        now = events[0][0]
        advance(now)
        while events and events[0][0] == now:
            _, kind, i = heapq.heappop(events)
            if kind == 0:
                for task, where in zip(arrivals[i].tasks, held.pop(i)):
                    state.release(task, where)
            else:
                waiting.append(i)
        still = []
        for n, i in enumerate(waiting):
            if n >= DEPTH or not try_start(i, now):
                still.append(i)
        waiting = still
    advance(end_s)
    length = end_s or 1.0
    waits = [(started.get(i, end_s) - a.submit) / 60.0 for i, a in enumerate(arrivals) if a.submit < end_s]
    earlier = [(a.recorded_wait - (started[i] - a.submit)) / 60.0 for i, a in enumerate(arrivals)
               if i in started and a.gang and a.recorded_wait is not None
               and started[i] - a.submit < a.recorded_wait - 1.0]
    gangs = sum(1 for a in arrivals if a.gang and a.submit < end_s)
    known = split["multi_gpu_tasks"] - split["unknown_topology_tasks"]
    return {"policy": policy, "kept_within_islands": bool(keep_within and islands), **split,
            "split_tasks": split["split_tasks"] if known else None, "jobs": len(waits), "started": len(started),
            "still_waiting": len(waits) - len(started),
            "allocated_share": alloc_s / capacity / length, "fragmented_share": frag_s / capacity / length,
            "stranded_gpu_hours": frag_s / MILLI / 3600.0,
            "stranded_usd": stranded_usd if priced.any() else None,  # no rate: unknown
            "unpriced_stranded_gpu_hours": unpriced / 3600.0,
            "wait_p50_minutes": quantile_or_none(waits, 0.5), "wait_p95_minutes": quantile_or_none(waits, 0.95),
            "gang_jobs": gangs, "gang_jobs_started_earlier": len(earlier),
            "gang_minutes_earlier_mean": float(np.mean(earlier)) if earlier else None,
            "seconds": round(time.perf_counter() - began, 3)}


def compare_placers(nodes: NodeArrays, arrivals: Sequence[Arrival], policies: Sequence[str], workload: Workload,
                    rates: dict[str, float], end_s: float, progress: Callable[[str], None] | None = None,
                    islands: list[np.ndarray] | None = None) -> list[dict[str, Any]]:
    """Each placer's figures over the same arrivals and the same empty inventory; with `islands` where some node's
    topology is known, each placer a second time keeping multi-GPU tasks inside one NVLink island."""
    empty = emptied(nodes)
    known = bool(islands) and any((i != UNKNOWN_ISLAND).any() for i in islands)
    out = []
    for policy in policies:
        for keep in (False, True) if known else (False,):
            out.append(replay_placement(empty, arrivals, policy, workload, rates, end_s, islands=islands,
                                        keep_within=keep))
            if progress:
                progress(policy + (" kept within islands" if keep else ""))
    return out


def placement_whatif(store: Store, start: datetime, end: datetime, policies: Sequence[str]) -> dict[str, Any]:
    """The window's recorded jobs (the quota what-if's workload, workload.py: jobs running at the start arrive at
    it) through each placer on the GPUs present at `end`, from empty."""
    for policy in policies:
        if policy not in POLICIES:
            raise InputError(f"unknown placer {policy!r}: one of {', '.join(POLICIES)}")
    nodes = allocation_state(store, end)
    if not nodes.names:
        raise InputError(f"no GPU node is present at {end:%Y-%m-%d %H:%M} UTC to place the jobs on")
    per_node: dict[str, int] = {}
    for model, count in zip(nodes.model, nodes.gpu_count):
        per_node[str(model)] = max(per_node.get(str(model), 0), int(count))
    capacity = {m: int(sum(int(c) for mm, c in zip(nodes.model, nodes.gpu_count) if str(mm) == m)) for m in per_node}
    records = replay_jobs(store, start, end)
    if records.empty:
        raise InputError(f"no job records between {start:%Y-%m-%d %H:%M} and {end:%Y-%m-%d %H:%M} UTC to replay")
    waited = {str(r.job_id): (r.start_ts - r.submit_ts).total_seconds() for r in records.itertuples(index=False)
              if not pd.isna(r.start_ts) and not pd.isna(r.submit_ts)}
    jobs = workload_of(records, start, end, capacity)
    arrivals = [Arrival(j.job_id, tasks_for(j.gpus, j.model, per_node[j.model], j.job_id), max(j.submit, 0.0), j.run,
                        None if j.running_at_start else waited.get(j.job_id)) for j in jobs.jobs]
    target = recent_workload(store, start, end) or Workload.typical(t.shape for a in arrivals for t in a.tasks)
    islands = slot_islands(store, end, nodes.gpu_ids, int(nodes.gpu_free.shape[1]))
    results = compare_placers(nodes, arrivals, policies, target, store.current_rates(),
                              (end - start).total_seconds(), islands=islands)
    return {"start": start, "end": end, "nodes": len(nodes.names), "gpus": int(nodes.gpu_count.sum()),
            "jobs": len(arrivals), "assumptions": jobs.notes(), "placers": results,
            "notes": ["the inventory is the GPUs present at the window's end, empty at its start; GPU telemetry says "
                      "nothing of CPU or memory, so only GPUs constrain placement",
                      "a job of more GPUs than one node holds is a gang of tasks placed all at once",
                      "islands are each node's NVLink islands at the window's end (GET /v1/topology); where some "
                      "are known, each placer is replayed twice: as it places, and keeping a multi-GPU task inside "
                      "one island; split_tasks counts tasks placed across islands (null: no topology known)"]}


def openb_arrivals(data: Path) -> tuple[NodeArrays, list[Arrival], Workload, float]:
    """Alibaba's openb trace (cluster-trace-gpu-v2023, CC BY 4.0) as a placement what-if: its nodes, its scheduled
    pods as arrivals (creation, scheduled - creation as the recorded wait, deletion - scheduled as the run), the
    target workload of its tasks, and the trace's length in seconds."""
    from gpuledger.collector.traces.openb import read_pods
    from gpuledger.policies.openb_placement import load_nodes, load_tasks
    frame, tasks = read_pods(data, history=True), load_tasks(data)
    origin = float(frame["creation_time"].min())
    arrivals = [Arrival(str(r.name), (task,), float(r.creation_time) - origin,
                        float(r.deletion_time) - float(r.scheduled_time),
                        float(r.scheduled_time) - float(r.creation_time))
                for r, task in zip(frame.itertuples(index=False), tasks) if not pd.isna(r.scheduled_time)]
    return (load_nodes(data), arrivals, Workload.typical(t.shape for t in tasks),
            float(frame["deletion_time"].max()) - origin)
