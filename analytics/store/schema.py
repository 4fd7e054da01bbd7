"""DuckDB DDL, derived from the collector's Arrow schema so the two cannot drift apart."""
from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

from gpuledger.collector.samples import PROCESS_SCHEMA, PROFILING_FIELDS, SAMPLE_SCHEMA

_DUCK_TYPES = {
    pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ",
    pa.float64(): "DOUBLE",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.string(): "VARCHAR",
    pa.bool_(): "BOOLEAN",
}


# The physical range of each optional reading (inclusive): ingest refuses a finite value outside it
# (ingest_screen.py), and the rollups' fold reads one outside it as missing (rollups.py), so rows that reached a
# store some other way (an older server, an import) cannot sum to infinities either.
MAX_MEM_MIB = 16 * 1024 * 1024.0  # 16 TiB: far above any card (a B300 has 288 GB), far below an overflow
MAX_RATE_BPS = 1e13  # NVLink/PCIe bytes per second: 10 TB/s, over 5x NVLink 5's 1.8 TB/s per GPU
READING_RANGES: dict[str, tuple[float, float]] = {
    "util_pct": (0.0, 100.0),
    **{name: (0.0, 1.0) for name in PROFILING_FIELDS},
    **{name: (0.0, MAX_MEM_MIB) for name in ("mem_used_mib", "mem_free_mib", "mem_reserved_mib", "mem_total_mib")},
    "power_w": (0.0, 5000.0), "power_avg_w": (0.0, 5000.0),  # W: a GB200 superchip is 2.7 kW, a B200 1 kW
    "temp_c": (-40.0, 150.0),  # °C: electronics' lowest rating to past any GPU's shutdown temperature (~105)
    **{name: (0.0, MAX_RATE_BPS) for name in ("nvlink_tx_bps", "nvlink_rx_bps", "pcie_tx_bps", "pcie_rx_bps",
                                              "nvlink_bps")},
}
# the longest time one sample may stand for: a day (the longest interval an agent may declare; imported traces
# cut holdings at clock hours). The fold counts a longer, non-finite or non-positive interval as no time at all.
MAX_INTERVAL_S = 86400.0


def _columns(schema: pa.Schema) -> str:
    return ",\n    ".join(f'"{f.name}" {_DUCK_TYPES[f.type]}' for f in schema)


# agent batch ids stored, committed with their samples so a retried batch is recognised: one row per
# run of consecutive ids stored together (a request), not per batch, and no index (the server keeps
# the runs in memory, analytics/batch_ids.py); rows and rejected are totals over the run
INGEST_RUNS = """CREATE TABLE IF NOT EXISTS ingest_runs (
    node VARCHAR NOT NULL, stream VARCHAR NOT NULL, first_seq BIGINT NOT NULL, last_seq BIGINT NOT NULL,
    rows BIGINT NOT NULL, rejected BIGINT NOT NULL, received_ts TIMESTAMPTZ NOT NULL)"""

# the rate card with its history (schema 14): each GPU model's rate from its effective start until the model's next
# one; a sample is priced at the rate in force at its time (analytics/usage.py PRICE_JOIN). No key: a card is
# replaced whole, in one transaction, by Store.set_rates, which refuses one that re-prices a closed period.
RATE_VERSIONS = """CREATE TABLE IF NOT EXISTS rate_versions (
    gpu_model VARCHAR NOT NULL, effective_from TIMESTAMPTZ NOT NULL, usd_per_gpu_hour DOUBLE NOT NULL,
    basis VARCHAR)"""  # basis: how a cost model derived the rate (analytics/cost_models.py); null: given as is

# jobs columns added after the first schema: the lifecycle a scheduler reports (collector/jobs/lifecycle.py)
JOB_LIFECYCLE_COLUMNS = {"eligible_ts": "TIMESTAMPTZ", "partition": "VARCHAR", "qos": "VARCHAR",
                         "account": "VARCHAR", "exit_code": "VARCHAR", "restarts": "INTEGER",
                         "pending_reason": "VARCHAR", "name": "VARCHAR", "source": "VARCHAR",
                         "workload_class": "VARCHAR", "class_rule": "VARCHAR",
                         # the GPU types a Slurm job's AllocTRES named (`gres/gpu:a100=4`: a100), as written:
                         # what a Slurm plan must call the model's GPUs (policies/emitters/slurm.py)
                         "gres_type": "VARCHAR"}


DDL = [
    f"CREATE TABLE IF NOT EXISTS samples (\n    {_columns(SAMPLE_SCHEMA)}\n)",
    f"CREATE TABLE IF NOT EXISTS processes (\n    {_columns(PROCESS_SCHEMA)}\n)",
    """CREATE TABLE IF NOT EXISTS jobs (
    job_id VARCHAR PRIMARY KEY, team VARCHAR, "user" VARCHAR, namespace VARCHAR, pod VARCHAR,
    node VARCHAR, gpu_model VARCHAR, gpus INTEGER, submit_ts TIMESTAMPTZ, start_ts TIMESTAMPTZ,
    end_ts TIMESTAMPTZ, state VARCHAR, """ + ", ".join(f'"{n}" {k}' for n, k in JOB_LIFECYCLE_COLUMNS.items()) + ")",
    # what happened to each job, as its scheduler says (collector/jobs/lifecycle.py EVENTS); replaced per job and
    # source whenever the job is read again, so it always agrees with the job's row
    """CREATE TABLE IF NOT EXISTS job_events (
    job_id VARCHAR NOT NULL, ts TIMESTAMPTZ NOT NULL, event VARCHAR NOT NULL, detail VARCHAR, source VARCHAR)""",
    # what the schedulers say of their queues, one figure per row (collector/jobs/queues.py QUEUE_FIGURES); a
    # read's rows replace those of the same scheduler at the same instant; schema 11
    """CREATE TABLE IF NOT EXISTS queue_metrics (
    ts TIMESTAMPTZ NOT NULL, scheduler VARCHAR NOT NULL, queue VARCHAR NOT NULL, cohort VARCHAR, flavor VARCHAR,
    figure VARCHAR NOT NULL, detail VARCHAR, value DOUBLE, source VARCHAR)""",
    # what inference servers and training jobs report of themselves (collector/apps: vLLM, Triton, TGI, SGLang, the
    # training convention), one figure part per row as read (cumulative counters as they were: resets are handled by
    # the analytics), with the pod and team they belong to; a read's rows replace those of the same target and
    # instant; schema 12
    """CREATE TABLE IF NOT EXISTS app_samples (
    ts TIMESTAMPTZ NOT NULL, target VARCHAR NOT NULL, kind VARCHAR NOT NULL, service VARCHAR NOT NULL,
    instance VARCHAR NOT NULL, namespace VARCHAR, pod VARCHAR, team VARCHAR, job_id VARCHAR, figure VARCHAR NOT NULL,
    part VARCHAR NOT NULL, le DOUBLE, value DOUBLE NOT NULL)""",
    # each app row's series (app_series), its read before it in its series and the counter's increase since then
    # (APP_INCREASE), kept at ingest so a week's rates and quantiles are a sum per series, not a window over
    # millions of rows; schema 13
    "ALTER TABLE app_samples ADD COLUMN IF NOT EXISTS series_id BIGINT",
    "ALTER TABLE app_samples ADD COLUMN IF NOT EXISTS prev_ts TIMESTAMPTZ",
    "ALTER TABLE app_samples ADD COLUMN IF NOT EXISTS increase DOUBLE",
    # every app series (APP_SERIES, and the team and job its rows are billed to) once, with its newest read: what
    # the next read's increase is counted from, and what a week's per-series sums are labelled with
    """CREATE TABLE IF NOT EXISTS app_series (
    series_id BIGINT NOT NULL, target VARCHAR NOT NULL, kind VARCHAR NOT NULL, service VARCHAR NOT NULL,
    instance VARCHAR NOT NULL, namespace VARCHAR, pod VARCHAR, figure VARCHAR NOT NULL, part VARCHAR NOT NULL,
    le DOUBLE, team VARCHAR, job_id VARCHAR, ts TIMESTAMPTZ NOT NULL, value DOUBLE NOT NULL)""",
    # each series' reads per UTC clock hour, folded at ingest (APP_HOUR_FOLD): first and last read, the sum, count
    # and top of its finite values, its increases and how many were counted, and its first read's previous read
    # and increase (the one step that may come from before the hour: a window starting after that read leaves it
    # out). A week's service figures read these and the raw rows of the window's partial hours only.
    """CREATE TABLE IF NOT EXISTS app_hour (
    series_id BIGINT NOT NULL, hour TIMESTAMPTZ NOT NULL, lo TIMESTAMPTZ NOT NULL, hi TIMESTAMPTZ NOT NULL,
    total DOUBLE, n BIGINT NOT NULL, top DOUBLE, increase DOUBLE, counted BIGINT NOT NULL,
    first_prev_ts TIMESTAMPTZ, first_increase DOUBLE)""",
    "CREATE TABLE IF NOT EXISTS teams (team VARCHAR PRIMARY KEY, share DOUBLE NOT NULL, quota_gpus INTEGER)",
    RATE_VERSIONS,
    "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
    INGEST_RUNS,
    """CREATE TABLE IF NOT EXISTS nodes (
    node VARCHAR PRIMARY KEY, last_seen TIMESTAMPTZ NOT NULL, interval_s DOUBLE NOT NULL,
    batches BIGINT NOT NULL, rows BIGINT NOT NULL)""",
    # the department above a team (hierarchical fairshare, parent queues); schema 4
    "ALTER TABLE teams ADD COLUMN IF NOT EXISTS parent VARCHAR",
    # a team's current guarantee and limit per GPU model, as the site config states them
    """CREATE TABLE IF NOT EXISTS team_quotas (
    team VARCHAR NOT NULL, gpu_model VARCHAR NOT NULL, guarantee_gpus DOUBLE, limit_gpus DOUBLE)""",
    # every recommendation made, and what was decided about it: the audit trail. No primary key: DuckDB
    # updates a row under an index by delete and insert, and a status change must never fail on that.
    """CREATE TABLE IF NOT EXISTS recommendations (
    id VARCHAR NOT NULL, created TIMESTAMPTZ NOT NULL, kind VARCHAR NOT NULL, team VARCHAR NOT NULL,
    gpu_model VARCHAR, job_id VARCHAR, action JSON NOT NULL, evidence JSON NOT NULL, reason VARCHAR NOT NULL,
    status VARCHAR NOT NULL, decided_by VARCHAR, decided_at TIMESTAMPTZ, note VARCHAR)""",
    # FGD fragmentation per node at an instant, recorded every few minutes (analytics/fragmentation.py); schema 6
    """CREATE TABLE IF NOT EXISTS fragmentation_history (
    ts TIMESTAMPTZ NOT NULL, node VARCHAR NOT NULL, gpu_model VARCHAR, gpus DOUBLE NOT NULL,
    idle_gpus DOUBLE NOT NULL, fragmented_gpus DOUBLE NOT NULL)""",
    # the ledger (analytics/ledger.py), schema 14: a closed period, its statement's lines (per bill line, GPU model
    # and rate version, in cents) and the adjustments booked into a period; none of them is updated or deleted
    """CREATE TABLE IF NOT EXISTS ledger_periods (
    period VARCHAR NOT NULL, start_ts TIMESTAMPTZ NOT NULL, end_ts TIMESTAMPTZ NOT NULL,
    closed_at TIMESTAMPTZ NOT NULL, closed_by VARCHAR NOT NULL, split VARCHAR NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS statement_lines (
    period VARCHAR NOT NULL, team VARCHAR NOT NULL, kind VARCHAR NOT NULL, shared_from VARCHAR, gpu_model VARCHAR,
    rate_from TIMESTAMPTZ,
    usd_per_gpu_hour DOUBLE, gpu_hours DOUBLE NOT NULL, used_gpu_hours DOUBLE, util_coverage DOUBLE,
    cost_usd DECIMAL(18, 2) NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS ledger_adjustments (
    id VARCHAR NOT NULL, period VARCHAR NOT NULL, corrects VARCHAR NOT NULL, team VARCHAR NOT NULL,
    usd DECIMAL(18, 2) NOT NULL, reason VARCHAR NOT NULL, made_by VARCHAR NOT NULL, made_at TIMESTAMPTZ NOT NULL)""",
    # schema 15: a rate's variant (analytics/store/rates.py: '' the model's own, `pool <name>`, `profile <name>`),
    # the node pool rules (first match wins: a node label naming the pool, or a node-name glob), the node labels
    # kube-state-metrics reports (the newest of each), and which variant priced a statement line
    "ALTER TABLE rate_versions ADD COLUMN IF NOT EXISTS variant VARCHAR",
    "UPDATE rate_versions SET variant = '' WHERE variant IS NULL",
    """CREATE TABLE IF NOT EXISTS pool_rules (
    ord INTEGER NOT NULL, pool VARCHAR, pattern VARCHAR, label VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS node_labels (
    node VARCHAR NOT NULL, label VARCHAR NOT NULL, value VARCHAR NOT NULL, seen_ts TIMESTAMPTZ NOT NULL)""",
    "ALTER TABLE statement_lines ADD COLUMN IF NOT EXISTS rate_variant VARCHAR",
]


# one series of an inference server's figure, as read from one target: what a counter's increase is counted along;
# with the team and job its rows are billed to, one row of app_series
APP_SERIES = ("target", "kind", "service", "instance", "namespace", "pod", "figure", "part", "le")
APP_SERIES_ID = (*APP_SERIES, "team", "job_id")
# a cumulative figure's increase since the series' read before (`prev_value`), as Prometheus' increase() counts a
# step: the difference, or the new value itself where it fell (a counter reset when a server restarts); none for
# a first read or a value that is not finite. Gauges get one too, and analytics never sums them.
APP_INCREASE = """CASE WHEN prev_value IS NULL OR NOT isfinite(value) OR NOT isfinite(prev_value) THEN NULL
                      WHEN value >= prev_value THEN value - prev_value ELSE value END"""

# app_hour's row of each (series_id, hour) in temp table app_touched, from app_samples ($since: the first hour)
APP_HOUR_FOLD = """
    INSERT INTO app_hour
    SELECT series_id, utc_hour(ts) AS hour, min(ts), max(ts), sum(value) FILTER (WHERE isfinite(value)),
           count(*) FILTER (WHERE isfinite(value)), max(value) FILTER (WHERE isfinite(value)), sum(increase),
           count(increase), arg_min_null(prev_ts, ts), arg_min_null(increase, ts)
    FROM app_samples
    WHERE ts >= $since AND (series_id, utc_hour(ts)) IN (SELECT series_id, hour FROM app_touched)
    GROUP BY ALL"""

# the key of each table whose rows are replaced by key (DuckDB: its PRIMARY KEY; DuckLake has no keys)
KEYS = {"jobs": "job_id", "teams": "team", "meta": "key", "nodes": "node"}


def without_keys(statement: str) -> str:
    """A CREATE TABLE without its PRIMARY KEY, for DuckLake (which has none; the store replaces rows by KEYS)."""
    return statement.replace(" PRIMARY KEY", "")


def column_migrations(existing: set[str]) -> list[str]:
    """ALTERs that add sample columns a newer collector emits to a store created by an older one."""
    return [f'ALTER TABLE samples ADD COLUMN "{f.name}" {_DUCK_TYPES[f.type]}'
            for f in SAMPLE_SCHEMA if f.name not in existing]


def job_column_migrations(existing: set[str]) -> list[str]:
    """ALTERs that give a jobs table (new, or from an older store) the lifecycle columns."""
    return [f'ALTER TABLE jobs ADD COLUMN "{name}" {kind}' for name, kind in JOB_LIFECYCLE_COLUMNS.items()
            if name not in existing]


def table_migrations(existing: set[str]) -> list[str]:
    """Statements that carry a store written by an older gpuledger forward (run before the DDL's tables exist)."""
    statements = []
    if "ingest_batches" in existing:  # schema 2 kept one indexed row per batch
        statements += [
            INGEST_RUNS,
            """INSERT INTO ingest_runs
               SELECT node, stream, min(seq), max(seq), sum(rows), sum(rejected), max(received_ts) FROM (
                   SELECT *, seq - row_number() OVER (PARTITION BY node, stream ORDER BY seq) AS run
                   FROM ingest_batches)
               GROUP BY node, stream, run""",
            "DROP TABLE ingest_batches",
        ]
    if "rate_card" in existing:  # schema 13 kept one undated rate per model: in force since ever
        statements += [RATE_VERSIONS,
                       "INSERT INTO rate_versions SELECT gpu_model, TIMESTAMPTZ '1970-01-01 00:00:00+00', "
                       "usd_per_gpu_hour, NULL FROM rate_card",
                       "DROP TABLE rate_card"]
    return statements


# 5: rollups (usage_minute, usage_hour, rollup_state); 6: health columns and events, fragmentation history;
# 7: API tokens and the audit log (analytics/store/access.py); 8: the rollups keep the hottest temperature;
# 9: the rollups keep the GPU-seconds with a utilisation reading (util_gpu_s): a sample without one is unknown;
# 10: job lifecycle columns and job_events; 11: the schedulers' queue metrics, a job's workload class; 12: profiling
# rollups and inference servers' figures; 13: app rows keep their series and increase (app_series); 14: dated rate
# cards (rate_versions) and the ledger's closed periods, statements and adjustments; 15: rates per node pool and MIG
# profile (rate_versions.variant, pool_rules, node_labels)
SCHEMA_VERSION = "15"
# the start of a rate card's undated rates ([rates] in the config): in force before any dated version
SINCE_EVER = datetime(1970, 1, 1, tzinfo=timezone.utc)


# The query layer: the owner bucket and the bill line, each written once for every query (GPU-hours and cost
# are the rollups' gpu_s priced by the rate card: analytics/store/rollups.py, analytics/cost.py). Macros are
# expanded when a query is planned, so they cost nothing at run time. Bucket names (unattributed, idle capacity)
# are not written here: queries pass them as parameters.
QUERY_LAYER = [
    # the team a sample is billed to: its team, else the unattributed bucket
    "CREATE OR REPLACE MACRO owner(team, unattributed) AS coalesce(team, unattributed)",
    # the line of the bill: the owner when a job held the GPU, else the idle-capacity bucket
    """CREATE OR REPLACE MACRO bill_line(allocated, team, unattributed, idle) AS
       CASE WHEN allocated THEN owner(team, unattributed) ELSE idle END""",
    # which version of the rate card priced a line, from its start: "[rates]" (the undated rates), "from <start>"
    # (a dated version), null (unpriced: the model had no rate then); a node pool's or MIG profile's rate says so
    """CREATE OR REPLACE MACRO rate_card_version(since, variant) AS
       CASE WHEN since IS NULL THEN NULL WHEN since < TIMESTAMPTZ '1971-01-01 00:00:00+00' THEN '[rates]'
            ELSE 'from ' || strftime(since, '%Y-%m-%d %H:%M') || ' UTC' END
       || CASE WHEN since IS NOT NULL AND coalesce(variant, '') <> '' THEN ' (' || variant || ')' ELSE '' END""",
    # the node pool a node is in: the first rule that names it (analytics/store/rates.py replace_pools), by one of
    # its labels' value (kube-state-metrics' kube_node_labels) or its name's glob; null: no pool. A correlated
    # subquery, which DuckDB runs once per distinct node of the query, not per row (in a projection: it refuses one
    # in an outer join's condition, analytics/usage.py pooled)
    """CREATE OR REPLACE MACRO pool_of(n) AS (
       SELECT arg_min(pool, ord) FROM (
           SELECT r.ord, l.value AS pool FROM pool_rules r JOIN node_labels l ON l.label = r.label WHERE l.node = n
           UNION ALL
           SELECT ord, pool FROM pool_rules WHERE label IS NULL AND n GLOB pattern))""",
    "DROP VIEW IF EXISTS priced_samples",  # schema 4 priced raw samples; analytics read the rollups since schema 5
    # the UTC clock hour and day of an instant, by integer arithmetic: date_trunc on TIMESTAMPTZ goes through the
    # time-zone library and took 60 ms per 220 k hour rows at 1,000 GPUs, this 5 (the store's zone is UTC)
    "CREATE OR REPLACE MACRO utc_hour(t) AS to_timestamp(epoch_us(t) // 3600000000 * 3600)",
    "CREATE OR REPLACE MACRO utc_day(t) AS to_timestamp(epoch_us(t) // 86400000000 * 86400)",
]
