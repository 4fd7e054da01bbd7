"""Waste: GPUs held but idle for long stretches, and jobs whose memory footprint is a fraction of the card.

Idle stretches are found per GPU and job as runs of consecutive samples below the idle
threshold (gaps-and-islands, stitched from the hour and minute rollups), so a job that is busy
for a minute every hour still counts its long idle stretches. Short pauses under `idle_minutes` are normal and ignored.

Idle is a utilisation reading under the threshold: time without a reading (the Philly and Helios traces, a failed
read) is unknown, so it is never an idle stretch and ends one; utilisation figures of jobs come from the samples
with a reading only, with `util_coverage` (the share of the job's GPU-hours measured), null where none was.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from gpuledger.analytics.config import WasteConfig
from gpuledger.analytics.cost import PRICED
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.dra_claims import claims_by_job
from gpuledger.analytics.usage import (COMPUTE_NEED_MEANS, NO_UTILISATION, PROFILE_MEANS, RATE, USAGE,
                                      check_idle_threshold, pooled, price_join)
from gpuledger.collector.gpu_catalog import mig_fraction, mig_profiles, smaller_cards
from gpuledger.collector.samples import UNATTRIBUTED


def idle_runs(store: Store, start: datetime, end: datetime, thresholds: WasteConfig) -> pd.DataFrame:
    """Stretches where an allocated GPU stayed under `idle_util_pct` for at least `idle_minutes` (`thresholds`).

    Read from the rollups: each segment of a GPU and job (an hour row for whole hours, else a minute row) either
    is idle throughout (it joins the stretch in progress) or holds busy samples, whose idle lead closes the
    stretch before and whose idle tail opens the next. A stretch inside an hour, between busy samples, is listed
    in its hour row; one inside a minute is shorter than the minute `idle_minutes` must at least be. Samples
    without a utilisation reading count as busy here (they end a stretch): only measured idleness is a stretch."""
    check_idle_threshold(store, thresholds.idle_util_pct)
    sql = f"""
        WITH candidates AS (  -- only a GPU and job idle this long in all can hold such a stretch (a tenth, typically)
            SELECT gpu_uuid, coalesce(mig_instance, -1) AS mig, coalesce(job_id, '') AS job FROM {USAGE}
            WHERE allocated GROUP BY ALL HAVING sum(idle_s) >= $idle_minutes * 60
        ), seg AS (
            SELECT m.*, sum((busy_n > 0)::INTEGER) OVER (PARTITION BY m.gpu_uuid, mig_instance, job_id ORDER BY first_ts
                                                         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS run
            FROM idle_segments($start, $end, $mwm, $hwm, $idle_pct) m
            SEMI JOIN candidates c ON m.gpu_uuid = c.gpu_uuid AND coalesce(m.mig_instance, -1) = c.mig
                                      AND coalesce(m.job_id, '') = c.job
        ), parts AS (
            SELECT team, job_id, node, gpu_uuid, mig_instance, mig_profile, vgpu_profile, gpu_model,
                   run - (busy_n > 0)::INTEGER AS run,
                   first_ts AS start_ts, lead_end_ts AS end_ts, lead_s AS s, lead_gpu_s AS gpu_s,
                   lead_util_sum AS util_sum, lead_util_n AS util_n
            FROM seg WHERE lead_end_ts IS NOT NULL
            UNION ALL
            SELECT team, job_id, node, gpu_uuid, mig_instance, mig_profile, vgpu_profile, gpu_model, run,
                   tail_start_ts, end_ts, tail_s, tail_gpu_s, tail_util_sum, tail_util_n
            FROM seg WHERE busy_n > 0 AND tail_start_ts IS NOT NULL
            UNION ALL  -- stretches inside an hour are whole already: each its own (negative) number
            SELECT team, job_id, node, gpu_uuid, mig_instance, mig_profile, vgpu_profile, gpu_model,
                   -row_number() OVER () AS run, start_ts, end_ts, s, gpu_s, util_sum, util_n
            FROM inner_idle_runs($start, $end, $hwm) WHERE s >= $idle_minutes * 60
        )
        SELECT owner(p.team, $unattributed) AS team, p.job_id, p.node, p.gpu_uuid, p.gpu_model,
               min(p.start_ts) AS start_ts, max(p.end_ts) AS end_ts, sum(p.s) / 60.0 AS idle_minutes,
               sum(p.gpu_s) / 3600.0 AS idle_gpu_hours,
               sum(p.gpu_s) / 3600.0 * coalesce(any_value({RATE}), 0) AS idle_cost_usd,
               sum(p.util_sum) / nullif(sum(p.util_n), 0) AS mean_util_pct
        FROM {pooled("parts")} p {price_join("p", "p.start_ts")}
        GROUP BY p.team, p.job_id, p.node, p.gpu_uuid, p.mig_instance, p.gpu_model, p.run
        HAVING sum(p.s) >= $idle_minutes * 60
        ORDER BY idle_gpu_hours DESC"""
    return store.query_usage(sql, {"start": start, "end": end, "idle_minutes": thresholds.idle_minutes,
                                   "unattributed": UNATTRIBUTED})


def job_profiles(store: Store, start: datetime, end: datetime, jobs: list[str] | None = None) -> pd.DataFrame:
    """Per job on whole GPUs (only `jobs`, when given): peak memory against card size, mean utilisation (over the
    samples with a reading; null without any), `util_coverage`, GPU-hours and cost (from the rollups;
    `p95_util_pct` is added by `with_p95` for the jobs that need it)."""
    sql = f"""
        SELECT job_id, any_value(owner(team, $unattributed)) AS team, any_value(gpu_model) AS gpu_model,
               count(DISTINCT gpu_uuid) AS gpus, min(first_ts) AS first_ts, max(last_ts) AS last_ts,
               max(mem_used_max) AS peak_mem_mib, max(mem_total_max) AS mem_total_mib,
               sum(util_sum) / nullif(sum(util_n), 0) AS mean_util_pct,
               sum(util_gpu_s) / nullif(sum(gpu_s), 0) AS util_coverage,
               sum(gpu_hours) AS gpu_hours, sum(cost_usd) AS cost_usd,
               any_value(usd_per_gpu_hour) AS usd_per_gpu_hour, {COMPUTE_NEED_MEANS}
        FROM {PRICED}
        WHERE allocated AND job_id IS NOT NULL AND mig_profile IS NULL
              AND ($all OR job_id IN (SELECT unnest($jobs)))
        GROUP BY job_id"""
    return store.query_usage(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED, "all": jobs is None,
                                   "jobs": sorted(jobs or [])})


def with_p95(store: Store, jobs: pd.DataFrame, start: datetime, end: datetime) -> pd.DataFrame:
    """`jobs` with each one's 95th-percentile utilisation over [start, end): the percentile of its GPUs' per-minute
    mean utilisation (equal to the per-sample one at a 60 s interval). A percentile does not add up across rows,
    so hour rollups keep their minutes' means as a list (and keep them past minute retention); minutes without a
    utilisation reading are left out, and the percentile is null where there is no evidence."""
    sql = """SELECT job_id, quantile_cont(util_pct, 0.95) AS p95_util_pct
             FROM minute_utilisation($start, $end, $mwm, $hwm, $idle_pct, $jobs)
             WHERE mig_profile IS NULL
             GROUP BY job_id"""
    p95 = store.query_usage(sql, {"start": start, "end": end, "jobs": jobs["job_id"].tolist()})
    return jobs.merge(p95, on="job_id", how="left")


# A smaller card has far less compute; only jobs this lightly loaded are moved to one.
SMALLER_CARD_MAX_UTIL_PCT = 30.0
MEMORY_HEADROOM = 1.2  # a job fits a slice or card with 20% more memory than its peak


def smallest_fit(model: str, peak_mem_mib: float, p95_util_pct: float) -> dict | None:
    """The smallest MIG slice of `model` holding the job's memory (with headroom) and p95 compute,
    else, for lightly loaded jobs, the smallest smaller card with that memory."""
    need_gb = peak_mem_mib * MEMORY_HEADROOM / 1024.0
    for profile in mig_profiles(model):
        fraction = mig_fraction(model, profile.name)
        if fraction < 1.0 and profile.memory_gb >= need_gb and fraction * 100.0 >= p95_util_pct:
            return {"kind": "mig", "target": f"{model} MIG {profile.name}", "gpu_fraction": fraction}
    if p95_util_pct > SMALLER_CARD_MAX_UTIL_PCT:
        return None
    smaller = smaller_cards(need_gb, than=model)
    if smaller:
        return {"kind": "gpu", "target": smaller[0], "gpu_fraction": 1.0}
    return None


def oversized_jobs(store: Store, start: datetime, end: datetime, thresholds: WasteConfig,
                   min_gpu_hours: float = 0.5) -> pd.DataFrame:
    """Jobs whose peak memory stayed under `oversized_mem_fraction` of the card, with the smallest shape that fits.

    A job whose p95 utilisation stayed under `idle_util_pct` is `idle`: it is listed, but no shape is suggested,
    since a slice held idle wastes the slice (its GPUs should be given back)."""
    jobs = job_profiles(store, start, end)
    if jobs.empty:
        return jobs.assign(p95_util_pct=pd.Series(dtype=float), idle=pd.Series(dtype=bool),
                           fits=pd.Series(dtype=object))
    small = jobs["peak_mem_mib"] < thresholds.oversized_mem_fraction * jobs["mem_total_mib"]
    over = jobs[small & (jobs["gpu_hours"] >= min_gpu_hours)]
    over = with_p95(store, over, start, end)
    over = with_compute_need(over)
    known = over["p95_util_pct"].notna()
    over["idle"] = known & (over["p95_util_pct"] < thresholds.idle_util_pct)
    # no shape is suggested without the p95 it rests on
    over["fits"] = [smallest_fit(m, p, u) if ok and not idle else None for m, p, u, idle, ok in
                    zip(over["gpu_model"], over["peak_mem_mib"], over["compute_pct"], over["idle"], known)]
    return over.sort_values("cost_usd", ascending=False).reset_index(drop=True)


# SM activity is the resize rule's signal where at least this share of the job's GPU-hours read it
SM_SIGNAL_MIN_COVERAGE = 0.5


def with_compute_need(jobs: pd.DataFrame) -> pd.DataFrame:
    """`jobs` with `compute_pct`, the share of a card's compute a job needs, and `compute_signal`, what it rests on.
    GPU_UTIL's p95 says a kernel ran, not how much of the card it used: where the GPU reports SM activity, the p95
    is scaled by the job's SM activity per unit of GPU_UTIL on the same samples (a job at 100% GPU_UTIL with 10% of
    its SMs active needs a tenth of the card); elsewhere the p95 of GPU_UTIL stands, as before."""
    out = jobs.copy()
    ratio = (out["sm_active"] * 100.0 / out["util_on_profiled_pct"].where(out["util_on_profiled_pct"] > 0)).clip(
        upper=1.0)
    usable = ratio.notna() & (out["profiling_coverage"].fillna(0) >= SM_SIGNAL_MIN_COVERAGE)
    out["compute_pct"] = out["p95_util_pct"].where(~usable, out["p95_util_pct"] * ratio)
    out["compute_signal"] = ["sm_active" if u else "gpu_util" for u in usable]
    return out


STRETCH_COLUMNS = ["team", "job_id", "node", "gpu_model", "gpus", "gpu_uuids", "start_ts", "end_ts", "idle_minutes",
                   "idle_gpu_hours", "idle_cost_usd", "mean_util_pct"]


def job_stretches(runs: pd.DataFrame) -> pd.DataFrame:
    """The per-GPU idle stretches of `idle_runs` joined per job: the GPUs of one job idle over overlapping times are
    one stretch (an 8-GPU job idle for a night is one row, not eight), with its GPU count and their UUIDs. A
    stretch without a job stays one per GPU, since nothing says two such GPUs belong together. `idle_minutes` is
    the longest idle time of its GPUs (a GPU's stretch does not count minutes without samples); `mean_util_pct` weighs each GPU's mean by its idle GPU-hours and is null when
    no GPU had a reading."""
    if runs.empty:
        return pd.DataFrame(columns=STRETCH_COLUMNS)
    frame = runs.assign(holder=runs["job_id"].fillna("gpu:" + runs["gpu_uuid"]),
                        weighted=runs["mean_util_pct"] * runs["idle_gpu_hours"],
                        measured=runs["idle_gpu_hours"].where(runs["mean_util_pct"].notna(), 0.0))
    frame = frame.sort_values(["team", "holder", "node", "gpu_model", "start_ts"], na_position="first")
    keys = ["team", "holder", "node", "gpu_model"]
    # a new stretch starts where a GPU's idle start lies after every earlier end of the same holder
    # (built-in cummax and shift per group: a Python lambda per group took seconds at 1,000 GPUs)
    groups = [frame[k] for k in keys]
    reach = frame["end_ts"].groupby(groups, dropna=False).cummax().groupby(groups, dropna=False).shift()
    frame["stretch"] = (reach.isna() | (frame["start_ts"] > reach)).cumsum()
    uuids = (frame[["stretch", "gpu_uuid"]].drop_duplicates().sort_values(["stretch", "gpu_uuid"])
             .groupby("stretch")["gpu_uuid"].agg(list))
    out = frame.groupby("stretch").agg(
        team=("team", "first"), job_id=("job_id", "first"), node=("node", "first"), gpu_model=("gpu_model", "first"),
        gpus=("gpu_uuid", "nunique"),
        start_ts=("start_ts", "min"), end_ts=("end_ts", "max"), idle_minutes=("idle_minutes", "max"),
        idle_gpu_hours=("idle_gpu_hours", "sum"),
        idle_cost_usd=("idle_cost_usd", "sum"), weighted=("weighted", "sum"), measured=("measured", "sum"))
    out["gpu_uuids"] = uuids
    out["mean_util_pct"] = out["weighted"] / out["measured"].where(out["measured"] > 0)
    return out.sort_values("idle_cost_usd", ascending=False)[STRETCH_COLUMNS].reset_index(drop=True)


@dataclass
class Waste:
    """The idle stretches (per GPU, as the policies read them, and per job, as people read them), the jobs that are
    memory-oversized while busy, and their sums per team, each query run once. A job whose p95 utilisation is
    under the idle threshold is waste as an idle holder, not as an oversized one: it is left out of `oversized`
    so no job is counted twice."""
    runs: pd.DataFrame
    stretches: pd.DataFrame
    oversized: pd.DataFrame
    by_team: pd.DataFrame


def waste(store: Store, start: datetime, end: datetime, thresholds: WasteConfig, oversized: bool = True) -> Waste:
    """Idle stretches and memory-oversized jobs of [start, end), and both per team. `oversized=False`: the idle
    part only (the weekly report shows no oversized jobs; finding them costs a percentile per job)."""
    runs = idle_runs(store, start, end, thresholds)
    over = oversized_jobs(store, start, end, thresholds) if oversized else pd.DataFrame(
        {"job_id": [], "team": [], "gpu_hours": [], "idle": []})
    busy_over = over[~over["idle"].astype(bool)].reset_index(drop=True)
    stretches = job_stretches(runs)
    return Waste(runs, stretches, busy_over, _per_team(stretches, busy_over))


def waste_by_team(store: Store, start: datetime, end: datetime, thresholds: WasteConfig) -> pd.DataFrame:
    """Per team: idle allocated GPU-hours and their cost, and how many jobs were memory-oversized."""
    return waste(store, start, end, thresholds).by_team


def _per_team(stretches: pd.DataFrame, over: pd.DataFrame) -> pd.DataFrame:
    idle = stretches.groupby("team", as_index=False).agg(
        idle_gpu_hours=("idle_gpu_hours", "sum"), idle_cost_usd=("idle_cost_usd", "sum"),
        idle_stretches=("idle_gpu_hours", "size"))
    sized = (over.groupby("team", as_index=False).agg(oversized_jobs=("job_id", "size"),
                                                       oversized_gpu_hours=("gpu_hours", "sum"))
             if not over.empty else pd.DataFrame(columns=["team", "oversized_jobs", "oversized_gpu_hours"]))
    merged = idle.merge(sized, on="team", how="outer")
    merged = merged.fillna({"idle_gpu_hours": 0.0, "idle_cost_usd": 0.0, "idle_stretches": 0,
                            "oversized_jobs": 0, "oversized_gpu_hours": 0.0})
    return merged.sort_values("idle_cost_usd", ascending=False).reset_index(drop=True)


# a job is flagged when at least this share of its GPU-hours was idle
WASTE_FLAG_IDLE_SHARE = 0.5


def job_table(store: Store, start: datetime, end: datetime, team: str | None = None, search: str | None = None,
              limit: int = 500, mem_fraction: float = 0.25, p95: bool = True,
              profiling: bool = True) -> pd.DataFrame:
    """One row per job of [start, end), like Princeton's jobstats: GPUs, model, GPU-hours, cost, mean and p95
    utilisation, peak memory against the card's, the idle share of its GPU-hours, the Kubernetes DRA claims its GPUs
    came through (`dra_claims`, empty without DRA), and a waste flag (idle share at
    least WASTE_FLAG_IDLE_SHARE, or peak memory under `mem_fraction` of the card). Most costly first.

    Utilisation, idle share and the flag's idle part rest on the samples with a utilisation reading only:
    `util_coverage` is the share of the job's GPU-hours measured, the idle share is of those, and a job with none
    has them null and `util_note` "no utilisation data" (a partly measured one says how much was). `p95`: False
    leaves `p95_util_pct` out (null), for a caller that shows no percentile (a third of a second at 1,000 GPUs);
    `profiling`: False leaves the profiling means out, for one that shows none (the report's team pages)."""
    sql = f"""
        SELECT job_id, any_value(owner(team, $unattributed)) AS team, any_value("user") AS "user",
               arg_max(gpu_model, gpu_s) AS gpu_model,
               count(DISTINCT gpu_uuid || coalesce(mig_instance::VARCHAR, '')) AS gpus,
               any_value(mig_profile) AS mig_profile, min(first_ts) AS first_ts, max(end_ts) AS last_ts,
               sum(gpu_hours) AS gpu_hours, sum(cost_usd) AS cost_usd,
               sum(util_sum) / nullif(sum(util_n), 0) AS mean_util_pct,
               max(mem_used_max) AS peak_mem_mib, max(mem_total_max) AS mem_total_mib,
               sum(idle_gpu_s) / nullif(sum(util_gpu_s), 0) AS idle_share,
               sum(util_gpu_s) / nullif(sum(gpu_s), 0) AS util_coverage{", " + PROFILE_MEANS if profiling else ""}
        FROM {PRICED}
        WHERE allocated AND job_id IS NOT NULL AND ($team IS NULL OR owner(team, $unattributed) = $team)
          AND ($search IS NULL OR contains(lower(job_id), lower($search)) OR contains(lower(coalesce("user", '')),
                                                                                      lower($search)))
        GROUP BY job_id ORDER BY cost_usd DESC, gpu_hours DESC, job_id LIMIT $limit"""
    jobs = store.query_usage(sql, {"start": start, "end": end, "team": team, "search": search or None,
                                   "limit": limit, "unattributed": UNATTRIBUTED})
    if len(jobs) and p95:
        jobs = with_p95(store, jobs, start, end)
    else:
        jobs = jobs.assign(p95_util_pct=pd.Series(dtype=float))
    claims = claims_by_job(store, start, end)
    jobs["dra_claims"] = [claims.get(job, []) for job in jobs["job_id"]]
    small = (jobs["peak_mem_mib"] / jobs["mem_total_mib"]) < mem_fraction
    jobs["waste"] = (jobs["idle_share"].fillna(0) >= WASTE_FLAG_IDLE_SHARE) | small.fillna(False)
    jobs["util_note"] = [util_note(c) for c in jobs["util_coverage"]] if len(jobs) else pd.Series(dtype=object)
    return jobs


def util_note(util_coverage: float | None) -> str | None:
    """What a row's utilisation figures rest on, in words: nothing when fully measured."""
    if util_coverage is None or pd.isna(util_coverage) or util_coverage <= 0:
        return NO_UTILISATION
    if util_coverage < 1.0 - 1e-9:
        return f"utilisation measured on {util_coverage:.0%} of its GPU-hours"
    return None
