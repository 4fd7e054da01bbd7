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


def energy(store: Store, start: datetime, end: datetime, pue: float | None = None,
           limit: int = 100) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per bill line, per job: the `limit` most energy-hungry), each with GPU-hours, GPU kWh (null without any
    reading), the share of GPU-hours with a power reading, and facility kWh at `pue` (null without one). One scan
    of the window's raw samples, grouped by line and job, summed per line after."""
    sql = f"""
        SELECT bill_line(allocated, team, $unattributed, $idle) AS team, job_id,
               sum({GPU_S}) AS gpu_s, sum({GPU_S}) FILTER (WHERE {WATTS} IS NOT NULL) AS read_s,
               sum({WATTS} * {GPU_S}) FILTER (WHERE {WATTS} IS NOT NULL) AS joules
        FROM samples WHERE ts >= $start AND ts < $end GROUP BY ALL"""
    rows = store.query(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED, "idle": IDLE_CAPACITY})
    teams = rows.groupby("team", as_index=False)[["gpu_s", "read_s", "joules"]].sum(min_count=1)
    jobs = rows[rows["job_id"].notna()]
    return _figures(teams, pue), _figures(jobs, pue).sort_values("gpu_kwh", ascending=False,
                                                                 na_position="last").head(limit)


def _figures(frame: pd.DataFrame, pue: float | None) -> pd.DataFrame:
    read = frame["read_s"].fillna(0.0)
    out = frame.drop(columns=["gpu_s", "read_s", "joules"]).assign(
        gpu_hours=frame["gpu_s"] / 3600.0,
        gpu_kwh=(frame["joules"] / 3.6e6).where(read > 0),  # unknown is never zero
        power_coverage=(read / frame["gpu_s"].where(frame["gpu_s"] > 0)).fillna(0.0))
    out["facility_kwh"] = out["gpu_kwh"] * pue if pue is not None else float("nan")
    return out.reset_index(drop=True)


def complete_from(store: Store) -> datetime | None:
    """The oldest raw sample kept: energy figures are complete from here on."""
    return store.scalar("SELECT min(ts) FROM samples")
