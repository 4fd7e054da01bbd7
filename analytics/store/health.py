"""GPU health events: what changed in the health readings the samples carry, one row per event and holder.

Why events and not readings: an XID field holds the last error until the next one, ECC and row-remap fields are
counters since boot, and throttle reasons are a bitmask read at each instant, so what an admin wants to see (an
XID 79 hit job X's GPU at 14:02; GPU 3 started throttling on heat) is a change between two readings. Events are
derived from the samples in the same transactions that fold them into the rollups (analytics/store/database.py),
so a late or replayed batch re-derives its minutes and the events always equal their samples.

An event is stored once per job that held the GPU at that instant (a GPU shared by pods, or split by MIG, names
each of them), or once with no job when the GPU was free. A reading is compared with the GPU's previous one up to
LOOKBACK before; the first reading of a GPU with a non-zero XID counts as that XID, a counter's first reading
does not (nothing says when it rose). Throttling counts as a new event only after SETTLE_MIN minutes without it.
"""
from __future__ import annotations

from gpuledger.collector.gpu_health import COUNTER_KINDS, ROW_REMAP_FAILURE, THROTTLE_KINDS, XID
from gpuledger.collector.samples import HEALTH_COLUMNS

LOOKBACK_MIN = 15
# throttling flaps from one reading to the next: a new throttle event needs its bits clear this long before
SETTLE_MIN = 5
LOOKBACK = f"INTERVAL {LOOKBACK_MIN} MINUTE"

DDL = [
    """CREATE TABLE IF NOT EXISTS health_events (
    ts TIMESTAMPTZ NOT NULL, node VARCHAR NOT NULL, gpu_uuid VARCHAR NOT NULL, gpu_index INTEGER, gpu_model VARCHAR,
    kind VARCHAR NOT NULL, code BIGINT, increase BIGINT, job_id VARCHAR, team VARCHAR, "user" VARCHAR,
    namespace VARCHAR, pod VARCHAR)""",
]

# one SELECT per kind of event over `changes` (a GPU's reading beside its previous one, p_*)
_KINDS = [
    f"SELECT *, '{XID}' AS kind, xid AS code, 1 AS increase FROM changes "
    "WHERE xid > 0 AND xid IS DISTINCT FROM p_xid",
    *(f"SELECT *, '{kind}', throttle_reasons, 1 FROM changes WHERE (throttle_reasons & {mask}) <> 0 "
      f"AND (coalesce(recent_throttle, 0) & {mask}) = 0" for kind, mask in THROTTLE_KINDS.items()),
    *(f"SELECT *, '{kind}', NULL, {column} - p_{column} FROM changes WHERE {column} > p_{column}"
      for kind, column in COUNTER_KINDS.items()),
    f"SELECT *, '{ROW_REMAP_FAILURE}', NULL, 1 FROM changes "
    "WHERE row_remap_failed AND NOT coalesce(p_row_remap_failed, false)",
]

# events of [$lo, $hi) for one node ($node) or all (NULL)


def _reading(alias: str = "") -> str:
    """A sample carrying any health reading."""
    return "(" + " OR ".join(f"{alias}{c} IS NOT NULL" for c in HEALTH_COLUMNS) + ")"


# Who held the GPU is looked up for the readings that are events only: gathering every reading's holders first (a
# list of structs per GPU and instant) took two thirds of the whole fold's time.
FOLD = f"""INSERT INTO health_events
WITH per_gpu AS (  -- one reading per GPU and instant: a shared or MIG-split GPU repeats it on each row
    SELECT ts, node, gpu_uuid, any_value(gpu_index) AS gpu_index, any_value(gpu_model) AS gpu_model,
           max(xid) AS xid, bit_or(throttle_reasons) AS throttle_reasons, max(ecc_sbe_total) AS ecc_sbe_total,
           max(ecc_dbe_total) AS ecc_dbe_total, max(remapped_rows_corr) AS remapped_rows_corr,
           max(remapped_rows_uncorr) AS remapped_rows_uncorr, bool_or(row_remap_failed) AS row_remap_failed
    FROM samples
    WHERE ts >= $lo - {LOOKBACK} AND ts < $hi AND ($node IS NULL OR node = $node) AND {_reading()}
    GROUP BY ts, node, gpu_uuid
), changes AS (
    SELECT *, {', '.join(f'lag({c}) OVER w AS p_{c}' for c in HEALTH_COLUMNS)},
           bit_or(throttle_reasons) OVER (w RANGE BETWEEN INTERVAL {SETTLE_MIN} MINUTE PRECEDING
                                            AND INTERVAL 1 MICROSECOND PRECEDING) AS recent_throttle
    FROM per_gpu WINDOW w AS (PARTITION BY node, gpu_uuid ORDER BY ts)
), events AS (
    {' UNION ALL '.join(_KINDS)}
), found AS (
    SELECT * FROM events WHERE ts >= $lo
), holders AS (
    SELECT s.ts, s.node, s.gpu_uuid,
           list(DISTINCT {{'job_id': s.job_id, 'team': s.team, 'user': s."user", 'namespace': s.namespace,
                          'pod': s.pod}}) FILTER (WHERE s.allocated AND s.job_id IS NOT NULL) AS holders
    FROM samples s JOIN (SELECT DISTINCT ts, node, gpu_uuid FROM found) k
         ON s.ts = k.ts AND s.node = k.node AND s.gpu_uuid = k.gpu_uuid
    WHERE s.ts >= $lo AND s.ts < $hi AND {_reading('s.')}
    GROUP BY s.ts, s.node, s.gpu_uuid
), held AS (
    SELECT found.*, unnest(CASE WHEN coalesce(len(h.holders), 0) = 0 THEN [NULL] ELSE h.holders END) AS holder
    FROM found LEFT JOIN holders h ON found.ts = h.ts AND found.node = h.node AND found.gpu_uuid = h.gpu_uuid
)
SELECT ts, node, gpu_uuid, gpu_index, gpu_model, kind, code, increase, holder.job_id, holder.team, holder."user",
       holder.namespace, holder.pod
FROM held"""

DROP = "DELETE FROM health_events WHERE ts >= $lo AND ts < $hi AND ($node IS NULL OR node = $node)"
