"""Rollups: per GPU (and MIG instance) × job × minute and × hour aggregates that analytics read instead of raw rows.

Why: at 1,000 GPUs a week is 60 M raw samples, and every analytic that scanned them took seconds
to minutes. The minute table is six times smaller at a 10 s interval, the hour table 360 times.

How they stay exactly-once: rollups are a deterministic function of the stored samples, and the
samples are exactly-once. Minutes are *folded* (aggregated from the samples into `usage_minute`)
once they are closed, in one transaction that also moves the minute watermark; closed hours are
folded from the minute table the same way. A sample that arrives for a minute already folded (an
agent draining its backlog, a node that was late) is stored in the same transaction that refolds
that node's affected minutes and hours from the samples, so the rollups never disagree with the
samples and a duplicate batch, dropped before it is stored, changes neither.

How they are read: `usage_between(lo, hi, fine, mwm, hwm, idle_pct)` gives, for [lo, hi) floored
to the minute, hour rows for whole hours already folded, minute rows for the rest of the folded
minutes, and the not-yet-folded tail aggregated from the raw samples on the fly (the same
aggregation the fold uses), all with the same columns. The watermarks are passed in by the caller
(`Store.rollup_params`): read in the same moment, they let the query prune by zone maps, and a fold
that lands between reading them and the query cannot count a minute twice (minute rows from the old
watermark on are ignored, and the raw samples they came from are still there).

Idle runs need the order of samples inside a minute, so the minute table also keeps, per row, the
idle stretch before its first busy sample ("lead") and after its last ("tail"): stretches are
stitched across minutes from those, exactly as the raw gaps-and-islands query finds them, as long
as a stretch worth reporting is at least a minute long (the config's minimum for idle_minutes).
"""
from __future__ import annotations

from gpuledger.analytics.store.schema import MAX_INTERVAL_S, READING_RANGES
from gpuledger.collector.samples import PROFILING_FIELDS
from gpuledger.collector.gpu_catalog import UNKNOWN_MODEL, VGPU_NAME
from gpuledger.collector.identifiers import is_identifier

# "idle" below this utilisation: the default of [waste] idle_util_pct, and what the rollups are first built with
DEFAULT_IDLE_UTIL_PCT = 5.0
# a minute is folded this long after it ended: samples usually arrive within it, later ones are refolded
FOLD_GRACE_S = 120.0
# retention defaults: raw samples 30 days (also the oldest sample ingest accepts), minute rollups 90 days
RAW_DAYS = 30.0
MINUTE_DAYS = 90.0

KEY = 'node, gpu_uuid, mig_instance, mig_profile, vgpu_profile, gpu_model, job_id, team, "user", allocated'
assert is_identifier("gpu_model", UNKNOWN_MODEL)  # written into the fold below as a literal
# the key as the fold reads it from raw samples: a sample with no model is the explicit "unknown" model line
# (ingest stores one so since it screens; older stores and imports may hold NULLs), never a NULL model row
# and a vGPU guest's profile ("GRID A100-10C": A100-10C), which the raw samples keep in model_name, is its own key
# column (schema 15: what a vGPU profile's rate prices). The cheap LIKE keeps the regex off physical GPUs' names
_VGPU_OF = (f"CASE WHEN model_name LIKE '%-%' THEN upper(nullif(regexp_extract(model_name, '(?i){VGPU_NAME}', 1), '')) "
            "END AS vgpu_profile")
_SAMPLE_KEY = (KEY.replace("gpu_model", f"coalesce(gpu_model, '{UNKNOWN_MODEL}') AS gpu_model")
               .replace("vgpu_profile", _VGPU_OF))

# column name -> DuckDB type, shared by the minute and hour tables (what every analytic reads)
CORE_COLUMNS = {
    "bucket": "TIMESTAMPTZ", "node": "VARCHAR", "gpu_uuid": "VARCHAR", "mig_instance": "INTEGER",
    "mig_profile": "VARCHAR", "vgpu_profile": "VARCHAR", "gpu_model": "VARCHAR", "job_id": "VARCHAR",
    "team": "VARCHAR", '"user"': "VARCHAR",
    "allocated": "BOOLEAN",
    "samples": "BIGINT", "first_ts": "TIMESTAMPTZ", "last_ts": "TIMESTAMPTZ",
    "end_ts": "TIMESTAMPTZ",  # the last sample's instant plus its interval: when the evidence ends
    "interval_s": "DOUBLE",  # the longest interval
    "gpu_s": "DOUBLE",  # GPU-seconds present (allocated rows: allocated GPU-seconds)
    "used_gpu_s": "DOUBLE",  # GPU-seconds weighted by utilisation (only samples with a utilisation reading)
    "idle_gpu_s": "DOUBLE",  # allocated GPU-seconds under the idle threshold (only samples with a reading)
    # GPU-seconds of samples with a utilisation reading (schema 9): what used, idle and busy figures cover. A sample
    # without one (Philly and Helios traces, a failed read) is unknown, neither idle nor busy: unknown is never zero
    "util_gpu_s": "DOUBLE",
    "idle_s": "DOUBLE",  # wall seconds of those samples
    "util_sum": "DOUBLE", "util_n": "BIGINT",  # for mean utilisation (samples with a utilisation)
    "mem_used_max": "DOUBLE", "mem_total_max": "DOUBLE",
    "energy_j": "DOUBLE", "nvlink_bytes": "DOUBLE",
    "temp_max": "DOUBLE",  # the hottest reading, °C (schema 8; rows folded before it have none)
    # profiling (schema 12): per field, GPU-seconds weighted by the reading and GPU-seconds with a reading. A GPU that
    # does not report a field (no DCGM profiling module, no GPM) has NULL here, not 0: unknown is never zero
    **{f"{field}_gpu_s": "DOUBLE" for field in PROFILING_FIELDS},
    **{f"{field}_cov_s": "DOUBLE" for field in PROFILING_FIELDS},
    # util-weighted GPU-seconds over the samples that also read SM activity: "busy but starved" compares the two
    # on the same samples, so a GPU that read SM activity only part of the time is not judged on the rest
    "util_prof_gpu_s": "DOUBLE",
    "pcie_bytes": "DOUBLE",  # bytes over PCIe, both directions (NULL: not read)
}
# the idle stretch before a row's first busy sample (the whole row when none is busy) and after its last. `busy_n`
# counts the samples that end an idle stretch: allocated and at or over the threshold, or without a reading
SEGMENT_COLUMNS = {
    "busy_n": "BIGINT",
    "lead_s": "DOUBLE", "lead_gpu_s": "DOUBLE", "lead_util_sum": "DOUBLE", "lead_util_n": "BIGINT",
    "lead_end_ts": "TIMESTAMPTZ",
    "tail_s": "DOUBLE", "tail_gpu_s": "DOUBLE", "tail_util_sum": "DOUBLE", "tail_util_n": "BIGINT",
    "tail_start_ts": "TIMESTAMPTZ",
}
PROFILE_COLUMNS = [*(f"{f}_gpu_s" for f in PROFILING_FIELDS), *(f"{f}_cov_s" for f in PROFILING_FIELDS),
                   "util_prof_gpu_s", "pcie_bytes"]
CORE = ", ".join(CORE_COLUMNS)
SEGMENT = ", ".join(SEGMENT_COLUMNS)
INNER_RUNS = ("STRUCT(start_ts TIMESTAMPTZ, end_ts TIMESTAMPTZ, s DOUBLE, gpu_s DOUBLE, util_sum DOUBLE, "
              "util_n BIGINT)[]")


def _table(name: str, columns: dict[str, str]) -> str:
    return f"CREATE TABLE IF NOT EXISTS {name} ({', '.join(f'{c} {t}' for c, t in columns.items())})"


def _backfill_util_coverage(table: str) -> str:
    """Once per row folded before schema 9 (util_gpu_s NULL): its GPU-seconds with a utilisation reading, estimated
    from the share of its samples with one, and the idle time that the old fold counted for samples without a
    reading taken back out (estimated the same way for a row mixing both; `gpuledger compact --rebuild` refolds the
    raw samples kept, exactly). A row with no reading at all ends idle stretches instead of being one."""
    none = "allocated AND util_n = 0"
    hour = (f", inner_runs = CASE WHEN {none} THEN [] ELSE inner_runs END, "
            f"util_minutes = CASE WHEN {none} THEN [] ELSE util_minutes END") if table == "usage_hour" else ""
    return (f"UPDATE {table} SET util_gpu_s = CASE WHEN util_n >= samples THEN gpu_s "
            "ELSE gpu_s * util_n / samples END, "
            "idle_gpu_s = CASE WHEN allocated AND util_n < samples "
            "THEN greatest(idle_gpu_s - gpu_s * (samples - util_n) / samples, 0) ELSE idle_gpu_s END, "
            "idle_s = CASE WHEN allocated AND util_n < samples "
            "THEN greatest(idle_s - interval_s * (samples - util_n), 0) ELSE idle_s END, "
            f"busy_n = CASE WHEN {none} THEN samples ELSE busy_n END, "
            + ", ".join(f"{c} = CASE WHEN {none} THEN 0 ELSE {c} END"
                        for c in ("lead_s", "lead_gpu_s", "tail_s", "tail_gpu_s"))
            + ", " + ", ".join(f"{c} = CASE WHEN {none} THEN NULL ELSE {c} END"
                               for c in ("lead_end_ts", "tail_start_ts", "lead_util_sum", "tail_util_sum"))
            + f"{hour} WHERE util_gpu_s IS NULL")


DDL = [
    _table("usage_minute", CORE_COLUMNS | SEGMENT_COLUMNS),
    # an hour row also lists the idle stretches of at least a minute strictly inside it (between busy samples)
    # and each minute's mean utilisation, in order: percentiles do not add up, so they are taken over these
    _table("usage_hour", CORE_COLUMNS | SEGMENT_COLUMNS | {"inner_runs": INNER_RUNS, "util_minutes": "DOUBLE[]"}),
    # stores made before schema 8 gain the temperature column (CREATE TABLE IF NOT EXISTS leaves them as they are)
    "ALTER TABLE usage_minute ADD COLUMN IF NOT EXISTS temp_max DOUBLE",
    "ALTER TABLE usage_hour ADD COLUMN IF NOT EXISTS temp_max DOUBLE",
    # stores made before schema 9 gain the GPU-seconds with a utilisation reading, and their rows are carried over
    # once (_backfill_util_coverage)
    "ALTER TABLE usage_minute ADD COLUMN IF NOT EXISTS util_gpu_s DOUBLE",
    "ALTER TABLE usage_hour ADD COLUMN IF NOT EXISTS util_gpu_s DOUBLE",
    _backfill_util_coverage("usage_minute"),
    _backfill_util_coverage("usage_hour"),
    # stores made before schema 12 gain the profiling columns; their rows keep NULL there (not measured, not 0)
    *(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} DOUBLE" for table in ("usage_minute", "usage_hour")
      for column in PROFILE_COLUMNS),
    # stores made before schema 15 gain the vGPU profile; their rows keep NULL there (priced as their card's share)
    *(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS vgpu_profile VARCHAR" for table in ("usage_minute", "usage_hour")),
    # one row: how far minutes and hours are folded, and the idle threshold the rollups were built with
    "CREATE TABLE IF NOT EXISTS rollup_state (minute_wm TIMESTAMPTZ, hour_wm TIMESTAMPTZ, idle_util_pct DOUBLE)",
    f"INSERT INTO rollup_state SELECT NULL, NULL, {DEFAULT_IDLE_UTIL_PCT} "
    "WHERE NOT EXISTS (SELECT 1 FROM rollup_state)",
]

_END = "ts + to_seconds(interval_s::BIGINT)"  # the instant a sample's evidence ends (as idle stretches report it)

_LO = "date_trunc('minute', lo::TIMESTAMPTZ)"
_HI = "date_trunc('minute', hi::TIMESTAMPTZ)"
_HOURS_FROM = f"date_trunc('hour', {_LO} + INTERVAL 59 MINUTE)"  # the first whole hour in the window
_HOURS_TO = f"greatest(least(date_trunc('hour', {_HI}), hwm), {_HOURS_FROM})"  # the end of the last folded one



def _profile_fold() -> str:
    """The profiling sums of the minute fold: NULL where no sample of the row read the field (sum of nothing)."""
    parts = [f"sum(gpu_s * {f}) AS {f}_gpu_s, sum(gpu_s) FILTER (WHERE {f} IS NOT NULL) AS {f}_cov_s"
             for f in PROFILING_FIELDS]
    parts.append("sum(gpu_s * util_pct / 100.0) FILTER (WHERE sm_active IS NOT NULL) AS util_prof_gpu_s")
    parts.append("sum(pcie_bytes) AS pcie_bytes")
    return ", ".join(parts)


def _reading(column: str) -> str:
    """A reading inside its physical range, else NULL (NaN fails both comparisons' DuckDB order: it is largest)."""
    lo, hi = READING_RANGES[column]
    return f"CASE WHEN {column} >= {lo!r} AND {column} <= {hi!r} THEN {column} END"


_PROFILE_FOLD = _profile_fold()

MACROS = [
    # What a raw sample may count for, whatever reached the table (ingest bounds rows since issue 21, but an older
    # server, an import or the simulator may have stored anything): a part of one GPU (NULL, NaN and negative: none;
    # over 1 or +Inf: one whole GPU) for up to a day (NULL, non-finite, non-positive or longer: no time at all).
    "CREATE OR REPLACE MACRO share_of(f) AS CASE WHEN isnan(f) THEN 0.0 WHEN f > 1 THEN 1.0 WHEN f > 0 THEN f "
    "ELSE 0.0 END",
    f"CREATE OR REPLACE MACRO seconds_of(i) AS CASE WHEN i > 0 AND i <= {MAX_INTERVAL_S!r} THEN i ELSE 0.0 END",
    # the fold: samples in [lo, hi) (of one node, or all when only_node is NULL) to minute rows
    f"""CREATE OR REPLACE MACRO minute_rollup_of(lo, hi, only_node, idle_pct) AS TABLE
    WITH raw AS (
        SELECT date_trunc('minute', ts) AS bucket, {_SAMPLE_KEY}, ts, seconds_of(interval_s) AS interval_s,
               share_of(gpu_fraction) AS fraction, {_reading("temp_c")} AS temp_c, {_reading("util_pct")} AS util_pct,
               {_reading("mem_used_mib")} AS mem_used_mib, {_reading("mem_total_mib")} AS mem_total_mib,
               coalesce({_reading("power_avg_w")}, {_reading("power_w")}) AS power_w,
               coalesce({_reading("nvlink_tx_bps")} + {_reading("nvlink_rx_bps")}, {_reading("nvlink_tx_bps")},
                        {_reading("nvlink_rx_bps")}, {_reading("nvlink_bps")}, 0) AS nvlink_bps,
               {", ".join(f'{_reading(f)} AS {f}' for f in PROFILING_FIELDS)},
               coalesce({_reading("pcie_tx_bps")} + {_reading("pcie_rx_bps")}, {_reading("pcie_tx_bps")},
                        {_reading("pcie_rx_bps")}) AS pcie_bps
        FROM samples WHERE ts >= lo AND ts < hi AND (only_node IS NULL OR node = only_node)
    ), s AS (
        SELECT bucket, {KEY}, ts, interval_s, temp_c, interval_s * fraction AS gpu_s, util_pct, mem_used_mib,
               mem_total_mib, power_w * interval_s AS energy_j, nvlink_bps * interval_s AS nvlink_bytes,
               {", ".join(PROFILING_FIELDS)}, pcie_bps * interval_s AS pcie_bytes,
               -- idle: a reading under the threshold: SM activity where the GPU reports it (GPU_UTIL counts a
               -- GPU running one tiny kernel as busy), else GPU_UTIL. "busy" ends an idle stretch: a reading at or
               -- over it, or none at all (a stretch is only as long as it was measured idle; unknown is never idle).
               -- Idle time is a part of the time with a GPU_UTIL reading (util_gpu_s), so that one is needed too
               allocated AND coalesce(util_pct IS NOT NULL AND coalesce(sm_active * 100.0, util_pct) < idle_pct,
                                      false) AS idle,
               allocated AND NOT coalesce(util_pct IS NOT NULL AND coalesce(sm_active * 100.0, util_pct) < idle_pct,
                                          false) AS busy
        FROM raw
    ), edges AS (
        SELECT *, min(CASE WHEN busy THEN ts END) OVER seg AS first_busy, max(CASE WHEN busy THEN ts END) OVER seg
                  AS last_busy
        FROM s WINDOW seg AS (PARTITION BY bucket, {KEY})
    ), parts AS (
        SELECT *, idle AND (first_busy IS NULL OR ts < first_busy) AS lead, idle AND ts > last_busy AS tail FROM edges
    )
    SELECT bucket, {KEY}, count(*) AS samples, min(ts) AS first_ts, max(ts) AS last_ts, max({_END}) AS end_ts,
           max(interval_s) AS interval_s, sum(gpu_s) AS gpu_s, coalesce(sum(gpu_s * util_pct / 100.0), 0) AS used_gpu_s,
           coalesce(sum(gpu_s) FILTER (WHERE idle), 0) AS idle_gpu_s,
           coalesce(sum(gpu_s) FILTER (WHERE util_pct IS NOT NULL), 0) AS util_gpu_s,
           coalesce(sum(interval_s) FILTER (WHERE idle), 0) AS idle_s,
           sum(util_pct) AS util_sum, count(util_pct) AS util_n,
           max(mem_used_mib) AS mem_used_max, max(mem_total_mib) AS mem_total_max,
           sum(energy_j) AS energy_j, sum(nvlink_bytes) AS nvlink_bytes, max(temp_c) AS temp_max,
           {_PROFILE_FOLD},
           count(*) FILTER (WHERE busy) AS busy_n,
           coalesce(sum(interval_s) FILTER (WHERE lead), 0) AS lead_s,
           coalesce(sum(gpu_s) FILTER (WHERE lead), 0) AS lead_gpu_s,
           sum(util_pct) FILTER (WHERE lead) AS lead_util_sum, count(util_pct) FILTER (WHERE lead) AS lead_util_n,
           max({_END}) FILTER (WHERE lead) AS lead_end_ts,
           coalesce(sum(interval_s) FILTER (WHERE tail), 0) AS tail_s,
           coalesce(sum(gpu_s) FILTER (WHERE tail), 0) AS tail_gpu_s,
           sum(util_pct) FILTER (WHERE tail) AS tail_util_sum, count(util_pct) FILTER (WHERE tail) AS tail_util_n,
           min(ts) FILTER (WHERE tail) AS tail_start_ts
    FROM parts GROUP BY ALL""",
    # minute rows in [lo, hi) to hour rows, with the hour's idle lead and tail and the stretches inside it. `k` numbers
    # each minute's stretch: the count of minutes with busy samples up to it (a lead closes stretch k - 1).
    f"""CREATE OR REPLACE MACRO hour_rollup_of(lo, hi, only_node) AS TABLE
    WITH m AS (
        SELECT *, date_trunc('hour', bucket) AS hour FROM usage_minute
        WHERE bucket >= lo AND bucket < hi AND (only_node IS NULL OR node = only_node)
    ), k AS (
        SELECT *, sum((busy_n > 0)::INTEGER) OVER (PARTITION BY hour, {KEY} ORDER BY first_ts
                                                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS k,
               min(CASE WHEN busy_n > 0 THEN first_ts END) OVER (PARTITION BY hour, {KEY}) AS first_busy,
               max(CASE WHEN busy_n > 0 THEN first_ts END) OVER (PARTITION BY hour, {KEY}) AS last_busy,
               sum((busy_n > 0)::INTEGER) OVER (PARTITION BY hour, {KEY}) AS busy_rows
        FROM m
    ), pieces AS (  -- idle pieces strictly between the hour's first and last busy minute, by stretch
        SELECT hour, {KEY}, k - 1 AS k, first_ts AS start_ts, lead_end_ts AS end_ts, lead_s AS s, lead_gpu_s AS gpu_s,
               lead_util_sum AS util_sum, lead_util_n AS util_n
        FROM k WHERE busy_n > 0 AND lead_end_ts IS NOT NULL AND k > 1
        UNION ALL
        SELECT hour, {KEY}, k, tail_start_ts, end_ts, tail_s, tail_gpu_s, tail_util_sum, tail_util_n
        FROM k WHERE busy_n > 0 AND tail_start_ts IS NOT NULL AND k < busy_rows
        UNION ALL
        SELECT hour, {KEY}, k, first_ts, lead_end_ts, lead_s, lead_gpu_s, lead_util_sum, lead_util_n
        FROM k WHERE busy_n = 0 AND k >= 1 AND k < busy_rows
    ), inner_runs AS (
        SELECT hour, {KEY}, list({{'start_ts': start_ts, 'end_ts': end_ts, 's': s, 'gpu_s': gpu_s,
                                   'util_sum': util_sum, 'util_n': util_n}} ORDER BY start_ts) AS inner_runs
        FROM (SELECT hour, {KEY}, k, min(start_ts) AS start_ts, max(end_ts) AS end_ts, sum(s) AS s,
                     sum(gpu_s) AS gpu_s, sum(util_sum) AS util_sum, sum(util_n) AS util_n
              FROM pieces GROUP BY ALL HAVING sum(s) >= 60)
        GROUP BY ALL
    ), combined AS (  -- minute rows and inner stretches, grouped together (GROUP BY matches NULL keys; joins do not)
        SELECT *, NULL AS inner_runs FROM k
        UNION ALL BY NAME
        SELECT * FROM inner_runs
    )
    SELECT hour AS bucket, {KEY}, sum(samples) AS samples, min(first_ts) AS first_ts,
           max(last_ts) AS last_ts, max(end_ts) AS end_ts, max(interval_s) AS interval_s, sum(gpu_s) AS gpu_s,
           sum(used_gpu_s) AS used_gpu_s, sum(idle_gpu_s) AS idle_gpu_s, sum(util_gpu_s) AS util_gpu_s,
           sum(idle_s) AS idle_s,
           sum(util_sum) AS util_sum, sum(util_n) AS util_n, max(mem_used_max) AS mem_used_max,
           max(mem_total_max) AS mem_total_max, sum(energy_j) AS energy_j, sum(nvlink_bytes) AS nvlink_bytes,
           max(temp_max) AS temp_max, {", ".join(f"sum({c}) AS {c}" for c in PROFILE_COLUMNS)},
           sum(busy_n) AS busy_n,
           coalesce(sum(lead_s) FILTER (WHERE lead), 0) AS lead_s,
           coalesce(sum(lead_gpu_s) FILTER (WHERE lead), 0) AS lead_gpu_s,
           sum(lead_util_sum) FILTER (WHERE lead) AS lead_util_sum,
           coalesce(sum(lead_util_n) FILTER (WHERE lead), 0) AS lead_util_n,
           max(lead_end_ts) FILTER (WHERE lead) AS lead_end_ts,
           coalesce(sum(CASE WHEN first_ts = last_busy THEN tail_s WHEN first_ts > last_busy THEN lead_s END), 0)
               AS tail_s,
           coalesce(sum(CASE WHEN first_ts = last_busy THEN tail_gpu_s WHEN first_ts > last_busy THEN lead_gpu_s END),
                    0) AS tail_gpu_s,
           sum(CASE WHEN first_ts = last_busy THEN tail_util_sum WHEN first_ts > last_busy THEN lead_util_sum END)
               AS tail_util_sum,
           coalesce(sum(CASE WHEN first_ts = last_busy THEN tail_util_n WHEN first_ts > last_busy THEN lead_util_n
                        END), 0) AS tail_util_n,
           min(CASE WHEN first_ts = last_busy THEN tail_start_ts WHEN first_ts > last_busy THEN first_ts END)
               AS tail_start_ts,
           coalesce(flatten(list(inner_runs) FILTER (WHERE inner_runs IS NOT NULL)), []) AS inner_runs,
           list(util_sum / nullif(util_n, 0) ORDER BY first_ts) FILTER (WHERE samples IS NOT NULL) AS util_minutes
    FROM (SELECT *, first_busy IS NULL OR first_ts <= first_busy AS lead FROM combined)
    GROUP BY hour, {KEY}""",
    # minute rows of [lo, hi) with their idle-stretch edges: folded minutes, then the raw tail from the watermark
    """CREATE OR REPLACE MACRO minute_segments(lo, hi, mwm, idle_pct) AS TABLE
    SELECT * FROM usage_minute
    WHERE bucket >= date_trunc('minute', lo) AND bucket < date_trunc('minute', hi) AND bucket < mwm
    UNION ALL BY NAME
    SELECT * FROM minute_rollup_of(greatest(date_trunc('minute', lo), mwm), date_trunc('minute', hi), NULL,
                                   idle_pct)""",
    # the segments idle stretches are stitched from, for the allocated rows of [lo, hi): hour rows for the whole
    # hours folded, minute rows (and the raw tail) for the rest. A stretch inside an hour, between busy samples, is
    # in that hour row's inner_runs.
    f"""CREATE OR REPLACE MACRO idle_segments(lo, hi, mwm, hwm, idle_pct) AS TABLE
    SELECT {CORE}, {SEGMENT} FROM usage_hour
    WHERE allocated AND bucket >= {_HOURS_FROM} AND bucket < {_HOURS_TO}
    UNION ALL BY NAME
    SELECT * FROM minute_segments(lo, hi, mwm, idle_pct)
    WHERE allocated AND (bucket < {_HOURS_FROM} OR bucket >= {_HOURS_TO})""",
    # the stretches inside the whole hours of [lo, hi), one row each
    f"""CREATE OR REPLACE MACRO inner_idle_runs(lo, hi, hwm) AS TABLE
    SELECT {KEY}, r.start_ts, r.end_ts, r.s, r.gpu_s, r.util_sum, r.util_n
    FROM (SELECT *, unnest(inner_runs) AS r FROM usage_hour
          WHERE allocated AND bucket >= {_HOURS_FROM} AND bucket < {_HOURS_TO} AND len(inner_runs) > 0)""",
    # per-minute mean utilisation of the allocated rows of [lo, hi) of the jobs listed in `jobs` over the samples with
    # a reading (NULL: none had one), one row per minute of each GPU and job: from the hour rows' lists for whole
    # hours, else from minute rows and the raw tail. The job filter comes before the lists are unnested (at 1,000
    # GPUs, unnesting every job's minutes first took 0.25 s for 50 jobs instead of 0.04 s)
    f"""CREATE OR REPLACE MACRO minute_utilisation(lo, hi, mwm, hwm, idle_pct, jobs) AS TABLE
    SELECT job_id, gpu_uuid, mig_profile, unnest(util_minutes) AS util_pct FROM usage_hour
    WHERE allocated AND bucket >= {_HOURS_FROM} AND bucket < {_HOURS_TO} AND job_id IN (SELECT unnest(jobs))
    UNION ALL
    SELECT job_id, gpu_uuid, mig_profile, util_sum / nullif(util_n, 0) FROM minute_segments(lo, hi, mwm, idle_pct)
    WHERE allocated AND (bucket < {_HOURS_FROM} OR bucket >= {_HOURS_TO}) AND job_id IN (SELECT unnest(jobs))""",
    # what every analytic reads: the usage of [lo, hi) at the coarsest grain that answers exactly. `fine`: no hour
    # rows (for buckets shorter than an hour). Hour rows cover the whole hours from lo (rounded up) to hi (rounded
    # down) that are folded; minute rows the rest up to the minute watermark; raw samples the tail. Every bound is
    # an expression of the parameters alone, so DuckDB folds it to a constant and prunes row groups by zone maps.
    f"""CREATE OR REPLACE MACRO usage_between(lo, hi, fine, mwm, hwm, idle_pct) AS TABLE
    SELECT {CORE} FROM usage_hour
    WHERE NOT fine AND bucket >= {_HOURS_FROM} AND bucket < {_HOURS_TO}
    UNION ALL
    SELECT {CORE} FROM usage_minute
    WHERE bucket >= {_LO} AND bucket < least({_HI}, mwm)
      AND (fine OR bucket < {_HOURS_FROM} OR bucket >= {_HOURS_TO})
    UNION ALL
    SELECT {CORE} FROM minute_rollup_of(greatest({_LO}, mwm), {_HI}, NULL, idle_pct)""",
]

# Rollup rows folded before the fold bounded raw values (issue 21): a NULL model, infinite or absurd GPU-seconds
# (a 1e6 gpu_fraction billed $1.9M for one sample) and infinite readings, which turned answers into 500s. Run once
# per store (Store marks it in meta `rollups_bounded`): NULL models become the "unknown" line, non-finite time and
# energy become 0 and non-finite readings NULL, and a row's GPU-seconds are capped at one whole GPU for its samples.
# (`gpuledger compact --rebuild` refolds the raw samples still kept with the bounded fold, for exact figures.)
_ZEROED = ("gpu_s", "used_gpu_s", "idle_gpu_s", "util_gpu_s", "idle_s", "interval_s", "energy_j", "nvlink_bytes",
           "lead_s", "lead_gpu_s", "tail_s", "tail_gpu_s")
_NULLED = ("util_sum", "mem_used_max", "mem_total_max", "temp_max", "lead_util_sum", "tail_util_sum")
BOUND_OLD_ROLLUPS = [
    statement
    for table in ("usage_minute", "usage_hour")
    for statement in (
        f"UPDATE {table} SET gpu_model = '{UNKNOWN_MODEL}' WHERE gpu_model IS NULL",
        *(f"UPDATE {table} SET {c} = 0 WHERE NOT isfinite({c})" for c in _ZEROED),
        *(f"UPDATE {table} SET {c} = NULL WHERE NOT isfinite({c})" for c in _NULLED),
        f"UPDATE {table} SET interval_s = 0 WHERE interval_s > {MAX_INTERVAL_S!r} OR interval_s < 0",
        f"UPDATE {table} SET gpu_s = least(greatest(gpu_s, 0), samples * interval_s) "
        "WHERE gpu_s > samples * interval_s OR gpu_s < 0",
        f"UPDATE {table} SET used_gpu_s = least(greatest(used_gpu_s, 0), gpu_s), "
        "idle_gpu_s = least(greatest(idle_gpu_s, 0), gpu_s) "
        "WHERE used_gpu_s > gpu_s OR used_gpu_s < 0 OR idle_gpu_s > gpu_s OR idle_gpu_s < 0",
        f"UPDATE {table} SET util_gpu_s = least(greatest(util_gpu_s, 0), gpu_s) "
        "WHERE util_gpu_s > gpu_s OR util_gpu_s < 0",
    )
]

# the fold and refold statements (parameters: $lo, $hi, $node (NULL: all), $idle_pct)
FOLD_MINUTES = "INSERT INTO usage_minute BY NAME SELECT * FROM minute_rollup_of($lo, $hi, $node, $idle_pct)"
DROP_MINUTES = "DELETE FROM usage_minute WHERE bucket >= $lo AND bucket < $hi AND ($node IS NULL OR node = $node)"
FOLD_HOURS = "INSERT INTO usage_hour BY NAME SELECT * FROM hour_rollup_of($lo, $hi, $node)"
DROP_HOURS = "DELETE FROM usage_hour WHERE bucket >= $lo AND bucket < $hi AND ($node IS NULL OR node = $node)"
STATE = "SELECT minute_wm, hour_wm, idle_util_pct FROM rollup_state"
