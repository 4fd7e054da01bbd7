"""Chargeback: GPU-hours priced by the per-model rate card, plus the cost of idle capacity.

A model missing from the rate card is priced at 0 and reported in `unpriced_gpu_hours`, so
an unknown card shows up on the bill instead of vanishing from it.
"""
from __future__ import annotations

from datetime import datetime

import pandas as pd

from analytics.store import Store

IDLE_CAPACITY = "idle capacity"


def cost_by_team(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per team (and one 'idle capacity' line for unallocated GPUs): GPU-hours, used GPU-hours, cost in USD."""
    sql = """
        SELECT * FROM (
        SELECT CASE WHEN s.allocated THEN coalesce(s.team, 'unattributed') ELSE ? END AS team,
               sum(s.interval_s * s.gpu_fraction) / 3600.0 AS gpu_hours,
               sum(s.interval_s * s.gpu_fraction * coalesce(s.util_pct, 0) / 100.0) / 3600.0 AS used_gpu_hours,
               sum(s.interval_s * s.gpu_fraction / 3600.0 * coalesce(r.usd_per_gpu_hour, 0)) AS cost_usd,
               coalesce(sum(s.interval_s * s.gpu_fraction) FILTER (WHERE r.usd_per_gpu_hour IS NULL), 0)
                   / 3600.0 AS unpriced_gpu_hours
        FROM samples s LEFT JOIN rate_card r USING (gpu_model)
        WHERE s.ts >= ? AND s.ts < ?
        GROUP BY 1)
        ORDER BY (team = ?) ASC, cost_usd DESC"""
    return store.query(sql, [IDLE_CAPACITY, start, end, IDLE_CAPACITY])


def cost_by_team_and_model(store: Store, start: datetime, end: datetime, team: str | None = None) -> pd.DataFrame:
    sql = """
        SELECT coalesce(s.team, 'unattributed') AS team, s.gpu_model,
               any_value(r.usd_per_gpu_hour) AS usd_per_gpu_hour,
               sum(s.interval_s * s.gpu_fraction) / 3600.0 AS gpu_hours,
               sum(s.interval_s * s.gpu_fraction / 3600.0 * coalesce(r.usd_per_gpu_hour, 0)) AS cost_usd
        FROM samples s LEFT JOIN rate_card r USING (gpu_model)
        WHERE s.allocated AND s.ts >= ? AND s.ts < ? AND (? IS NULL OR coalesce(s.team, 'unattributed') = ?)
        GROUP BY 1, 2 ORDER BY 1, cost_usd DESC"""
    return store.query(sql, [start, end, team, team])
