"""Each user's own jobs (issue 44 item 5): per-user cost and efficiency for a team lead, and a note per job owner
for the jobs that wasted GPUs, with what to change, the way Princeton's jobstats writes to a job's owner.

Why per (team, user) and never per user alone: a user who works in two teams gets one note per team, each naming
only that team's jobs, so a note mailed to a team's member or read with a team's token never names another team's
job. A job without an owner (no user in its record) is counted, never guessed onto someone.

A finding rests on measured figures only: an idle finding on the GPU-hours with a utilisation reading (a job with
none gets none), an oversized one on the peak memory read against the card's, a starved one on the profiling flags
(analytics/efficiency.py) where the readings cover enough of the job. Dollars a finding cannot put a figure on are
null, never 0.
"""
from __future__ import annotations

from datetime import datetime

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.efficiency import EFFICIENCY_FLAGS, job_efficiency
from gpuledger.analytics.records import number_or_none
from gpuledger.analytics.waste import WASTE_FLAG_IDLE_SHARE, job_table, smallest_fit

MAX_JOBS = 100_000  # jobs of one window read for the views (a 1,000-GPU week holds about 25,000)
# what a note says of a job: the closed set of findings
FINDINGS = {
    "idle": "its GPUs sat idle for most of the GPU-hours measured",
    "oversized": "its peak memory used a small share of the card",
    **{flag: text for flag, text in EFFICIENCY_FLAGS.items()},
}
CHANGES = {
    "idle": "ask for fewer GPUs, or give them back when the work pauses (end the notebook, set a time limit, "
            "use a queue for interactive work)",
    "oversized": "ask for a smaller shape",
    "input_pipeline_bound": "feed the GPU faster: more data-loader workers, pinned memory, prefetching, data on "
                            "local storage",
    "communication_bound": "keep the job's GPUs within one node or NVLink island, or change the parallelism layout",
    "memory_bandwidth_bound": "use fused kernels or a lower precision that moves fewer bytes",
    "tensor_cores_idle": "train in BF16/FP16 mixed precision or enable TF32 so the tensor cores do the math",
}


def _jobs(store, start: datetime, end: datetime, config: Config, team: str | None, p95: bool) -> pd.DataFrame:
    """Every job of the window (`p95`: with its p95 utilisation, which only the oversized finding needs)."""
    jobs = job_table(store, start, end, team, None, MAX_JOBS, config.waste.oversized_mem_fraction, p95=p95,
                     profiling=False)
    measured = jobs["gpu_hours"] * jobs["util_coverage"].fillna(0.0)
    # each job to the cent, as GET /v1/jobs shows it: a user's cost is then the sum of the jobs listed
    return jobs.assign(measured_gpu_hours=measured, idle_gpu_hours=jobs["idle_share"] * measured,
                       cost_usd=jobs["cost_usd"].round(2))


def user_table(store, start: datetime, end: datetime, config: Config, team: str | None = None) -> pd.DataFrame:
    """Per team and user: jobs, GPU-hours, cost, the mean utilisation over the measured GPU-hours (null: none
    measured), how much was measured, idle GPU-hours (null: none measured), and the jobs flagged as waste with their
    cost. Most costly first; jobs without a user are one row with `user` null."""
    jobs = _jobs(store, start, end, config, team, p95=False)
    if jobs.empty:
        return pd.DataFrame(columns=["team", "user", "jobs", "gpu_hours", "cost_usd", "mean_util_pct",
                                     "util_coverage", "idle_gpu_hours", "flagged_jobs", "flagged_cost_usd"])
    jobs = jobs.assign(util_hours=jobs["mean_util_pct"].fillna(0.0) * jobs["measured_gpu_hours"],
                       flagged_cost=jobs["cost_usd"].where(jobs["waste"], 0.0))
    users = jobs.groupby(["team", "user"], dropna=False).agg(
        jobs=("job_id", "count"), gpu_hours=("gpu_hours", "sum"), cost_usd=("cost_usd", lambda s: s.sum(min_count=1)),
        measured=("measured_gpu_hours", "sum"), util_hours=("util_hours", "sum"),
        idle_gpu_hours=("idle_gpu_hours", lambda s: s.sum(min_count=1)), flagged_jobs=("waste", "sum"),
        flagged_cost_usd=("flagged_cost", "sum")).reset_index()
    measured = users["measured"].where(users["measured"] > 0)
    users["mean_util_pct"] = users["util_hours"] / measured
    users["util_coverage"] = users["measured"] / users["gpu_hours"].where(users["gpu_hours"] > 0)
    users["idle_gpu_hours"] = users["idle_gpu_hours"].where(measured.notna())
    users["flagged_jobs"] = users["flagged_jobs"].astype(int)
    return (users.drop(columns=["measured", "util_hours"]).sort_values(["cost_usd", "gpu_hours"], ascending=False)
            .reset_index(drop=True))


def _cents(usd: float) -> float:
    """Dollars to the cent, as a note shows them: its total is the sum of the figures it lists."""
    return round(usd, 2)


def _profiled(row) -> str:
    """The profiling figures a starved finding rests on, in words."""
    parts = [(label, number_or_none(getattr(row, name, None))) for label, name in
             (("SM active", "sm_active"), ("DRAM active", "dram_active"), ("tensor active", "tensor_active"))]
    util = number_or_none(getattr(row, "util_on_profiled_pct", None))
    said = [f"{label} {value:.0%}" for label, value in parts if value is not None]
    return ", ".join(said + ([f"GPU_UTIL {util:.0f}%"] if util is not None else []))


def _findings(job, flagged, config: Config) -> list[dict]:
    """What wasted GPUs in one job: each finding with its evidence, the dollars it cost (null: not a figure one can
    put on it) and what to change."""
    out = []
    idle_share, coverage = number_or_none(job.idle_share), number_or_none(job.util_coverage)
    if idle_share is not None and coverage and idle_share >= WASTE_FLAG_IDLE_SHARE:
        out.append({"finding": "idle", "evidence": f"{idle_share:.0%} of its {job.measured_gpu_hours:.1f} measured "
                    f"GPU-hours idle (mean utilisation {number_or_none(job.mean_util_pct) or 0:.0f}%)",
                    "wasted_usd": _cents(float(job.cost_usd) * idle_share * coverage), "change": CHANGES["idle"]})
    peak, total = number_or_none(job.peak_mem_mib), number_or_none(job.mem_total_mib)
    p95 = number_or_none(job.p95_util_pct)
    if peak is not None and total and p95 is not None and peak / total < config.waste.oversized_mem_fraction and \
            not (idle_share is not None and idle_share >= WASTE_FLAG_IDLE_SHARE):
        # only where a named shape holds both its peak memory and its p95 compute: advice with nothing smaller to
        # ask for is no advice
        fit = smallest_fit(job.gpu_model, peak, p95)
        if fit is not None:
            out.append({"finding": "oversized",
                        "evidence": f"peak memory {peak / 1024:.1f} GiB of the card's {total / 1024:.0f} GiB, p95 "
                                    f"utilisation {p95:.0f}%",
                        "wasted_usd": _cents(float(job.cost_usd) * (1.0 - fit["gpu_fraction"]))
                        if fit["gpu_fraction"] < 1.0 else None,
                        "change": f"{CHANGES['oversized']}: {fit['target']} holds that memory and compute"})
    for flag in (flagged.flags if flagged is not None else []):
        out.append({"finding": flag, "evidence": f"{FINDINGS[flag]} ({_profiled(flagged)})", "wasted_usd": None,
                    "change": CHANGES[flag]})
    return out


def owner_notes(store, start: datetime, end: datetime, config: Config, team: str | None = None,
                user: str | None = None) -> dict:
    """A note per (team, user) owning jobs that wasted GPUs in [start, end): each job with its findings, the note's
    GPU-hours, cost and the dollars wasted where known; and how many such jobs have no owner to write to."""
    jobs = _jobs(store, start, end, config, team, p95=True)
    flags = job_efficiency(store, start, end, config.efficiency, team, MAX_JOBS)
    flagged = {row.job_id: row for row in flags.itertuples(index=False)}
    notes: dict[tuple[str, str], dict] = {}
    unowned = 0
    for job in jobs.itertuples(index=False):
        if user is not None and job.user != user:
            continue
        findings = _findings(job, flagged.get(job.job_id), config)
        if not findings:
            continue
        if job.user is None or pd.isna(job.user):
            unowned += 1
            continue
        note = notes.setdefault((job.team, job.user), {"team": job.team, "user": job.user, "jobs": [],
                                                       "gpu_hours": 0.0, "cost_usd": 0.0, "wasted_usd": 0.0,
                                                       "unpriced_findings": 0})
        wasted = [f["wasted_usd"] for f in findings if f["wasted_usd"] is not None]
        note["jobs"].append({"job_id": job.job_id, "gpu_model": job.gpu_model, "gpus": int(job.gpus),
                             "first_ts": job.first_ts, "last_ts": job.last_ts, "gpu_hours": float(job.gpu_hours),
                             "cost_usd": float(job.cost_usd), "findings": findings})
        note["gpu_hours"] += float(job.gpu_hours)
        note["cost_usd"] += float(job.cost_usd)
        note["wasted_usd"] = round(note["wasted_usd"] + sum(wasted), 2)
        note["unpriced_findings"] += len(findings) - len(wasted)
    for note in notes.values():  # the most wasteful job first
        note["jobs"].sort(key=lambda j: -sum(f["wasted_usd"] or 0.0 for f in j["findings"]))
    ordered = sorted(notes.values(), key=lambda n: (-n["wasted_usd"], n["team"], n["user"]))
    return {"notes": ordered, "jobs_without_owner": unowned}


def note_text(note: dict, start: datetime, end: datetime) -> str:
    """One note as Markdown, for mail and files: every name in it came from telemetry, so the caller escapes it
    where it becomes HTML."""
    lines = [f"# Your GPU jobs in team {note['team']}, {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC", "",
             f"{len(note['jobs'])} of your jobs wasted GPUs: {note['gpu_hours']:.1f} GPU-hours, "
             f"${note['cost_usd']:,.2f}, of which ${note['wasted_usd']:,.2f} wasted by the figures below"
             + (f" ({note['unpriced_findings']} finding(s) without a dollar figure)" if note["unpriced_findings"]
                else "") + ".", ""]
    for job in note["jobs"]:
        lines.append(f"## Job {job['job_id']}: {job['gpus']} x {job['gpu_model']}, {job['gpu_hours']:.1f} GPU-hours, "
                     f"${job['cost_usd']:,.2f}")
        for f in job["findings"]:
            cost = f" (${f['wasted_usd']:,.2f})" if f["wasted_usd"] is not None else ""
            lines.append(f"- **{f['finding']}**{cost}: {f['evidence']}. What to change: {f['change']}.")
        lines.append("")
    return "\n".join(lines)
