"""Fairshare history with Slurm's classic factor F = 2^(-U/S).

U is a team's usage decayed with a half-life and normalised by all teams' decayed usage;
S is its share normalised by all shares. F = 1 means no recent usage, 0.5 means usage
exactly at its share, lower means over-served. Teams without a share (the unattributed
bucket) are left out: nothing can be owed to them.
"""
from __future__ import annotations

from datetime import datetime

import numpy as np
import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import hourly_team_usage

HISTORY_COLUMNS = ["hour", "team", "gpu_hours", "decayed_usage", "norm_usage", "norm_share", "fairshare"]


def fairshare_factors(usage: pd.DataFrame, shares: dict[str, float], half_life_hours: float) -> pd.DataFrame:
    """Per hour and team: usage, decayed usage, normalised usage/share and F; `usage` has hour, team, gpu_hours."""
    teams = [t for t, s in shares.items() if s > 0]
    if not teams:
        return pd.DataFrame(columns=HISTORY_COLUMNS)
    usage = usage[usage["team"].isin(teams)]
    if usage.empty:
        return pd.DataFrame(columns=HISTORY_COLUMNS)
    grid = pd.date_range(usage["hour"].min(), usage["hour"].max(), freq="h")
    wide = usage.pivot_table(index="hour", columns="team", values="gpu_hours", aggfunc="sum")
    wide = wide.reindex(index=grid, columns=teams).fillna(0.0)
    decay = 2.0 ** (-1.0 / half_life_hours)
    values = wide.to_numpy()
    decayed = np.zeros_like(values)
    running = np.zeros(values.shape[1])
    for i, row in enumerate(values):
        running = running * decay + row
        decayed[i] = running
    totals = decayed.sum(axis=1, keepdims=True)
    norm_usage = np.divide(decayed, totals, out=np.zeros_like(decayed), where=totals > 0)
    share = np.array([shares[t] for t in teams], dtype=float)
    norm_share = share / share.sum()
    factor = np.power(2.0, -norm_usage / norm_share)
    frame = pd.DataFrame({
        "hour": np.repeat(grid, len(teams)),
        "team": np.tile(teams, len(grid)),
        "gpu_hours": values.ravel(),
        "decayed_usage": decayed.ravel(),
        "norm_usage": norm_usage.ravel(),
        "norm_share": np.tile(norm_share, len(grid)),
        "fairshare": factor.ravel(),
    })
    return frame


def team_shares(store: Store) -> dict[str, float]:
    """Each configured team's share (the S of F = 2^(-U/S), before normalising)."""
    teams = store.team_table()
    return dict(zip(teams["team"], teams["share"].astype(float)))


def fairshare_history(store: Store, start: datetime, end: datetime, half_life_days: float) -> pd.DataFrame:
    """The factor per team and hour over [start, end), from the allocated GPU-hours stored."""
    return fairshare_factors(hourly_team_usage(store, start, end), team_shares(store), half_life_days * 24.0)
