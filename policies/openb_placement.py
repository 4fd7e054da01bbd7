"""The openb trace (collector/traces/openb.py reads it) placed on its nodes: its pods as placement tasks, its nodes
as free resources, and its history as the pods would have run when placed with FGD as they were scheduled (the
trace does not say where they ran). Placement is policy, so this lives here and not with the trace readers.
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

from gpuledger.analytics.fragmentation import MILLI, NodeArrays, TaskShape, Workload
from gpuledger.collector.traces.history import (
    Holding,
    Imported,
    free_capacity,
    jobs_frame,
    samples_of,
    shift_to,
    window_start,
)
from gpuledger.collector.traces.openb import SOURCE, STATES, read_nodes, read_pods
from gpuledger.policies.placers.base import DEFAULT_CPU_MILLI, DEFAULT_MEM_MIB, ClusterState, Placement, Task
from gpuledger.policies.placers.fgd import FgdPlacer


def load_nodes(data: Path) -> NodeArrays:
    """The GPU nodes, empty: free resources are the whole node."""
    frame = read_nodes(data)
    width = int(frame["gpu"].max())
    gpus = frame["gpu"].to_numpy(dtype=np.int64)
    free = np.where(np.arange(width)[None, :] < gpus[:, None], MILLI, 0).astype(np.int64)
    return NodeArrays(names=frame["sn"].tolist(), model=frame["model"].fillna("").to_numpy(dtype=object),
                      cpu_free=frame["cpu_milli"].to_numpy(dtype=np.int64),
                      mem_free=frame["memory_mib"].to_numpy(dtype=np.int64), gpu_free=free, gpu_count=gpus)


def load_tasks(data: Path, variant: str = "default") -> list[Task]:
    """The pods of one pod list, as tasks in name order: a request of 0 counts as Kubernetes' default, a
    `gpu_milli` over 1000 as a whole GPU (as the trace's own converter does), `gpu_spec` as allowed models."""
    frame = read_pods(data, variant)
    tasks = []
    for name, cpu, mem, gpus, milli, spec in frame[["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli",
                                                   "gpu_spec"]].itertuples(index=False):
        gpus = int(gpus)
        per_gpu = min(int(milli), MILLI) if gpus else 0
        models = frozenset(m for m in str(spec).split("|") if m and m != "nan") if gpus else frozenset()
        shape = TaskShape(int(cpu) or DEFAULT_CPU_MILLI, per_gpu, gpus if per_gpu else 0, models)
        tasks.append(Task(str(name), shape, int(mem) or DEFAULT_MEM_MIB))
    return tasks


def import_history(data: Path, days: float | None = 7.0, end: datetime | None = None) -> Imported:
    """The pods of the default list as jobs on the trace's nodes. The trace does not say where pods ran, so they
    are placed with FGD as they were scheduled and freed when deleted; a pod no node could take is reported, not
    billed. Teams are the QoS classes (LS, BE, Burstable, Guaranteed); a shared pod is billed its `gpu_milli`. The
    last `days` of the trace are imported (None: all 149 days)."""
    nodes = load_nodes(data)
    frame = read_pods(data, history=True)
    tasks = load_tasks(data)
    state = ClusterState(nodes, Workload.typical(t.shape for t in tasks))
    placer = FgdPlacer()
    trace_end = float(frame["deletion_time"].max())
    lo = window_start(trace_end, days)
    events = []  # (time, 0 = leave / 1 = arrive, pod index): leaving first frees room for arrivals at that second
    for i, row in frame.iterrows():
        if pd.notna(row["scheduled_time"]):
            events.append((float(row["scheduled_time"]), 1, i))
            events.append((float(row["deletion_time"]), 0, i))
    events.sort()
    placed: dict[int, Placement] = {}
    holdings: list[Holding] = []
    unplaced = 0
    for t, kind, i in events:
        task = tasks[i]
        if kind == 0:
            if i in placed:
                state.release(task, placed[i])
            continue
        where = placer.place(state, task)
        if where is None:
            unplaced += 1
            continue
        state.apply(task, where)
        placed[i] = where
        row = frame.loc[i]
        start, stop = max(float(row["scheduled_time"]), lo), float(row["deletion_time"])
        if stop <= start:
            continue
        for slot in where.slots:
            holdings.append(Holding(str(row["name"]), str(row["qos"]), None, state.names[where.node], f"gpu{slot}",
                                    str(state.model[where.node]), task.shape.gpu_milli / MILLI, start, stop))
    shift = shift_to(trace_end, end)
    gpus = [(state.names[n], f"gpu{s}", str(state.model[n])) for n in range(len(state.names))
            for s in range(int(state.gpu_count[n]))]
    first = max(lo, 0.0)
    jobs = [{"job_id": str(r["name"]), "team": str(r["qos"]), "user": None, "namespace": str(r["qos"]),
             "pod": str(r["name"]), "node": state.names[placed[i].node] if i in placed else None,
             "gpu_model": None, "gpus": int(r["num_gpu"]), "submit_ts": float(r["creation_time"]),
             "start_ts": float(r["scheduled_time"]) if pd.notna(r["scheduled_time"]) else np.nan,
             "end_ts": float(r["deletion_time"]) if str(r["pod_phase"]) != "Running" else np.nan,
             "state": STATES.get(str(r["pod_phase"]), str(r["pod_phase"]).lower())}
            for i, r in frame.iterrows() if float(r["deletion_time"]) >= first]

    def tables() -> Iterator[pa.Table]:
        yield from samples_of(holdings, shift, SOURCE)
        yield free_capacity(holdings, gpus, first, trace_end, shift, SOURCE)
    scheduled = sum(1 for e in events if e[1])
    notes = [f"{len(placed):,} of {scheduled:,} scheduled pods placed with FGD as scheduled (the trace does not say "
             f"where they ran), {unplaced:,} found no node; {len(frame) - scheduled:,} never scheduled (pending jobs)",
             "openb has no GPU utilisation: used GPU-hours, efficiency and idle waste are not evidence for "
             "this history, allocation, cost, fragmentation and queueing are"]
    return Imported(tables(), jobs_frame(jobs, shift), notes, capacity=True)

