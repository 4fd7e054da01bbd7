"""A seeded fake cluster that emits the same samples as the real sources.

It exists so the demo and the tests exercise every analytic on data with known causes:
busy jobs, allocated-but-idle notebooks, memory-oversized jobs that would fit a MIG
slice, NVLink-heavy multi-GPU jobs and pods in namespaces no team owns. Each job asks for a GPU model and is
admitted by a simulated Kueue under the quotas the site declares (collector/sim_scheduler.py), so its queue waits
are ones its configuration produced, and a what-if's backtest of them can hold.
Samples are generated a chunk at a time with numpy, so two weeks of a 48-GPU cluster
take seconds.

The random workload leaves the layout at any given instant to chance, and advice is about the instant it is
evaluated at. So a simulator given a `showcase` instant (the demo's: `default_simulator`) also lays out two nodes
of one model by hand from a few hours before it to the end of the run, so that every kind of advice has its cause
then, whatever the seed: a gang job waiting for GPUs that small jobs fragment, a job spread over both nodes, a
latency-sensitive service time-sliced with another job, an idle notebook and a memory-oversized job
(`_plant_showcase`). The random workload keeps to the other nodes while the layout stands.
"""
from __future__ import annotations

import hashlib
import math
import uuid as uuidlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from gpuledger.collector.apps.simulated import Service, service_of
from gpuledger.collector.attribution import Attributor
from gpuledger.collector.errors import InputError
from gpuledger.collector.gpu_catalog import MODELS, GpuModel
from gpuledger.collector.gpu_health import HW_THERMAL, SW_POWER_CAP
from gpuledger.collector.metrics import SAMPLES_READ
from gpuledger.collector.sim_scheduler import SiteQuotas, admit
from gpuledger.collector.samples import SAMPLE_SCHEMA
from gpuledger.collector.topology import NodeTopology, inferred_topology
from gpuledger.collector.source import Source

PROFILES = ("busy", "light", "idle", "oversized", "nvlink")
# the showcase's model-serving namespace: named in the default `[placement] latency_sensitive`, billed to a team
SERVING_NAMESPACE, SERVING_TEAM = "inference", "nlp"
# namespaces are teams, but for the serving namespace (billed to the team that runs it); `default` is nobody's
_ATTRIBUTOR = Attributor(namespace_to_team={SERVING_NAMESPACE: SERVING_TEAM})
SHOWCASE_LEAD_S = 3 * 3600.0  # the showcase's jobs run from this long before its instant: idle past 30 min, etc.
SHOWCASE_WAIT_S = 3600.0  # its gang job was submitted this long before the instant (waiting past any threshold)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    model: str  # rate-card model, a name in the GPU catalogue
    gpus: int = 8

    @property
    def card(self) -> GpuModel:
        return MODELS[self.model]

    @property
    def model_name(self) -> str:  # what the driver would report
        return self.card.driver_name

    @property
    def mem_mib(self) -> float:
        return float(self.card.mem_mib)

    @property
    def tdp_w(self) -> float:
        return float(self.card.tdp_w)

    @property
    def nvlink(self) -> bool:
        return self.card.nvlink


@dataclass(frozen=True)
class TeamSpec:
    name: str
    share: float
    quota_gpus: int
    weight: float  # share of job arrivals


DEFAULT_NODES: tuple[NodeSpec, ...] = (
    NodeSpec("dgx-h100-01", "H100"),
    NodeSpec("dgx-h100-02", "H100"),
    NodeSpec("hgx-h200-01", "H200"),
    NodeSpec("dgx-a100-01", "A100-80GB"),
    NodeSpec("l40s-01", "L40S"),
    NodeSpec("l4-01", "L4"),
)

DEFAULT_TEAMS: tuple[TeamSpec, ...] = (
    TeamSpec("vision", 30, 14, 0.28),
    TeamSpec("nlp", 30, 14, 0.30),
    TeamSpec("speech", 15, 6, 0.14),
    TeamSpec("recsys", 15, 6, 0.14),
    TeamSpec("research", 10, 4, 0.09),
    TeamSpec("default", 0, 0, 0.05),  # pods in the default namespace: nobody's, so billed as unattributed
)


@dataclass
class SimJob:
    job_id: str
    team: str
    user: str
    namespace: str
    pod: str
    gpus: int
    profile: str
    submit: float  # epoch seconds
    start: float
    end: float
    node: int = -1
    gpu_indices: tuple[int, ...] = ()
    mem_mib: float = 0.0  # steady memory footprint per GPU
    util: float = 0.0  # mean utilisation %
    # GPUs on further nodes, (node, indices) each: a job the scheduler spread over nodes (the showcase's)
    also_on: tuple[tuple[int, tuple[int, ...]], ...] = ()
    fraction: float = 1.0  # the part of each GPU it holds: under 1 when time-sliced with another job
    guest: bool = False  # time-sliced onto GPUs another job (the host) holds: one more sample row per GPU
    want_model: str | None = None  # the GPU model it asks for (a node selector); None: any


@dataclass
class ClusterSimulator:
    start: datetime
    end: datetime
    seed: int = 7
    nodes: Sequence[NodeSpec] = DEFAULT_NODES
    teams: Sequence[TeamSpec] = DEFAULT_TEAMS
    target_load: float = 0.8
    jobs: list[SimJob] = field(default_factory=list)
    # the instant whose layout is staged so that every kind of advice has its cause (module docstring); None: none
    showcase: datetime | None = None
    # GPUs per model the site's quotas leave under no guarantee: the demo's L4 node grew after its quotas were set,
    # so (Kueue admitting at most the guarantees summed) 4 of its GPUs stand idle while jobs wait for L4: what
    # quota advice that raises the waiting teams' guarantees fixes, with a replayed gain (`site_quotas`)
    unquoted_gpus: tuple[tuple[str, int], ...] = (("L4", 4),)

    def __post_init__(self) -> None:
        self._t0 = self.start.timestamp()
        self._t1 = self.end.timestamp()
        self._build_gpu_table()
        self._showcase_nodes = self._pick_showcase_nodes() if self.showcase is not None else ()
        self._schedule()
        self._plant_showcase()
        self._plan_faults()

    # --- cluster layout -------------------------------------------------------------------
    def _build_gpu_table(self) -> None:
        rows = []
        for n, node in enumerate(self.nodes):
            for g in range(node.gpus):
                uid = uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"gpuledger-sim-{self.seed}-{node.name}-{g}")
                rows.append((n, g, f"GPU-{uid}"))
        self.gpu_node = np.array([r[0] for r in rows])
        self.gpu_index = np.array([r[1] for r in rows], dtype=np.int32)
        self.gpu_uuid = np.array([r[2] for r in rows], dtype=object)
        self.gpu_count = len(rows)
        self._node_offset = np.cumsum([0] + [n.gpus for n in self.nodes])

    def _plan_faults(self) -> None:
        """About one GPU in sixteen reports an XID at some point of the run (and an ECC double-bit error with XID
        48); one in five runs hot and throttles when fully busy. A separate stream: the workload stays as seeded."""
        rng = np.random.default_rng([self.seed, 0xFA17])
        faulty = rng.random(self.gpu_count) < 1 / 16
        self.xid_at = np.where(faulty, rng.uniform(self._t0, self._t1, self.gpu_count), np.inf)
        self.xid_code = rng.choice(np.array([79, 48, 13, 31]), self.gpu_count)
        self.runs_hot = rng.random(self.gpu_count) < 1 / 5

    # --- workload ------------------------------------------------------------------------
    def _schedule(self) -> None:
        """Arrivals (Poisson, at `target_load` of the GPUs), each asking for one GPU model, admitted and placed by
        the simulated site's Kueue (collector/sim_scheduler.py) under the quotas it declares (`quota_frame`)."""
        rng = np.random.default_rng(self.seed)
        sizes = np.array([1, 1, 1, 2, 4, 8])
        mean_hours = 4.0
        gpu_hours_per_job = sizes.mean() * mean_hours
        rate_per_s = self.target_load * self.gpu_count / gpu_hours_per_job / 3600.0
        weights = np.array([t.weight for t in self.teams], dtype=float)
        weights /= weights.sum()
        staged = self._showcase_from()
        # while they are staged, arrivals slow to the GPUs left, so the other nodes keep the same load
        left = 1.0 - sum(self.nodes[n].gpus for n in self._showcase_nodes) / self.gpu_count
        capacity = self.capacity()
        models = sorted(capacity)
        showcased = {self.nodes[n].model for n in self._showcase_nodes}
        t = self._t0 - 12 * 3600.0  # warm up so the window starts with a loaded cluster
        k = 0
        durations: list[float] = []
        while True:
            t += rng.exponential(1.0 / (rate_per_s * (left if t >= staged else 1.0)))
            if t >= self._t1:
                break
            team = self.teams[rng.choice(len(self.teams), p=weights)]
            gpus = int(rng.choice(sizes))
            if gpus >= 4:
                profile = str(rng.choice(["nvlink", "busy", "idle"], p=[0.7, 0.2, 0.1]))
            else:
                profile = str(rng.choice(["busy", "light", "idle", "oversized"], p=[0.45, 0.2, 0.15, 0.2]))
            hours = float(np.clip(rng.lognormal(math.log(mean_hours) - 0.5, 1.0), 0.25, 48.0))
            user = f"{team.name}-user{int(rng.integers(1, 5))}"
            # a job asks for a model in proportion to the model's GPUs over the mean size asked of it (each model
            # as loaded as the next), not the showcase's while its layout will stand; at most half the model's GPUs
            # (a job as large as its whole pool waits until every other job there ends)
            usable = [m for m in models if not (m in showcased and t + hours * 3600.0 > staged)]
            odds = np.array([capacity[m] / _mean_size(sizes, capacity[m]) for m in usable], dtype=float)
            want = str(usable[rng.choice(len(usable), p=odds / odds.sum())]) if usable else None
            if want is not None:
                gpus = min(gpus, max(1, capacity[want] // 2))
            job = SimJob(job_id=f"{team.name}/job-{k:05d}", team=team.name, user=user, namespace=team.name,
                         pod=f"job-{k:05d}-worker", gpus=gpus, profile=profile, submit=t, start=t, end=t,
                         want_model=want)
            k += 1
            self.jobs.append(job)
            durations.append(hours * 3600.0)
        quotas = self.site_quotas()
        sizing = np.random.default_rng([self.seed, 0x517E])  # a stream of its own: sizes as jobs start
        admit(self.jobs, durations, [n.model for n in self.nodes], [n.gpus for n in self.nodes],
              SiteQuotas({(r.team, r.gpu_model): r.guarantee_gpus for r in quotas.itertuples()},
                         {(r.team, r.gpu_model): r.limit_gpus for r in quotas.itertuples()}, capacity),
              {n: staged for n in self._showcase_nodes}, self._t1, lambda job: self._size(job, sizing))

    def capacity(self) -> dict[str, int]:
        """GPUs per model."""
        out: dict[str, int] = {}
        for node in self.nodes:
            out[node.model] = out.get(node.model, 0) + node.gpus
        return out

    def _size(self, job: SimJob, rng: np.random.Generator) -> None:
        """A placed job's steady memory per GPU and mean utilisation, from its profile and its node's card."""
        spec = self.nodes[job.node]
        if job.profile == "oversized":
            job.mem_mib = float(rng.uniform(3500, 8500))  # fits a 1g.10gb MIG slice
            job.util = float(rng.uniform(15, 35))
        elif job.profile == "idle":
            job.mem_mib = float(rng.uniform(0.05, 0.2) * spec.mem_mib)
            job.util = 0.0
        elif job.profile == "light":
            job.mem_mib = float(rng.uniform(0.3, 0.6) * spec.mem_mib)
            job.util = float(rng.uniform(25, 50))
        else:
            job.mem_mib = float(rng.uniform(0.6, 0.92) * spec.mem_mib)
            job.util = float(rng.uniform(75, 97))

    # --- the showcase ----------------------------------------------------------------------
    def _pick_showcase_nodes(self) -> tuple[int, ...]:
        """The first two 8-GPU nodes of one model, when the cluster has more nodes besides: the staged layout needs
        a second node of the model to spread and move jobs to, and the random workload somewhere to run meanwhile.
        () when there is no such pair: then nothing is staged."""
        by_model: dict[str, list[int]] = {}
        for n, node in enumerate(self.nodes):
            if node.gpus == 8:
                by_model.setdefault(node.model, []).append(n)
        pair = next((nodes[:2] for nodes in by_model.values() if len(nodes) >= 2), [])
        return tuple(pair) if pair and len(self.nodes) > 2 else ()

    def _showcase_from(self) -> float:
        """When the staged layout begins (epoch seconds); inf when nothing is staged."""
        if not self._showcase_nodes or self.showcase is None:
            return math.inf
        return self.showcase.timestamp() - SHOWCASE_LEAD_S

    def _plant_showcase(self) -> None:
        """Lay out the two showcase nodes by hand from `_showcase_from` to the end of the run (the random workload
        has left them by then). On the first node (A) and the second (B), 8 GPUs each:

        - A0-1 + B0-1: a 4-GPU NVLink job the scheduler spread over both nodes; A has room for all of it (colocate);
        - A2: a notebook holding its GPU at 0% (reclaim); A3: a job using a few GiB of an 80 GiB card (resize);
        - A4: a batch job time-sliced with the `inference` namespace's model server, which is latency-sensitive
          under the default `[placement] latency_sensitive` (separate);
        - A5, B2-3, B4, B5: busy jobs; A6-7 and B6-7 free: 2 GPUs free on each node;
        - a 4-GPU job asking for this model, submitted an hour before the instant and never started: no node has 4
          free, but moving two 1-GPU jobs off one node frees 4 there (consolidate), and its queued GPUs raise its
          team's demand for the model (quota).

        The teams are the site's teams with a share, in order; memory and utilisation are drawn from the profiles
        with a stream of their own, so the seed still varies them and the random workload stays as seeded."""
        if not self._showcase_nodes:
            return
        a, b = self._showcase_nodes
        begin, end = self._showcase_from(), self._t1
        rng = np.random.default_rng([self.seed, 0x5C0A])
        named = [t.name for t in self.teams if t.share > 0] or [t.name for t in self.teams]
        team = lambda i: named[i % len(named)]  # noqa: E731 - the i-th team with a share, cycling

        def put(name: str, namespace: str, owner: str, node: int, gpus: tuple[int, ...], profile: str,
                also_on: tuple[tuple[int, tuple[int, ...]], ...] = (), **extra) -> SimJob:
            job = SimJob(job_id=f"{namespace}/{name}", team=owner, user=f"{owner}-user{1 + len(self.jobs) % 4}",
                         namespace=namespace, pod=f"{name}-0", gpus=len(gpus) + sum(len(g) for _, g in also_on),
                         profile=profile, submit=begin, start=begin, end=end, node=node, gpu_indices=gpus,
                         also_on=also_on, **extra)
            self._size(job, rng)
            self.jobs.append(job)
            return job

        put("ddp-train", team(0), team(0), a, (0, 1), "nvlink", also_on=((b, (0, 1)),))
        put("notebook", team(4), team(4), a, (2,), "idle")
        put("embedding-eval", team(3), team(3), a, (3,), "oversized")
        host = put("batch-eval", team(2), team(2), a, (4,), "light", fraction=0.5)
        guest = put("llm-serving", SERVING_NAMESPACE, SERVING_TEAM, a, (4,), "light", fraction=0.5, guest=True)
        card = self.nodes[a].mem_mib  # the two share one card: their memory and compute add up on it
        host.mem_mib, host.util = float(rng.uniform(0.3, 0.5) * card), float(rng.uniform(25, 40))
        guest.mem_mib, guest.util = float(rng.uniform(0.15, 0.3) * card), float(rng.uniform(20, 35))
        put("finetune-a", team(1), team(1), a, (5,), "busy")
        put("finetune-b", team(3), team(3), b, (2, 3), "busy")
        put("finetune-c", team(0), team(0), b, (4,), "busy")
        put("finetune-d", team(4), team(4), b, (5,), "busy")
        waiting = SimJob(job_id=f"{team(1)}/pretrain", team=team(1), user=f"{team(1)}-user1", namespace=team(1),
                         pod="pretrain-0", gpus=4, profile="nvlink", submit=self.showcase.timestamp() - SHOWCASE_WAIT_S,
                         start=math.inf, end=math.inf, want_model=self.nodes[a].model)
        self.jobs.append(waiting)

    # --- samples -------------------------------------------------------------------------
    def frame(self, times: Sequence[float], step_s: float) -> pa.Table:
        """Samples for every GPU at each epoch-second in `times` (sorted): one row per GPU, and one more for each
        job time-sliced onto a GPU another job holds (as dcgm-exporter repeats a shared GPU's series per pod)."""
        times = np.asarray(times, dtype=float)
        n_t, n_g = len(times), self.gpu_count
        n_jobs = len(self.jobs)
        owner = np.full((n_t, n_g), n_jobs, dtype=np.int64)  # n_jobs = "free" sentinel row
        guest = np.full((n_t, n_g), n_jobs, dtype=np.int64)  # a second job time-sliced onto the GPU
        lo, hi = times[0] if n_t else 0, times[-1] if n_t else 0
        for j, job in enumerate(self.jobs):
            if job.node < 0 or job.end <= lo or job.start > hi:
                continue
            a, b = np.searchsorted(times, job.start, "left"), np.searchsorted(times, job.end, "left")
            cols = np.concatenate([self._node_offset[n] + np.array(g, dtype=np.int64)
                                   for n, g in ((job.node, job.gpu_indices), *job.also_on)])
            if a < b:
                (guest if job.guest else owner)[a:b, cols] = j
        rng = np.random.default_rng([self.seed, int(lo), n_t])
        noise = rng.normal(0.0, 1.0, size=(4, n_t, n_g))
        jobs = self.jobs
        job_util = np.array([j.util for j in jobs] + [0.0])
        job_mem = np.array([j.mem_mib for j in jobs] + [0.0])
        job_nvl = np.array([j.profile == "nvlink" for j in jobs] + [False])
        job_fraction = np.array([j.fraction for j in jobs] + [1.0])  # a free GPU is present whole
        ratios = [activity_ratios(j) for j in jobs]
        sm_per = np.array([r[0] for r in ratios] + [SM_PER_UTIL])
        tensor_per = np.array([r[1] for r in ratios] + [TENSOR_PER_UTIL])
        mem_total = np.array([self.nodes[n].mem_mib for n in self.gpu_node])
        tdp = np.array([self.nodes[n].tdp_w for n in self.gpu_node])
        has_nvlink = np.array([self.nodes[n].nvlink for n in self.gpu_node])
        free = owner == n_jobs
        load = job_util[owner] + job_util[guest]  # time-sliced jobs add up on their card
        util = np.clip(load + np.where(load > 0, 4.0, 0.0) * noise[0], 0, 100)
        util = np.where(free, 0.0, util)
        activity = util / 100.0
        mem_used = np.where(free, 512.0, np.minimum((job_mem[owner] + job_mem[guest]) * (1 + 0.02 * noise[1]),
                                                    mem_total))
        nvl = np.where((job_nvl[owner] | job_nvl[guest]) & has_nvlink, np.abs(1.2e11 + 3e10 * noise[2]), 0.0)
        # a job spread over nodes sends its collectives to the other node through its NIC, which a GPU reaches
        # over PCIe (GPUDirect RDMA): each direction on top of the host copies every GPU makes
        job_spread = np.array([bool(j.also_on) for j in jobs] + [False])
        rdma = np.where(job_spread[owner] | job_spread[guest], np.abs(1.0e10 + 1e9 * noise[2]), 0.0)
        power = tdp * (0.12 + 0.8 * activity) + 3.0 * noise[3]
        faulted = times[:, None] >= self.xid_at[None, :]
        xid = np.where(faulted, self.xid_code[None, :], 0)
        dbe = (faulted & (self.xid_code[None, :] == 48)).astype(np.int64)
        hot = self.runs_hot[None, :]
        throttle = np.where(hot & (util >= 97.0), HW_THERMAL, 0) | np.where(hot & (power > 0.95 * tdp), SW_POWER_CAP, 0)
        # the rows: each GPU at each instant, then (right after its host's row) each guest's
        cells = np.arange(n_t * n_g)
        shared = np.flatnonzero(guest.ravel() != n_jobs)
        if len(shared):
            both = np.concatenate([cells, shared])
            order = np.argsort(both, kind="stable")
            rows, flat = both[order], np.concatenate([owner.ravel(), guest.ravel()[shared]])[order]
        else:
            rows, flat = cells, owner.ravel()
        n_rows = len(rows)
        cell = lambda a: np.asarray(a).ravel()[rows]  # noqa: E731 - a per-instant, per-GPU array, one value per row
        tile = lambda a: np.tile(a, n_t)[rows]  # noqa: E731 - per-GPU constants repeated for each instant
        ts = pd.to_datetime(np.repeat(np.round(times * 1e6).astype(np.int64), n_g)[rows], unit="us", utc=True)
        job_ids = np.array([j.job_id for j in jobs] + [None], dtype=object)
        teams = np.array([_billed_team(j) for j in jobs] + [None], dtype=object)
        spaces = np.array([j.namespace for j in jobs] + [None], dtype=object)
        pods = np.array([j.pod for j in jobs] + [None], dtype=object)
        users = np.array([j.user for j in jobs] + [None], dtype=object)
        node_names = np.array([n.name for n in self.nodes], dtype=object)
        models = np.array([n.model for n in self.nodes], dtype=object)
        model_names = np.array([n.model_name for n in self.nodes], dtype=object)
        activity_f = cell(activity)
        power_f = cell(np.maximum(power, 0.0))
        mem_used_f = cell(mem_used)
        mem_total_f = tile(mem_total)
        dbe_f = cell(dbe)
        unheld = flat == n_jobs
        columns = {
            "ts": pa.array(ts, type=pa.timestamp("us", tz="UTC")),
            "interval_s": np.full(n_rows, float(step_s)),
            "node": tile(node_names[self.gpu_node]),
            "gpu_index": tile(self.gpu_index),
            "gpu_uuid": tile(self.gpu_uuid),
            "gpu_model": tile(models[self.gpu_node]),
            "model_name": tile(model_names[self.gpu_node]),
            "mig_profile": pa.nulls(n_rows, pa.string()),
            "mig_instance": pa.nulls(n_rows, pa.int32()),
            "gpu_fraction": job_fraction[flat],
            "allocated": ~unheld,
            "util_pct": cell(util),
            "sm_active": activity_f * sm_per[flat],
            "sm_occupancy": activity_f * sm_per[flat] * 0.65,
            "tensor_active": activity_f * tensor_per[flat],
            "dram_active": activity_f * 0.4,
            "mem_used_mib": mem_used_f,
            "mem_free_mib": mem_total_f - mem_used_f,
            "mem_reserved_mib": np.full(n_rows, 0.0),
            "mem_total_mib": mem_total_f,
            "power_w": power_f,
            "power_avg_w": power_f,
            "temp_c": 30 + 45 * activity_f,
            "nvlink_tx_bps": cell(nvl),
            "nvlink_rx_bps": cell(nvl),
            "pcie_tx_bps": activity_f * 2.0e9 + cell(rdma),
            "pcie_rx_bps": activity_f * 4.0e9 + cell(rdma),
            "namespace": spaces[flat],
            "pod": pods[flat],
            "container": np.where(unheld, None, "main").astype(object),
            "job_id": job_ids[flat],
            "user": users[flat],
            "team": teams[flat],
            "source": np.full(n_rows, "simulator", dtype=object),
            "xid": cell(xid).astype(np.int32),
            "throttle_reasons": cell(throttle).astype(np.int64),
            "ecc_sbe_total": np.zeros(n_rows, dtype=np.int64),
            "ecc_dbe_total": dbe_f,
            "remapped_rows_corr": np.zeros(n_rows, dtype=np.int64),
            "remapped_rows_uncorr": dbe_f,
            "row_remap_failed": np.zeros(n_rows, dtype=bool),
        }
        columns["nvlink_bps"] = pa.nulls(n_rows, pa.float64())  # read per direction (nvlink_tx/rx_bps)
        columns["dra_claim"] = columns["dra_device"] = pa.nulls(n_rows, pa.string())  # the device plugin, not DRA
        arrays = [pa.array(columns[f.name], type=f.type) if not isinstance(columns[f.name], pa.Array)
                  else columns[f.name] for f in SAMPLE_SCHEMA]
        return pa.Table.from_arrays(arrays, schema=SAMPLE_SCHEMA)

    def history(self, start: datetime, end: datetime, step_s: float = 60.0,
                chunk_s: float = 86400.0) -> Iterator[pa.Table]:
        """Samples on an epoch-aligned grid over [start, end), one table per chunk."""
        first = math.ceil(start.timestamp() / step_s) * step_s
        stop = end.timestamp()
        t = first
        while t < stop:
            upto = min(t + chunk_s, stop)
            times = np.arange(t, upto, step_s)
            if len(times):
                yield self.frame(times, step_s)
            t = upto

    def jobs_frame(self, until: datetime) -> pd.DataFrame:
        """The job records a scheduler would know at `until`: submitted jobs only, future ends unknown."""
        now = until.timestamp()
        rows = []
        for job in self.jobs:
            if job.submit > now:
                continue
            node = self.nodes[job.node] if job.node >= 0 else None
            started = job.start <= now
            rows.append({
                "job_id": job.job_id, "team": _billed_team(job),
                "user": job.user, "namespace": job.namespace, "pod": job.pod,
                "node": node.name if node and started else None,
                "gpu_model": job.want_model or (node.model if node and started else None),  # what it asks for
                "gpus": job.gpus,
                "submit_ts": _ts(job.submit), "start_ts": _ts(job.start) if started else None,
                "end_ts": _ts(job.end) if job.end <= now else None,
                "state": _outcome(job.job_id) if job.end <= now else ("running" if started else "pending"),
                "restarts": 1 if _draw(job.job_id, "restart") < 0.05 else 0, "source": "simulator",
                "name": _job_name(job),
            })
        return pd.DataFrame(rows)

    def services(self) -> list[Service]:
        """The inference services its serving jobs run (collector/apps/simulated.py): the `vllm-serve` jobs and the
        showcase's time-sliced `llm-serving`."""
        return [service_of(j.job_id, j.namespace, j.pod, j.start, j.end, j.util, j.guest) for j in self.jobs
                if j.namespace == SERVING_NAMESPACE or _job_name(j) == "vllm-serve"]

    def team_frame(self) -> pd.DataFrame:
        totals = self.site_quotas().groupby("team")["guarantee_gpus"].sum().to_dict()
        return pd.DataFrame([{"team": t.name, "share": t.share, "quota_gpus": int(totals.get(t.name, 0))}
                             for t in self.teams if t.name != "default"])

    def quota_frame(self) -> pd.DataFrame:
        """The demo site's guarantees per GPU model, the quotas its scheduler admits under (`site_quotas`)."""
        return self.site_quotas()

    def site_quotas(self) -> pd.DataFrame:
        """Guarantees that cover every GPU: the GPUs are shared out to the teams with a quota in proportion to
        their `quota_gpus` (largest remainder), and each team's total over the models in proportion to the models'
        GPUs, rounded so every model's guarantees add up to its GPUs and every team's to its total (a Kueue cohort
        admits at most its queues' nominal quota: a GPU under no quota is a GPU nobody can use). Limit: the
        model's GPUs (idle GPUs are borrowable). Except `unquoted_gpus`: those GPUs of a model no guarantee covers."""
        per_model = self.capacity()
        quoted = {m: max(0, c - dict(self.unquoted_gpus).get(m, 0)) for m, c in per_model.items()}
        teams = [t for t in self.teams if t.name != "default" and t.quota_gpus > 0]
        if not teams:
            return pd.DataFrame(columns=["team", "gpu_model", "guarantee_gpus", "limit_gpus"])
        totals = _apportion(sum(quoted.values()), {t.name: float(t.quota_gpus) for t in teams})
        cells = _rounded_matrix(totals, quoted)
        rows = [{"team": t, "gpu_model": m, "guarantee_gpus": float(g), "limit_gpus": float(per_model[m])}
                for (t, m), g in sorted(cells.items()) if g]
        return pd.DataFrame(rows, columns=["team", "gpu_model", "guarantee_gpus", "limit_gpus"])


def _mean_size(sizes: np.ndarray, capacity: int) -> float:
    """The mean GPUs a job asks of a model of `capacity` GPUs (sizes over half of it asked as half)."""
    return float(np.minimum(sizes, max(1, capacity // 2)).mean())


def _apportion(total: int, weights: dict[str, float]) -> dict[str, int]:
    """`total` whole units shared in proportion to `weights` (largest remainder; ties by name)."""
    whole_weight = sum(weights.values())
    exact = {k: total * w / whole_weight for k, w in weights.items()}
    out = {k: math.floor(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: (out[k] - exact[k], k))[:total - sum(out.values())]:
        out[k] += 1
    return out


def _rounded_matrix(rows: dict[str, int], cols: dict[str, int]) -> dict[tuple[str, str], int]:
    """Whole numbers per (row, column), each near row x column / total, adding up to both margins exactly (the
    margins have the same sum): floors first, then one more to the cells with the largest remainders whose row and
    column both still lack some."""
    total = sum(cols.values())
    exact = {(r, c): rows[r] * cols[c] / total for r in rows for c in cols}
    cells = {k: math.floor(v + 1e-9) for k, v in exact.items()}
    need_r = {r: rows[r] - sum(cells[(r, c)] for c in cols) for r in rows}
    need_c = {c: cols[c] - sum(cells[(r, c)] for r in rows) for c in cols}
    for r, c in sorted(exact, key=lambda k: (cells[k] - exact[k], k)):
        if need_r[r] > 0 and need_c[c] > 0:
            cells[(r, c)] += 1
            need_r[r] -= 1
            need_c[c] -= 1
    for r in rows:  # what the remainders could not place: any cell whose row and column still lack
        for c in cols:
            extra = min(need_r[r], need_c[c])
            if extra > 0:
                cells[(r, c)] += extra
                need_r[r] -= extra
                need_c[c] -= extra
    return cells


def _billed_team(job: SimJob) -> str:
    """The team the collectors would bill: the same attribution rule as for real pods."""
    return _ATTRIBUTOR.team_for(namespace=job.namespace)


def _ts(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=timezone.utc)


class SimulatorSource(Source):
    """Live view of a ClusterSimulator: each collect() returns the samples for 'now'.

    `node` narrows it to one node, as a per-node agent would see. With `replay_start`, step k
    is sampled at replay_start + k * interval instead of the wall clock, so what an agent
    produced can be recomputed exactly from the sequence numbers it used (fault tests).
    """

    def __init__(self, simulator: ClusterSimulator, interval_s: float = 15.0, clock=None,
                 node: str | None = None, replay_start: float | None = None) -> None:
        self.simulator = simulator
        self.name = f"simulator:{node}" if node else "simulator"
        self.interval_s = interval_s
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self.node = node
        self.replay_start = replay_start
        if node is not None and node not in {n.name for n in simulator.nodes}:
            raise InputError(f"simulated cluster has no node {node!r}")

    def collect(self) -> pa.Table:
        return self._frame(self.clock().timestamp())

    def collect_step(self, step: int) -> pa.Table:
        """Samples for replay step `step`; the wall clock when not replaying."""
        if self.replay_start is None:
            return self.collect()
        return self._frame(self.replay_start + step * self.interval_s)

    def topology(self) -> list[NodeTopology]:
        """Each simulated node's GPUs, islands as a dcgm page of its model would give them (inferred from the
        board: the DGX/HGX nodes one NVSwitch island, the L40S and L4 cards one island per GPU)."""
        sim = self.simulator
        out = []
        for n, spec in enumerate(sim.nodes):
            if self.node is not None and spec.name != self.node:
                continue
            mine = np.nonzero(sim.gpu_node == n)[0]
            gpus = [{"uuid": str(sim.gpu_uuid[i]), "index": int(sim.gpu_index[i]), "gpu_model": spec.model,
                     "model_name": spec.model_name, "pci_bus_id": f"00000000:{0x18 + int(sim.gpu_index[i]):02x}:00.0",
                     "nvlink_links": 18 if spec.nvlink else None} for i in mine]
            out.append(inferred_topology(spec.name, "simulator", gpus))
        return out

    def _frame(self, when: float) -> pa.Table:
        table = self.simulator.frame([when], self.interval_s)
        if self.node is not None:
            table = table.filter(pc.equal(table["node"], self.node))
        SAMPLES_READ.labels(source="simulator").inc(table.num_rows)
        return table


def cluster_of(nodes: int, seed: int = 7, days: float = 1.0, now: datetime | None = None) -> ClusterSimulator:
    """A homogeneous simulated cluster of `nodes` 8-GPU H100 nodes (agents, load tests)."""
    now = now or datetime.now(timezone.utc)
    specs = tuple(NodeSpec(f"node-{i:04d}", "H100") for i in range(nodes))
    return ClusterSimulator(start=now - timedelta(days=days), end=now + timedelta(days=days), seed=seed, nodes=specs)


def default_simulator(days: float = 14.0, seed: int = 7, now: datetime | None = None,
                      future_days: float = 2.0, showcase: bool = True) -> ClusterSimulator:
    """The demo's cluster: `days` of history before `now` and `future_days` to collect live after it. With
    `showcase`, the layout from a few hours before `now` to the end gives every kind of advice its cause (module
    docstring), so the demo shows them all from its first minute, whatever the seed."""
    now = now or datetime.now(timezone.utc)
    return ClusterSimulator(start=now - timedelta(days=days), end=now + timedelta(days=future_days), seed=seed,
                            showcase=now if showcase else None)


# how the simulated jobs end, in shares of the jobs that ended (the rest completed): what a busy site sees
OUTCOME_SHARES = (("failed", 0.08), ("timeout", 0.03), ("preempted", 0.02), ("out_of_memory", 0.02),
                  ("cancelled", 0.04))


def _draw(job_id: str, what: str) -> float:
    """A number in [0, 1) fixed by the job and what is drawn, so every read of the history agrees."""
    return int(hashlib.sha256(f"{job_id}\0{what}".encode()).hexdigest()[:8], 16) / 2 ** 32


# the share of its GPU_UTIL a job's SMs and tensor pipes are active: most jobs keep their SMs busy while a kernel
# runs; a starved one (a data loader that cannot keep up) runs one small kernel after another, so GPU_UTIL is high
# and SM activity low; some training jobs compute in FP32 and leave the tensor pipes idle
SM_PER_UTIL, STARVED_SM_PER_UTIL = 0.85, 0.12
TENSOR_PER_UTIL, FP32_TENSOR_PER_UTIL = 0.45, 0.01
STARVED_SHARE, FP32_SHARE = 0.15, 0.15  # of the busy and NVLink jobs, fixed by job id


SERVING_SM_PER_UTIL = 0.3  # LLM decode at the batch sizes a chat service runs: memory-bound, a third of the SMs


def activity_ratios(job: SimJob) -> tuple[float, float]:
    """(SM active, tensor active) per unit of GPU_UTIL for `job`, fixed by its id: starved and FP32 jobs among the
    busy ones, so the demo shows every efficiency flag; serving jobs decode with few SMs active."""
    if job.namespace == SERVING_NAMESPACE or _job_name(job) == "vllm-serve":
        return SERVING_SM_PER_UTIL, SERVING_SM_PER_UTIL * TENSOR_PER_UTIL / SM_PER_UTIL
    if job.profile not in ("busy", "nvlink"):
        return SM_PER_UTIL, TENSOR_PER_UTIL
    draw = _draw(job.job_id, "activity")
    if draw < STARVED_SHARE:
        return STARVED_SM_PER_UTIL, STARVED_SM_PER_UTIL * TENSOR_PER_UTIL / SM_PER_UTIL
    if draw < STARVED_SHARE + FP32_SHARE:
        return SM_PER_UTIL, FP32_TENSOR_PER_UTIL
    return SM_PER_UTIL, TENSOR_PER_UTIL


def _job_name(job: SimJob) -> str:
    """A name like the ones users give, by profile, so the demo's jobs fall into every workload class
    (collector/jobs/classes.py infer_class): NVLink jobs pretrain, other multi-GPU jobs fine-tune, light and idle
    single GPUs are notebooks and shells, busy single GPUs serve, run batch evaluations or agent rollouts (a third
    each, fixed by job id)."""
    if job.gpus > 1 or job.profile == "nvlink":
        return "pretrain" if job.profile == "nvlink" else "finetune-lora"
    draw = _draw(job.job_id, "name")
    if job.profile in ("light", "idle"):
        return "jupyter" if draw < 0.5 else "bash"
    return "vllm-serve" if draw < 1 / 3 else "eval-sweep" if draw < 2 / 3 else "agent-rollout"


def _outcome(job_id: str) -> str:
    draw, edge = _draw(job_id, "outcome"), 0.0
    for outcome, share in OUTCOME_SHARES:
        edge += share
        if draw < edge:
            return outcome
    return "completed"
