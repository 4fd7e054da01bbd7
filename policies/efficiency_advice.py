"""Efficiency advice: a running job whose profiling readings say it is bound by something other than the GPU.

Why: reclaim and resize act on GPUs held idle or too big; a job at 100% GPU_UTIL whose SMs are mostly waiting holds
the right GPU and wastes most of it all the same, and only its owners can fix that (more data-loader workers, a
better parallelism layout, BF16). The advice names the bottleneck from the flags of analytics/efficiency.py, with the
readings it rests on, and prices what the GPUs achieve none of: the job's cost per hour times the share of the SMs
left waiting (an estimate a finance team can weigh, not a saving anyone can bank until the job is fixed).
"""
from __future__ import annotations

from datetime import datetime


from gpuledger.analytics.config import Config
from gpuledger.analytics.efficiency import EFFICIENCY_FLAGS, job_efficiency, running_jobs
from gpuledger.analytics.records import number_or_none
from gpuledger.analytics.store import Store
from gpuledger.policies.quota import HOURS_PER_WEEK
from gpuledger.policies.recommendation import Recommendation, known_evidence

WHAT_TO_DO = {
    "input_pipeline_bound": "add data-loader workers, prefetch and pin memory, or move preprocessing off the CPU",
    "communication_bound": "keep the job inside one NVLink island, overlap communication with compute, or use a "
                           "parallelism layout that moves less data",
    "memory_bandwidth_bound": "fuse kernels or raise arithmetic intensity (larger batches, flash attention)",
    "tensor_cores_idle": "compute in BF16/FP16 (mixed precision) or enable TF32, so matrix math uses tensor cores",
}
assert set(WHAT_TO_DO) == set(EFFICIENCY_FLAGS)
MIN_GPU_HOURS = 0.5  # a job with less evidence than this is shown flagged, not advised (its $/week would be a guess)


def efficiency_advice(store: Store, config: Config, start: datetime, at: datetime,
                      latest: datetime) -> list[Recommendation]:
    """One `efficiency` recommendation per flag of each job still running at `latest`."""
    jobs = job_efficiency(store, start, at, config.efficiency, limit=1000)
    if jobs.empty:
        return []
    out = []
    alive = running_jobs(store, start, at, latest)
    sized = jobs["job_id"].isin(alive) & (jobs["gpu_hours"] >= MIN_GPU_HOURS)
    for job in jobs[sized].itertuples(index=False):
        for flag in job.flags:
            hours = float(job.gpu_hours) / max(int(job.gpus), 1)
            per_hour = float(job.cost_usd) / max(hours, 1e-9) if job.cost_usd else None
            waiting = 1.0 - float(job.sm_active) if flag != "tensor_cores_idle" else None
            effect = per_hour * waiting * HOURS_PER_WEEK if per_hour is not None and waiting is not None else None
            out.append(Recommendation(
                kind="efficiency", team=str(job.team), gpu_model=str(job.gpu_model), job_id=str(job.job_id),
                action={"bottleneck": flag, "do": WHAT_TO_DO[flag], "gpus": int(job.gpus)},
                evidence=known_evidence({
                    "mean_util_pct": number_or_none(job.util_on_profiled_pct),
                    **{f: number_or_none(getattr(job, f)) for f in ("sm_active", "sm_occupancy", "tensor_active",
                                                                    "dram_active", "profiling_coverage",
                                                                    "interconnect_gbps_per_gpu")},
                          "workload_class": job.workload_class, "gpu_hours": float(job.gpu_hours),
                          "cost_usd": float(job.cost_usd), "cost_per_hour_usd": per_hour,
                          "effect_usd_per_week": effect, "signal": "sm_active",
                          "thresholds": {k: v for k, v in vars(config.efficiency).items()}}),
                reason=_reason(job, flag, effect)))
    return out


def _reason(job: object, flag: str, effect: float | None) -> str:
    sm, util = number_or_none(job.sm_active), number_or_none(job.util_on_profiled_pct)
    said = (f"{job.job_id} on {int(job.gpus)} × {job.gpu_model}: " + EFFICIENCY_FLAGS[flag]
            + (f" (GPU_UTIL {util:.0f}%, SM active {sm:.0%}" if sm is not None and util is not None else " (")
            + (f", tensor active {float(job.tensor_active):.1%}" if flag == "tensor_cores_idle" else "") + ")")
    return said + (f"; the SMs' waiting time costs ${effect:,.0f}/week" if effect else "")


