"""Energy per team and job: the kWh their GPUs drew, from the power readings of the raw samples.

A sample stands for `interval_s` seconds of `gpu_fraction` of a GPU drawing its power reading (the average over
the interval where the exporter gives one, else the instantaneous draw); a MIG instance is its fraction of the
card's draw. Read from the raw samples, which are kept `[retention] raw_days`: a window reaching further back says
from when its figures are complete. A sample without a power reading counts for GPU-hours but not for energy, and
`power_coverage` says the share of GPU-hours read; a team or job none of whose GPU-hours had a reading has no
energy figure (null), never 0. `facility_kwh` is the GPU energy times the PUE of the site's on-premises cost
model, where one is configured (the cooling and power delivery a data centre adds).
"""
from __future__ import annotations

from datetime import datetime

import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED

WATTS = "coalesce(power_avg_w, power_w)"
GPU_S = "seconds_of(interval_s) * share_of(gpu_fraction)"


def energy(store: Store, start: datetime, end: datetime, by_job: bool = False, pue: float | None = None,
           limit: int = 100) -> pd.DataFrame:
    """Per bill line (and job, `by_job`; the `limit` most energy-hungry): GPU-hours, GPU kWh (null without any
    reading), the share of GPU-hours with a power reading, and facility kWh at `pue` (null without one)."""
    job = ", job_id" if by_job else ""
    sql = f"""
        SELECT bill_line(allocated, team, $unattributed, $idle) AS team{job},
               sum({GPU_S}) / 3600.0 AS gpu_hours,
               CASE WHEN count({WATTS}) > 0
                    THEN sum({WATTS} * {GPU_S}) FILTER (WHERE {WATTS} IS NOT NULL) / 3.6e6 END AS gpu_kwh,
               sum({GPU_S}) FILTER (WHERE {WATTS} IS NOT NULL) / nullif(sum({GPU_S}), 0) AS power_coverage
        FROM samples WHERE ts >= $start AND ts < $end {"AND job_id IS NOT NULL" if by_job else ""}
        GROUP BY ALL ORDER BY gpu_kwh DESC NULLS LAST LIMIT $limit"""
    frame = store.query(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED, "idle": IDLE_CAPACITY,
                              "limit": limit})
    frame["power_coverage"] = frame["power_coverage"].fillna(0.0)
    frame["facility_kwh"] = frame["gpu_kwh"] * pue if pue is not None else float("nan")
    return frame


def complete_from(store: Store) -> datetime | None:
    """The oldest raw sample kept: energy figures are complete from here on."""
    return store.scalar("SELECT min(ts) FROM samples")
