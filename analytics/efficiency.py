"""What jobs achieve on the GPUs they hold, beyond GPU_UTIL: SM activity, tensor and DRAM activity, interconnect bytes.

Why: GPU_UTIL is the share of time at least one kernel ran. A data loader that feeds one small kernel at a time keeps
it at 100% while the SMs sit mostly idle, so a job can look perfectly efficient and achieve a twentieth of the card.
The profiling readings (DCGM's DCP fields, NVML's GPM metrics) say what the SMs, tensor pipes and memory did; the
rollups keep, per field, the GPU-seconds weighted by the reading and the GPU-seconds with a reading, so a mean is taken
over what was measured and a GPU that never reports a field has no value for it (not zero).

The flags are a closed set (EFFICIENCY_FLAGS), each with the evidence it rests on and the thresholds of
`[efficiency]`; a job whose readings cover too little of its GPU-hours gets no flag and a note saying so.
"""
from __future__ import annotations

from datetime import datetime

import pandas as pd

from gpuledger.analytics.config import EfficiencyConfig
from gpuledger.analytics.cost import PRICED
from gpuledger.analytics.records import number_or_none
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import PROFILE_MEANS, measured
from gpuledger.collector.gpu_catalog import has_tensor_cores
from gpuledger.collector.jobs.classes import WORKLOAD_CLASSES
from gpuledger.collector.samples import UNATTRIBUTED

# what a flag says, and what a scheduler or a team can do about it
EFFICIENCY_FLAGS = {
    "input_pipeline_bound": "busy by GPU_UTIL but the SMs mostly wait, with little interconnect traffic: the data "
                            "loader, storage or CPU preprocessing cannot keep the GPU fed",
    "communication_bound": "busy by GPU_UTIL but the SMs mostly wait while NVLink/PCIe traffic is high: collective "
                           "communication dominates (check the topology and the parallelism layout)",
    "memory_bandwidth_bound": "DRAM is busy while the SMs are not: the kernels wait on memory bandwidth",
    "tensor_cores_idle": "a training job on a tensor-core card whose tensor pipes are idle: it computes in FP32 "
                         "without TF32/BF16/FP16, or without the operations that use them",
}
# the classes whose math belongs on the tensor pipes
TRAINING_CLASSES = tuple(c for c in WORKLOAD_CLASSES if c in ("training", "fine_tuning"))
# the classes "busy but starved" does not apply to: a chat service decoding at small batches or a notebook is not
# fed by an input pipeline (their latency and idle time are judged elsewhere)
NOT_FED = tuple(c for c in WORKLOAD_CLASSES if c in ("online_inference", "interactive"))
NO_PROFILING = "no profiling readings (SM activity): the GPU or its exporter does not report them"



def job_efficiency(store: Store, start: datetime, end: datetime, thresholds: EfficiencyConfig,
                   team: str | None = None, limit: int = 500) -> pd.DataFrame:
    """One row per job of [start, end) with its profiling means (null where never read), the coverage they rest on,
    interconnect GB/s per GPU, and its flags (a list of EFFICIENCY_FLAGS names) with `note` saying why a job has none
    where the evidence is short. Most costly first."""
    sql = f"""
        WITH billed AS (
            SELECT job_id, any_value(owner(team, $unattributed)) AS team, arg_max(gpu_model, gpu_s) AS gpu_model,
                   count(DISTINCT gpu_uuid || coalesce(mig_instance::VARCHAR, '')) AS gpus,
                   sum(gpu_hours) AS gpu_hours, sum(cost_usd) AS cost_usd,
                   {measured("sum(used_gpu_s) / nullif(sum(util_gpu_s), 0) * 100.0")} AS mean_util_pct,
                   {PROFILE_MEANS},
                   (coalesce(sum(nvlink_bytes), 0) + coalesce(sum(pcie_bytes), 0)) / 1e9
                       / nullif(sum(gpu_s), 0) AS interconnect_gbps_per_gpu
            FROM {PRICED}
            WHERE allocated AND job_id IS NOT NULL AND ($team IS NULL OR owner(team, $unattributed) = $team)
            GROUP BY job_id)
        SELECT billed.*, j.workload_class FROM billed LEFT JOIN jobs j USING (job_id)
        ORDER BY cost_usd DESC, gpu_hours DESC, job_id LIMIT $limit"""
    jobs = store.query_usage(sql, {"start": start, "end": end, "team": team, "limit": limit,
                                   "unattributed": UNATTRIBUTED})
    judged = [flags_of(row, thresholds) for row in jobs.itertuples(index=False)]
    jobs["flags"] = [flags for flags, _ in judged]
    jobs["note"] = [note for _, note in judged]
    return jobs


def flags_of(job: object, t: EfficiencyConfig) -> tuple[list[str], str | None]:
    """The efficiency flags of one job row (attributes as job_efficiency gives them) and, when it has none for want
    of evidence, why. Every flag rests on readings covering at least `min_coverage` of the job's GPU-hours."""
    coverage = number_or_none(getattr(job, "profiling_coverage", None))
    if coverage is None or coverage <= 0:
        return [], NO_PROFILING
    if coverage < t.min_coverage:
        return [], f"SM activity read on {coverage:.0%} of its GPU-hours, under the {t.min_coverage:.0%} a flag needs"
    flags: list[str] = []
    sm = number_or_none(job.sm_active)
    util = number_or_none(job.util_on_profiled_pct)
    dram = number_or_none(job.dram_active)
    starved = sm is not None and sm < t.starved_sm_active
    if starved and dram is not None and dram >= t.memory_bound_dram:
        flags.append("memory_bandwidth_bound")
    elif starved and util is not None and util >= t.starved_util_pct and job.workload_class not in NOT_FED:
        comm = number_or_none(job.interconnect_gbps_per_gpu)
        flags.append("communication_bound" if comm is not None and comm >= t.comm_gbps_per_gpu
                     else "input_pipeline_bound")
    tensor = number_or_none(job.tensor_active)
    if (tensor is not None and tensor < t.tensor_idle_max and job.workload_class in TRAINING_CLASSES
            and has_tensor_cores(job.gpu_model) and sm is not None and sm >= t.starved_sm_active):
        flags.append("tensor_cores_idle")
    return flags, None


def team_efficiency(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per team: the profiling means over its allocated GPU-seconds with a reading, the coverage, GPU_UTIL on the
    same samples, and the GPU-hours of its jobs under each flag come from `job_efficiency` (callers join them)."""
    sql = f"""
        SELECT owner(team, $unattributed) AS team, sum(gpu_s) / 3600.0 AS gpu_hours,
               {measured("sum(used_gpu_s) / nullif(sum(util_gpu_s), 0) * 100.0")} AS mean_util_pct, {PROFILE_MEANS}
        FROM usage_between($start, $end, $fine, $mwm, $hwm, $idle_pct)
        WHERE allocated GROUP BY 1 ORDER BY gpu_hours DESC"""
    return store.query_usage(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED})


def flagged_by_team(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per team and flag: the jobs and GPU-hours flagged (from `job_efficiency`)."""
    rows = [{"team": j.team, "flag": f, "gpu_hours": j.gpu_hours, "cost_usd": j.cost_usd}
            for j in jobs.itertuples(index=False) for f in j.flags]
    frame = pd.DataFrame(rows, columns=["team", "flag", "gpu_hours", "cost_usd"])
    return (frame.groupby(["team", "flag"], as_index=False)
            .agg(jobs=("gpu_hours", "size"), gpu_hours=("gpu_hours", "sum"), cost_usd=("cost_usd", "sum")))


def running_jobs(store: Store, start: datetime, end: datetime, latest: datetime) -> set[str]:
    """The jobs of [start, end) whose evidence reaches `latest`: the ones still running, that advice can change."""
    running = store.query_usage(
        "SELECT DISTINCT job_id FROM usage_between($start, $end, $fine, $mwm, $hwm, $idle_pct) "
        "WHERE allocated AND job_id IS NOT NULL AND end_ts >= $latest", {"start": start, "end": end, "latest": latest})
    return set(running["job_id"])
