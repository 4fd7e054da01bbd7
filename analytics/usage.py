"""GPU-hours allocated vs used, per team and over time.

A sample stands for `interval_s` seconds of `gpu_fraction` of a GPU, so GPU-hours are a
sum, whatever the collection interval or MIG layout. Every query reads the rollups
(`usage_between`), so windows are whole minutes: both ends are floored to the minute.
"Used" weights allocated time by utilisation; "allocated" counts the time a job held the
GPU, busy or not.

Unknown is never zero: a sample without a utilisation reading (the Philly and Helios traces, a failed read) counts
for allocation and cost, which need no reading, but is neither idle, busy nor used. Used, idle and busy figures
come with `util_coverage`, the share of the allocated GPU-hours they rest on (0..1), and are null where nothing
was measured (coverage 0); efficiency is used over measured GPU-hours.
"""
from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.analytics.store.database import floor_minute
from gpuledger.collector.errors import InputError
from gpuledger.collector.gpu_catalog import UNKNOWN_MODEL
from gpuledger.collector.jobs.lifecycle import HELD_REASONS
from gpuledger.collector.samples import IDLE_CAPACITY, PROFILING_FIELDS, UNATTRIBUTED

# the rollups of [$start, $end) (analytics/store/rollups.py): every query below reads these, never raw samples
USAGE = "usage_between($start, $end, $fine, $mwm, $hwm, $idle_pct)"


_RATE_SPANS = ("(SELECT gpu_model, variant, effective_from, usd_per_gpu_hour, coalesce(lead(effective_from) OVER "
               "(PARTITION BY gpu_model, variant ORDER BY effective_from), TIMESTAMPTZ 'infinity') AS until "
               "FROM rate_versions)")
# the rate a priced row carries, from the most specific version in force: its MIG profile's (`rp`), its node
# pool's (`rn`), its model's (`r`); null: unpriced. Its start, and which variant it is ('' the model's own)
RATE = "coalesce(rp.usd_per_gpu_hour, rn.usd_per_gpu_hour, r.usd_per_gpu_hour)"
RATE_FROM = "coalesce(rp.effective_from, rn.effective_from, r.effective_from)"
RATE_VARIANT = "coalesce(rp.variant, rn.variant, r.variant)"


def price_join(alias: str, at: str) -> str:
    """Rows `alias` (with GPU model, MIG and vGPU profile and `node_pool`: FROM pooled(...)) priced at the rate
    card versions in force at their instant `at` (rates start on whole hours, so a rollup bucket never straddles a
    change): select RATE, RATE_FROM and RATE_VARIANT. Three hash joins on the model and variant with the version's
    span as a filter (a model has a few versions; a fifth faster than an ASOF join), most specific first: the MIG
    or vGPU profile's rate, the node pool's (pool_of, once per distinct node), the model's own. Null where none was
    in force (unpriced, never silently free)."""
    def one(name: str, variant: str) -> str:
        return (f" LEFT JOIN {_RATE_SPANS} {name} ON {alias}.gpu_model = {name}.gpu_model AND {name}.variant = "
                f"{variant} AND {at} >= {name}.effective_from AND {at} < {name}.until")
    profile = f"'profile ' || lower(coalesce({alias}.mig_profile, {alias}.vgpu_profile))"
    return one("rp", profile) + one("rn", f"'pool ' || {alias}.node_pool") + one("r", "''")


def pooled(source: str) -> str:
    """`source`'s rows with their node's pool (`node_pool`), as price_join reads it: pool_of is a correlated
    subquery, which DuckDB runs once per distinct node in a projection (it cannot in a join's condition)."""
    return f"(SELECT *, pool_of(node) AS node_pool FROM {source})"


PRICE_JOIN = price_join("u", "u.bucket")  # a rollup row `u` at its bucket's start


def team_usage(store: Store, start: datetime, end: datetime, team: str | None = None) -> pd.DataFrame:
    """One row per team: allocated and used GPU-hours, efficiency, jobs seen, and `util_coverage`: the share of
    the allocated GPU-hours with a utilisation reading. Used GPU-hours and efficiency (used over the measured
    GPU-hours) are null for a team nothing of which was measured."""
    sql = f"""
        SELECT owner(team, $unattributed) AS team, sum(gpu_s) / 3600.0 AS allocated_gpu_hours,
               {measured("sum(used_gpu_s) / 3600.0")} AS used_gpu_hours, count(DISTINCT job_id) AS jobs,
               sum(util_gpu_s) / 3600.0 AS measured_gpu_hours
        FROM {USAGE}
        WHERE allocated AND ($team IS NULL OR owner(team, $unattributed) = $team)
        GROUP BY 1 ORDER BY allocated_gpu_hours DESC"""
    frame = store.query_usage(sql, {"start": start, "end": end, "team": team, "unattributed": UNATTRIBUTED})
    frame["efficiency"] = frame["used_gpu_hours"] / frame["measured_gpu_hours"].where(frame["measured_gpu_hours"] > 0)
    frame["util_coverage"] = coverage(frame["measured_gpu_hours"], frame["allocated_gpu_hours"])
    return frame


# what a job's compute need rests on (analytics/waste.py with_compute_need): its SM activity, the share of its
# GPU-seconds that read it, and GPU_UTIL over the same samples, so the two are compared like for like
COMPUTE_NEED_MEANS = ", ".join([
    "sum(sm_active_gpu_s) / nullif(sum(sm_active_cov_s), 0) AS sm_active",
    "sum(sm_active_cov_s) / nullif(sum(gpu_s), 0) AS profiling_coverage",
    "100.0 * sum(util_prof_gpu_s) / nullif(sum(sm_active_cov_s), 0) AS util_on_profiled_pct"])
# per field: the mean over the GPU-seconds with a reading, and the share of GPU-seconds read
PROFILE_MEANS = ", ".join(
    [f"sum({f}_gpu_s) / nullif(sum({f}_cov_s), 0) AS {f}" for f in PROFILING_FIELDS if f != "sm_active"]
    + [COMPUTE_NEED_MEANS, "sum(nvlink_bytes) / 1e9 AS nvlink_gb", "sum(pcie_bytes) / 1e9 AS pcie_gb"])


NO_UTILISATION = "no utilisation data"  # what a figure that rests on utilisation says where none was measured


def measured(expression: str, gpu_s: str = "util_gpu_s") -> str:
    """`expression` (an aggregate over rollup rows) where any GPU-second of them had a utilisation reading, else
    NULL: unknown, never zero."""
    return f"CASE WHEN sum({gpu_s}) > 0 THEN {expression} END"


def coverage(measured_hours: pd.Series, allocated_hours: pd.Series) -> pd.Series:
    """The share (0..1) of allocated GPU-hours with a utilisation reading; null where nothing was allocated."""
    return (measured_hours.fillna(0.0) / allocated_hours.where(allocated_hours > 0)).clip(upper=1.0)


# Average concurrent GPUs per bucket, time-weighted: GPU-seconds over the seconds of the bucket that the evidence
# covers, taken as the longest time any one GPU was sampled in it. Dividing by the whole bucket length would
# under-count partial buckets at the edges of the window and of the history; averaging per-instant sums
# under-counts when nodes sample at different moments. `$team` narrows "allocated" to one team (NULL: all) while
# the whole cluster still counts as present.
# The seconds a GPU was sampled in a bucket: its rows' samples times their interval, but never more than the span
# from its first sample to its last one's end. Pods sharing a GPU (time-slicing) are a row each at every instant,
# and summed they made the GPU look sampled twice as long, halving the cluster's GPUs.
# A GPU is present at most the seconds it was sampled (`k` scales its seconds down where its samples overlap, as
# the last sample of a backfill and the first live ones do): the bucket where live data took over showed 51 GPUs
# of 48.
SAMPLED_S = "least(sum(samples * interval_s), epoch(max(end_ts)) - epoch(min(first_ts))) AS sampled_s"
# a rollup row's bucket (a minute or an hour) put into the caller's $bucket_minutes (epoch math: time_bucket on
# TIMESTAMPTZ is slow)
BUCKET = "to_timestamp(floor(epoch(bucket) / ($bucket_minutes * 60)) * $bucket_minutes * 60) AS bucket"
_BUCKETED = f"""
    WITH per_gpu AS (
        SELECT {BUCKET},
               node, gpu_uuid, mig_instance, sum(gpu_s) AS present_s,
               coalesce(sum(gpu_s) FILTER (WHERE allocated AND owned), 0) AS allocated_s,
               coalesce(sum(used_gpu_s) FILTER (WHERE allocated AND owned), 0) AS used_s,
               coalesce(sum(util_gpu_s) FILTER (WHERE allocated AND owned), 0) AS measured_s,
               coalesce(sum(util_gpu_s - idle_gpu_s) FILTER (WHERE allocated AND owned), 0) AS busy_s,
               {SAMPLED_S}
        FROM (SELECT *, ($team IS NULL OR owner(team, $unattributed) = $team) AS owned FROM {USAGE})
        GROUP BY ALL)
    SELECT bucket, sum(present_s * k) AS present_s, sum(allocated_s * k) AS allocated_s, sum(used_s * k) AS used_s,
           sum(measured_s * k) AS measured_s, sum(busy_s * k) AS busy_s, max(sampled_s) AS covered_s
    FROM (SELECT *, least(1.0, sampled_s / nullif(present_s, 0)) AS k FROM per_gpu)
    GROUP BY 1 ORDER BY 1"""


def _bucketed(store: Store, start: datetime, end: datetime, team: str | None, bucket_minutes: int) -> pd.DataFrame:
    frame = store.query_usage(_BUCKETED, {"start": start, "end": end, "team": team, "unattributed": UNATTRIBUTED,
                                          "bucket_minutes": bucket_minutes, "fine": bucket_minutes % 60 != 0})
    covered = frame["covered_s"].clip(lower=1e-9)
    # used GPUs are unknown (null) in a bucket whose allocated GPUs had no utilisation reading at all; nothing
    # allocated is known to be nothing used
    known = (frame["measured_s"] > 0) | (frame["allocated_s"] <= 0)
    out = pd.DataFrame({"bucket": frame["bucket"], "total_gpus": frame["present_s"] / covered,
                        "allocated_gpus": frame["allocated_s"] / covered,
                        "used_gpus": (frame["used_s"] / covered).where(known),
                        "busy_gpus": (frame["busy_s"] / covered).where(known),
                        "util_coverage": coverage(frame["measured_s"], frame["allocated_s"])})
    return out


def team_usage_series(store: Store, start: datetime, end: datetime, team: str,
                      bucket_minutes: int = 60) -> pd.DataFrame:
    """Allocated and used GPUs (average concurrent) per time bucket for one team."""
    return _bucketed(store, start, end, team, bucket_minutes).drop(columns=["total_gpus"])


def team_model_series(store: Store, start: datetime, end: datetime, team: str,
                      bucket_minutes: int = 60) -> pd.DataFrame:
    """One team's allocated GPUs (average concurrent) per time bucket and GPU model: what its per-model guarantee
    and limit are compared with. Buckets are averaged over the seconds the evidence covers, as `_BUCKETED` does."""
    sql = f"""
        WITH per_gpu AS (
            SELECT {BUCKET},
                   node, gpu_uuid, mig_instance, gpu_model,
                   coalesce(sum(gpu_s) FILTER (WHERE allocated AND owner(team, $unattributed) = $team), 0)
                       AS allocated_s,
                   {SAMPLED_S}
            FROM {USAGE} GROUP BY ALL),
        covered AS (SELECT bucket, max(sampled_s) AS covered_s FROM per_gpu GROUP BY 1)
        SELECT bucket, gpu_model, sum(allocated_s) / any_value(covered_s) AS allocated_gpus
        FROM per_gpu JOIN covered USING (bucket) GROUP BY bucket, gpu_model
        HAVING sum(allocated_s) > 0 ORDER BY bucket, gpu_model"""
    return store.query_usage(sql, {"start": start, "end": end, "team": team, "unattributed": UNATTRIBUTED,
                                   "bucket_minutes": bucket_minutes, "fine": bucket_minutes % 60 != 0})


def cluster_utilization(store: Store, start: datetime, end: datetime, bucket_minutes: int = 60) -> pd.DataFrame:
    """Per bucket: GPUs present, allocated and used (average concurrent), cluster-wide."""
    return _bucketed(store, start, end, None, bucket_minutes)


def check_idle_threshold(store: Store, idle_util_pct: float) -> None:
    if idle_util_pct != store.idle_util_pct:
        raise InputError(f"the rollups count idle under {store.idle_util_pct:g}% utilisation, not {idle_util_pct:g}%: "
                         "the server rebuilds them when [waste] idle_util_pct changes (gpuledger compact --rebuild)")


def hourly_demand(store: Store, start: datetime, end: datetime, idle_util_pct: float) -> pd.DataFrame:
    """Per owner, GPU model and clock hour: GPUs allocated, GPUs allocated with a utilisation reading
    (`measured_gpus`) and GPUs allocated, measured and idle (under `idle_util_pct`), on average over the hour.
    Busy GPUs are measured less idle: GPUs without a reading are neither."""
    check_idle_threshold(store, idle_util_pct)
    sql = f"""
        SELECT owner(team, $unattributed) AS team, gpu_model, utc_hour(bucket) AS hour,
               sum(gpu_s) / 3600.0 AS allocated_gpus, sum(util_gpu_s) / 3600.0 AS measured_gpus,
               sum(idle_gpu_s) / 3600.0 AS idle_gpus
        FROM {USAGE} WHERE allocated GROUP BY ALL"""
    return store.query_usage(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED})


def covered_hours(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per GPU model: the clock hours in [start, end) that hold at least one sample of it (the evidence there is)."""
    sql = f"""SELECT gpu_model, list_sort(list(DISTINCT utc_hour(bucket))) AS hours
              FROM {USAGE} GROUP BY gpu_model"""
    return store.query_usage(sql, {"start": start, "end": end})


CAPACITY_STALE = timedelta(hours=2)  # a node with no sample this long before the instant asked is not present


def capacity_by_model(store: Store, before: datetime, stale: timedelta = CAPACITY_STALE) -> pd.DataFrame:
    """Per GPU model: GPUs present before `before` (MIG instances as their fractions), each node as its own newest
    instant shows it. Per node, because agents sample at their own moments: the newest instant of the whole table
    is one node's (one pushed a few minutes ahead made every other node's GPUs vanish). A node silent for `stale`
    has no GPU present. Parts are clamped to one GPU (share_of), so a hostile row cannot inflate the capacity."""
    sql = """WITH newest AS (SELECT node, max(ts) AS ts FROM samples WHERE ts < $end AND ts >= $since GROUP BY node)
             SELECT coalesce(s.gpu_model, $unknown) AS gpu_model, sum(share_of(s.gpu_fraction)) AS gpus
             FROM samples s JOIN newest n ON s.node = n.node AND s.ts = n.ts
             WHERE s.ts < $end AND s.ts >= $since GROUP BY 1 ORDER BY 1"""
    return store.query(sql, {"end": before, "since": before - stale, "unknown": UNKNOWN_MODEL})


def interval_at(store: Store, ts: datetime) -> float | None:
    """The longest sampling interval at instant `ts`: how long a sample taken then stands for."""
    # seconds_of: a stored NaN, Inf or 1e308 interval counts as none (the caller falls back to its default)
    return store.scalar("SELECT nullif(max(seconds_of(interval_s)), 0) FROM samples WHERE ts = $ts", {"ts": ts})


def pending_jobs(store: Store, at: datetime, min_wait_minutes: float = 0.0) -> pd.DataFrame:
    """Jobs waiting in the scheduler's queue at `at` that have waited at least `min_wait_minutes`:
    team, GPU model asked for (null: any), GPUs and minutes waited. Jobs the scheduler holds (HELD_REASONS) wait
    for something other than GPUs and are left out."""
    sql = """SELECT job_id, owner(team, $unattributed) AS team, gpu_model, gpus,
                    date_diff('second', submit_ts, $at) / 60.0 AS waited_minutes
             FROM jobs
             WHERE state = 'pending' AND (submit_ts IS NULL OR submit_ts <= $at)
               AND coalesce(date_diff('second', submit_ts, $at) / 60.0, 0) >= $min_wait
               AND (pending_reason IS NULL OR pending_reason NOT IN (SELECT unnest($held)))
             ORDER BY team, submit_ts"""
    return store.query(sql, {"at": at, "min_wait": min_wait_minutes, "unattributed": UNATTRIBUTED,
                             "held": list(HELD_REASONS)})


def hourly_user_usage(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Allocated GPU-hours per clock hour, named team and user (null: not known), for account-tree fairshare."""
    sql = f"""
        SELECT utc_hour(bucket) AS hour, team, "user", sum(gpu_s) / 3600.0 AS gpu_hours
        FROM {USAGE} WHERE allocated AND team IS NOT NULL GROUP BY ALL"""
    return store.query_usage(sql, {"start": start, "end": end})


def hourly_capacity(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """GPU-hours present per clock hour (allocated or not): the cluster's capacity, for usage as a fraction of it."""
    sql = f"""SELECT utc_hour(bucket) AS hour, sum(gpu_s) / 3600.0 AS gpu_hours
              FROM {USAGE} GROUP BY 1 ORDER BY 1"""
    return store.query_usage(sql, {"start": start, "end": end})


def team_gauges(store: Store, start: datetime, end: datetime, idle_util_pct: float) -> pd.DataFrame:
    """Per bill line (teams, unattributed, idle capacity), averaged over [start, end): GPUs held, GPUs busy
    (a reading at or over `idle_util_pct`), GPUs held idle (a reading under it), cost per hour at the rate card,
    the profiling means of its held GPUs (null where none read them), and `util_coverage`
    (the share of the GPUs held with a reading). Busy and idle are null for a line held
    without any reading; the idle-capacity line holds nothing, so it is busy and idle 0."""
    check_idle_threshold(store, idle_util_pct)
    sql = f"""
        SELECT bill_line(allocated, u.team, $unattributed, $idle) AS team,
               sum(gpu_s) / 3600.0 / $hours AS allocated_gpus,
               coalesce(sum(util_gpu_s - idle_gpu_s) FILTER (WHERE allocated), 0) / 3600.0 / $hours AS busy_gpus,
               coalesce(sum(idle_gpu_s) FILTER (WHERE allocated), 0) / 3600.0 / $hours AS idle_gpus,
               coalesce(sum(util_gpu_s) FILTER (WHERE allocated), 0) AS measured_s,
               coalesce(sum(gpu_s) FILTER (WHERE allocated), 0) AS held_s,
               sum(gpu_s * coalesce({RATE}, 0)) / 3600.0 / $hours AS cost_usd_per_hour,
               {", ".join(f"sum({f}_gpu_s) FILTER (WHERE allocated) / "
                          f"nullif(sum({f}_cov_s) FILTER (WHERE allocated), 0) AS {f}" for f in PROFILING_FIELDS)}
        FROM {pooled(USAGE)} u {PRICE_JOIN} GROUP BY 1 ORDER BY 1"""
    frame = store.query_usage(sql, {"start": start, "end": end, "hours": _hours(start, end),
                                    "unattributed": UNATTRIBUTED, "idle": IDLE_CAPACITY})
    return _known(frame)


def _known(frame: pd.DataFrame) -> pd.DataFrame:
    """Busy and idle GPUs null where GPUs were held without any utilisation reading, with `util_coverage`."""
    known = (frame["measured_s"] > 0) | (frame["held_s"] <= 0)
    frame["busy_gpus"] = frame["busy_gpus"].where(known)
    frame["idle_gpus"] = frame["idle_gpus"].where(known)
    frame["util_coverage"] = coverage(frame["measured_s"], frame["held_s"])
    return frame.drop(columns=["measured_s", "held_s"])


def node_gauges(store: Store, start: datetime, end: datetime, idle_util_pct: float) -> pd.DataFrame:
    """Per node, averaged over [start, end): GPUs present, allocated, and busy (a reading at or over
    `idle_util_pct`; null where GPUs were allocated without any reading), with `util_coverage`."""
    check_idle_threshold(store, idle_util_pct)
    sql = f"""
        SELECT node, sum(gpu_s) / 3600.0 / $hours AS gpus,
               coalesce(sum(gpu_s) FILTER (WHERE allocated), 0) / 3600.0 / $hours AS allocated_gpus,
               coalesce(sum(util_gpu_s - idle_gpu_s) FILTER (WHERE allocated), 0) / 3600.0 / $hours AS busy_gpus,
               coalesce(sum(idle_gpu_s) FILTER (WHERE allocated), 0) / 3600.0 / $hours AS idle_gpus,
               coalesce(sum(util_gpu_s) FILTER (WHERE allocated), 0) AS measured_s,
               coalesce(sum(gpu_s) FILTER (WHERE allocated), 0) AS held_s
        FROM {USAGE} WHERE node IS NOT NULL GROUP BY 1 ORDER BY 1"""
    return _known(store.query_usage(sql, {"start": start, "end": end, "hours": _hours(start, end)})).drop(
        columns=["idle_gpus"])


def _hours(start: datetime, end: datetime) -> float:
    """The window's length in hours, as the rollups see it (both ends floored to the minute)."""
    return (floor_minute(end) - floor_minute(start)).total_seconds() / 3600.0


# optional telemetry, by what it takes to get it: shown per node so a dashboard can say why a chart is empty
DEVICE_FIELDS = ("power_w", "temp_c", "nvlink_tx_bps", "nvlink_bps", "pcie_tx_bps", "xid", "throttle_reasons",
                 "ecc_dbe_total")


def telemetry_coverage(store: Store, before: datetime, minutes: float = 15.0) -> pd.DataFrame:
    """Per node: the share of its samples in the `minutes` before `before` that carry each optional field. A
    profiling field at 0 means the exporter does not collect it (dcgm-exporter's default counters do not)."""
    shares = ", ".join(f"avg(({c} IS NOT NULL)::INT) AS {c}" for c in (*PROFILING_FIELDS, *DEVICE_FIELDS))
    return store.query(f"""
        SELECT node, count(*) AS samples, {shares} FROM samples
        WHERE ts >= $before - to_microseconds(CAST($minutes * 60e6 AS BIGINT)) AND ts < $before
        GROUP BY node ORDER BY node""", {"before": before, "minutes": minutes})


GPU_METRICS = {"util_pct": "mean utilisation, %", "mem_used_mib": "peak memory used, MiB",
               "power_w": "mean power, W"}


def gpu_series(store: Store, start: datetime, end: datetime, bucket_minutes: int = 60) -> pd.DataFrame:
    """Per GPU and time bucket: mean utilisation, peak memory used, mean power (from the energy counter, else
    the power readings), the hottest temperature, and SM and tensor activity (null where the GPU does not report
    them), for heatmaps of the cluster's GPUs."""
    sql = f"""
        SELECT {BUCKET},
               node, gpu_uuid, sum(util_sum) / nullif(sum(util_n), 0) AS util_pct,
               max(mem_used_max) AS mem_used_mib,
               sum(energy_j) / nullif(sum(samples * interval_s), 0) AS power_w, max(temp_max) AS temp_c,
               sum(sm_active_gpu_s) / nullif(sum(sm_active_cov_s), 0) AS sm_active,
               sum(tensor_active_gpu_s) / nullif(sum(tensor_active_cov_s), 0) AS tensor_active
        FROM {USAGE} GROUP BY ALL ORDER BY node, gpu_uuid, bucket"""
    return store.query_usage(sql, {"start": start, "end": end, "bucket_minutes": bucket_minutes,
                                   "fine": bucket_minutes % 60 != 0})
