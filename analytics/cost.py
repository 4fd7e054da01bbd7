"""Chargeback: GPU-hours priced by the per-model rate card in force at their time, plus the cost of idle capacity.

A model missing from the rate card is priced at 0 and reported in `unpriced_gpu_hours`, so
an unknown card shows up on the bill instead of vanishing from it. Unallocated GPUs are the
IDLE_CAPACITY line, allocated GPUs no team claims the UNATTRIBUTED line.
"""
from __future__ import annotations

from datetime import datetime

import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import PRICE_JOIN, RATE, RATE_FROM, RATE_VARIANT, USAGE, measured, pooled
from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED

# the rollups of the window priced by the rate card: GPU-hours, used GPU-hours and cost per row
PRICED = f"""
    (SELECT u.*, gpu_s / 3600.0 AS gpu_hours, used_gpu_s / 3600.0 AS used_gpu_hours, {RATE} AS usd_per_gpu_hour,
            {RATE_FROM} AS rate_from, {RATE_VARIANT} AS rate_variant, gpu_s / 3600.0 * coalesce({RATE}, 0) AS cost_usd
     FROM {pooled(USAGE)} u {PRICE_JOIN})"""


def cost_by_team(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per team (and one IDLE_CAPACITY line for unallocated GPUs): GPU-hours, used GPU-hours, cost in USD, and
    `util_coverage`: the share of the GPU-hours with a utilisation reading. Cost needs no reading; used GPU-hours
    are null for a line none of whose GPU-hours were measured (unknown is never zero)."""
    sql = f"""
        SELECT * FROM (
        SELECT bill_line(allocated, team, $unattributed, $idle) AS team,
               sum(gpu_hours) AS gpu_hours, {measured("sum(used_gpu_hours)")} AS used_gpu_hours,
               sum(cost_usd) AS cost_usd,
               coalesce(sum(gpu_hours) FILTER (WHERE usd_per_gpu_hour IS NULL), 0) AS unpriced_gpu_hours,
               sum(util_gpu_s) / nullif(sum(gpu_s), 0) AS util_coverage
        FROM {PRICED}
        GROUP BY 1)
        ORDER BY (team = $idle) ASC, cost_usd DESC"""
    return store.query_usage(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED, "idle": IDLE_CAPACITY})


def cost_by_team_and_model(store: Store, start: datetime, end: datetime, team: str | None = None) -> pd.DataFrame:
    """Per team, GPU model and rate card version (`rate_from`: the start of the version that priced the rows,
    null: unpriced; `rate_variant`: a node pool's or MIG profile's rate, '' the model's own): the rate, allocated
    GPU-hours and their cost."""
    sql = f"""
        SELECT owner(team, $unattributed) AS team, gpu_model, rate_from, rate_variant,
               rate_card_version(rate_from, rate_variant) AS rate_card, any_value(usd_per_gpu_hour) AS usd_per_gpu_hour,
               sum(gpu_hours) AS gpu_hours, sum(cost_usd) AS cost_usd
        FROM {PRICED}
        WHERE allocated AND ($team IS NULL OR owner(team, $unattributed) = $team)
        GROUP BY 1, 2, 3, 4 ORDER BY 1, cost_usd DESC"""
    return store.query_usage(sql, {"start": start, "end": end, "team": team, "unattributed": UNATTRIBUTED})


def daily_cost_by_team(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Cost per UTC day and bill line (teams, unattributed, idle capacity)."""
    sql = f"""
        SELECT utc_day(bucket) AS day, bill_line(allocated, team, $unattributed, $idle) AS team,
               sum(cost_usd) AS cost_usd
        FROM {PRICED} GROUP BY ALL ORDER BY 1, 2"""
    return store.query_usage(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED, "idle": IDLE_CAPACITY})
