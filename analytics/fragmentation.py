"""GPU fragmentation as FGD measures it (Weng et al., USENIX ATC '23): the idle GPU a typical task cannot use.

Why this measure: "idle GPUs" over-states what a cluster can still run. A GPU with 300 milli left is idle capacity
that no task asking 500 milli can use, and a node with four free GPUs but no free CPU runs nothing. FGD weighs,
for each node, its idle GPU that each task shape of the workload could not use, by how common the shape is.

Definitions (../shared/docs/schedulers/fgd.md, from the authors' simulator):
- A task shape m asks CPU c_m (milli), k_m GPUs of d_m milli each (d_m < 1000 only for a shared single GPU), maybe
  on some GPU models only. A CPU-only shape has d_m = 0.
- F_n(m), the part of node n's idle GPU that m cannot use: when m fits on n (model allowed, k_m GPUs with at least
  d_m milli left, CPU left), the idle milli of the GPUs with less than d_m left; otherwise, and for CPU-only
  shapes, all of n's idle GPU milli.
- The target workload M is the most common shapes covering 95% of tasks, with popularity p_m renormalised over them.
  F_n(M) = Σ p_m F_n(m); the cluster's is the sum over nodes.

Everything is in milli-GPU and vectorised over nodes (and over candidate placements, for the FGD placer). On a
live cluster the state comes from the newest samples (what each GPU's jobs hold of it) and the workload from the
recent jobs' shapes; GPU telemetry does not see CPU or memory, so there only GPUs constrain.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np
import pandas as pd

from gpuledger.analytics.usage import COMPUTE_NEED_MEANS
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.gpu_catalog import UNKNOWN_MODEL

if TYPE_CHECKING:
    from gpuledger.analytics.store import Store

MILLI = 1000  # one whole GPU
DEFAULT_COVERAGE = 0.95  # the shapes kept cover this share of tasks (the authors' experiments)


@dataclass(frozen=True)
class TaskShape:
    """What a task asks, as far as fragmentation is concerned (memory is not part of FGD's measure)."""
    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for a CPU-only task
    gpus: int
    models: frozenset[str] = frozenset()  # allowed GPU models; empty: any

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.gpus


@dataclass(frozen=True)
class Workload:
    """The target workload: task shapes and how common each is (sums to 1)."""
    shapes: tuple[TaskShape, ...]
    popularity: tuple[float, ...]

    @staticmethod
    def typical(tasks: Iterable[TaskShape], coverage: float = DEFAULT_COVERAGE) -> "Workload":
        """The most common shapes, in decreasing count (ties: first seen first), until they cover `coverage` of
        the tasks; the shape that crosses the line is kept."""
        counts: dict[TaskShape, int] = {}
        for task in tasks:
            counts[task] = counts.get(task, 0) + 1
        if not counts:
            raise ValueError("no tasks to derive a target workload from")
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])  # stable: ties keep first-seen order
        kept, covered = [], 0
        for shape, count in ranked:
            if covered >= coverage * total:
                break
            kept.append((shape, count))
            covered += count
        return Workload(tuple(s for s, _ in kept), tuple(c / covered for _, c in kept))


@dataclass
class NodeArrays:
    """Free resources of a set of nodes, one row each: what the measure and the placers work on.

    `gpu_free` has one column per GPU slot (the widest node's count); slots a node does not have hold 0, which no
    GPU task fits and which adds nothing to idle sums."""
    names: list[str]
    model: np.ndarray  # (N,) GPU model name per node ("" for a CPU-only node)
    cpu_free: np.ndarray  # (N,) milli-CPU
    mem_free: np.ndarray  # (N,) MiB
    gpu_free: np.ndarray  # (N, G) milli-GPU per slot
    gpu_count: np.ndarray  # (N,) GPUs the node has
    gpu_ids: list[list[str]] | None = None  # per node, what each slot is (GPU index and UUID), when known


def _access(models: np.ndarray, shapes: Sequence[TaskShape]) -> np.ndarray:
    """(N, M): whether each node's GPU model is allowed for each shape."""
    out = np.ones((len(models), len(shapes)), dtype=bool)
    for j, shape in enumerate(shapes):
        if shape.models:
            out[:, j] = np.isin(models, list(shape.models))
    return out


def fragmentation(gpu_free: np.ndarray, cpu_free: np.ndarray, models: np.ndarray, workload: Workload,
                  access: np.ndarray | None = None) -> np.ndarray:
    """F_n(M) in milli-GPU for each row (a node, or a node as a placement would leave it). `access` (rows x
    shapes) may be passed when the same nodes are measured often."""
    shapes = workload.shapes
    demand = np.array([s.gpu_milli for s in shapes], dtype=np.int64)  # (M,)
    count = np.array([s.gpus for s in shapes], dtype=np.int64)
    cpu = np.array([s.cpu_milli for s in shapes], dtype=np.int64)
    p = np.asarray(workload.popularity, dtype=float)
    if access is None:
        access = _access(models, shapes)
    free = gpu_free[:, None, :]  # (N, 1, G)
    enough = free >= demand[None, :, None]  # (N, M, G)
    idle = gpu_free.sum(axis=1)  # (N,)
    too_small = np.where(enough, 0, free).sum(axis=2)  # (N, M): idle milli of the GPUs too small for m
    fits = (access & (enough.sum(axis=2) >= count[None, :]) & (cpu_free[:, None] >= cpu[None, :])
            & (demand[None, :] > 0))
    per_shape = np.where(fits, too_small, idle[:, None])
    return per_shape @ p


# --- the store's side: allocation state, the workload of recent jobs, history -----------------------------------

# the samples that stand for instant $at: each sample covers [ts, ts + interval_s) (with one interval of slack for
# a late agent), the newest per GPU, MIG instance and holder; samples over $since old are not looked at
_LIVE = """
    WITH live AS (
        SELECT *, row_number() OVER (PARTITION BY node, gpu_uuid, mig_instance, job_id, pod ORDER BY ts DESC) AS k
        FROM samples
        WHERE ts <= $at AND ts > $since AND epoch(ts) + 2 * seconds_of(interval_s) > epoch($at))"""


def allocation_state(store: "Store", at: datetime, stale: timedelta = timedelta(hours=2)) -> NodeArrays:
    """Each node's GPUs as the samples standing for `at` show them: a GPU's free milli is what no job holds of it
    (MIG instances and shared pods hold their fractions). GPU telemetry says nothing of CPU or memory, so those are
    left unconstrained."""
    frame = store.query(_LIVE + """
        SELECT node, gpu_uuid, coalesce(any_value(gpu_model), $unknown) AS gpu_model, min(gpu_index) AS gpu_index,
               coalesce(sum(share_of(gpu_fraction)) FILTER (WHERE allocated), 0) AS held,
               sum(share_of(gpu_fraction)) AS present
        FROM live WHERE k = 1
        GROUP BY node, gpu_uuid ORDER BY node, gpu_index, gpu_uuid""",
        {"at": at, "since": at - stale, "unknown": UNKNOWN_MODEL})
    return _node_arrays(frame)


def _node_arrays(frame: pd.DataFrame) -> NodeArrays:
    if frame.empty:
        return NodeArrays([], np.array([], dtype=object), np.zeros(0, np.int64), np.zeros(0, np.int64),
                          np.zeros((0, 1), np.int64), np.zeros(0, np.int64))
    free = np.clip(np.round((frame["present"].clip(upper=1.0) - frame["held"]) * MILLI), 0, MILLI).astype(np.int64)
    frame = frame.assign(free=free, slot=frame.groupby("node").cumcount())
    names = list(dict.fromkeys(frame["node"]))
    width = int(frame["slot"].max()) + 1
    grid = np.zeros((len(names), width), dtype=np.int64)
    row = {n: i for i, n in enumerate(names)}
    rows = frame["node"].map(row).to_numpy()
    grid[rows, frame["slot"].to_numpy()] = frame["free"].to_numpy()
    first = frame.groupby("node", sort=False)
    unlimited = np.full(len(names), UNLIMITED, dtype=np.int64)
    ids = frame.groupby("node", sort=False)["gpu_uuid"].agg(list).reindex(names).tolist()
    return NodeArrays(names, first["gpu_model"].first().reindex(names).to_numpy(dtype=object), unlimited,
                      unlimited.copy(), grid, first.size().reindex(names).to_numpy(dtype=np.int64), gpu_ids=ids)


UNLIMITED = 1 << 40  # CPU and memory the telemetry does not know: never the constraint


def recent_workload(store: "Store", start: datetime, end: datetime, coverage: float = DEFAULT_COVERAGE
                    ) -> Workload | None:
    """The target workload from the jobs of [start, end): each job's shape is the GPUs it held and the part of
    each (its mean fraction, to 10 milli: MIG slices and shared GPUs are parts), every job counted once. None when
    no job held a GPU."""
    jobs = store.query_usage("""
        SELECT job_id, count(DISTINCT gpu_uuid || coalesce(mig_instance::VARCHAR, '')) AS gpus,
               median(fraction) AS fraction, arg_max(gpu_model, gpu_s) AS gpu_model
        FROM (SELECT job_id, gpu_uuid, mig_instance, gpu_model, sum(gpu_s) AS gpu_s,
                     sum(gpu_s) / nullif(sum(samples * interval_s), 0) AS fraction
              FROM usage_between($start, $end, $fine, $mwm, $hwm, $idle_pct)
              WHERE allocated AND job_id IS NOT NULL GROUP BY ALL)
        GROUP BY job_id""", {"start": start, "end": end})
    if jobs.empty:
        return None
    shapes = []
    for gpus, fraction in jobs[["gpus", "fraction"]].itertuples(index=False):
        if pd.isna(fraction) or not 0 < fraction <= 1:  # no sampled time to divide by (the fold counted none)
            fraction = 1.0
        milli = int(min(MILLI, max(10, round(fraction * 100) * 10)))
        shapes.append(TaskShape(0, milli, int(gpus) if milli == MILLI else 1))
    return Workload.typical(shapes, coverage)


def live_instant(store: "Store", end: datetime | None) -> datetime:
    """The instant the live state is read at: `end` (default now), or just after the newest sample when that is
    earlier, so a store that stopped receiving shows its last state."""
    at = end or utc_now()
    latest = store.latest_ts()
    return min(at, latest + timedelta(microseconds=1)) if latest is not None else at


def current_state(store: "Store", end: datetime | None, days: float) -> tuple[datetime, NodeArrays, Workload | None]:
    """The allocation state and the workload of the `days` before it, read at live_instant(`end`)."""
    at = live_instant(store, end)
    return at, allocation_state(store, at), recent_workload(store, at - timedelta(days=days), at)


def node_report(nodes: NodeArrays, workload: Workload) -> pd.DataFrame:
    """Per node: GPUs, idle and fragmented GPUs (FGD), and the share of its idle GPU that is fragmented."""
    per_node = fragmentation(nodes.gpu_free, nodes.cpu_free, nodes.model, workload)
    idle = nodes.gpu_free.sum(axis=1) / MILLI
    return pd.DataFrame({"node": nodes.names, "gpu_model": nodes.model, "gpus": nodes.gpu_count.astype(float),
                         "idle_gpus": idle, "fragmented_gpus": per_node / MILLI,
                         "fragmented_share": np.where(idle > 0, per_node / MILLI / np.maximum(idle, 1e-9), 0.0)})


def record(store: "Store", at: datetime, lookback: timedelta = timedelta(days=7)) -> int:
    """Store each node's fragmentation at `at` (workload: the jobs of the `lookback` before it); rows stored."""
    workload = recent_workload(store, at - lookback, at)
    nodes = allocation_state(store, at)
    if workload is None or not nodes.names:
        return 0
    frame = node_report(nodes, workload).drop(columns="fragmented_share")
    frame.insert(0, "ts", pd.Timestamp(at))
    return store.append_fragmentation(frame)


def history(store: "Store", start: datetime, end: datetime, node: str | None = None) -> pd.DataFrame:
    """Recorded fragmentation over [start, end): per instant, the cluster's (or one node's) GPUs, idle and
    fragmented GPUs."""
    return store.query("""
        SELECT ts, sum(gpus) AS gpus, sum(idle_gpus) AS idle_gpus, sum(fragmented_gpus) AS fragmented_gpus
        FROM fragmentation_history WHERE ts >= $start AND ts < $end AND ($node IS NULL OR node = $node)
        GROUP BY ts ORDER BY ts""", {"start": start, "end": end, "node": node})


def backfill(store: "Store", start: datetime, end: datetime, step: timedelta = timedelta(hours=1)) -> int:
    """Record the fragmentation at every `step` of [start, end) that has samples (a store built from history:
    the demo, an imported trace); rows stored."""
    stored, at = 0, start + step
    while at <= end:
        stored += record(store, at)
        at += step
    return stored


def holders(store: "Store", at: datetime, stale: timedelta = timedelta(hours=2)) -> pd.DataFrame:
    """Who holds what in the samples standing for `at`: one row per GPU and job (a free GPU: a row with no job),
    with the part of the GPU held and the DRA claim it is held through (null without DRA)."""
    return store.query(_LIVE + """
        SELECT node, gpu_uuid, coalesce(any_value(gpu_model), $unknown) AS gpu_model, job_id, any_value(team) AS team,
               sum(share_of(gpu_fraction)) AS fraction, bool_or(allocated) AS allocated,
               any_value(dra_claim) AS dra_claim
        FROM live WHERE k = 1
        GROUP BY node, gpu_uuid, job_id ORDER BY node, gpu_uuid""",
        {"at": at, "since": at - stale, "unknown": UNKNOWN_MODEL})


def job_traffic(store: "Store", start: datetime, end: datetime) -> pd.DataFrame:
    """Per job of [start, end): the nodes and GPUs it held, its PCIe and NVLink GB/s per GPU and its SM activity.

    PCIe is what a job spread over nodes sends to the other nodes: under GPUDirect RDMA a GPU reaches its NIC over
    PCIe (host copies ride there too, so it is an upper bound of the network part). Its rate is taken over the
    GPU-seconds that read it (`traffic_coverage` says what share that is); none read: NULL, unknown, never zero.
    NVLink bytes are folded as 0 where unread (analytics/store/rollups.py), so they are evidence only."""
    return store.query_usage(f"""
        SELECT job_id, any_value(team) AS team, any_value(gpu_model) AS gpu_model,
               count(DISTINCT node) AS nodes, count(DISTINCT gpu_uuid) AS gpus, sum(gpu_s) AS gpu_s,
               sum(pcie_bytes) / 1e9 / nullif(sum(gpu_s) FILTER (WHERE pcie_bytes IS NOT NULL), 0)
                   AS pcie_gbytes_s_per_gpu,
               coalesce(sum(gpu_s) FILTER (WHERE pcie_bytes IS NOT NULL), 0) / nullif(sum(gpu_s), 0)
                   AS traffic_coverage,
               sum(nvlink_bytes) / 1e9 / nullif(sum(gpu_s), 0) AS nvlink_gbytes_s_per_gpu, {COMPUTE_NEED_MEANS}
        FROM usage_between($start, $end, $fine, $mwm, $hwm, $idle_pct)
        WHERE allocated AND job_id IS NOT NULL GROUP BY job_id""", {"start": start, "end": end})
