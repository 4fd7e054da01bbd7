"""Fairshare: how far each team is from its share, over time, by the algorithm the site's scheduler uses.

Three algorithms, one file each behind `FairshareAlgorithm`, chosen by `[fairshare] algorithm`:
`slurm_classic` (F = 2^(-U/S)), `slurm_fair_tree` (LevelFS = S/U and rank-based FairShare over the
account tree) and `kai_time_based` (KAI's over-quota weight P = max(0, W + k(W - U)) from windowed usage).
Every history has `hour`, `team`, `gpu_hours` (allocated that hour), `fairshare` (the algorithm's factor,
0..1, higher = more deserving) and `over_served` (the team used more than its share), plus its own columns.

The state at an hour depends on the usage before it, never on the window a caller views: a history is
computed over the algorithm's whole memory (`lookback_days`) and then cut to the view.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import hourly_capacity, hourly_user_usage

BASE_COLUMNS = ["hour", "team", "gpu_hours", "fairshare", "over_served"]


@dataclass(frozen=True)
class FairshareInputs:
    hours: pd.DatetimeIndex  # every clock hour of the span, gap-free
    usage: pd.DataFrame  # hour, team, user, gpu_hours: allocated GPU-hours of teams with a share
    capacity: pd.Series  # GPU-hours present per hour (indexed by `hours`; 0 where nothing was sampled)
    teams: pd.DataFrame  # team, share, parent: the teams with a share > 0

    def wide(self) -> pd.DataFrame:
        """GPU-hours per hour (rows) and team (columns), zeros where a team used nothing."""
        teams = self.teams["team"].tolist()
        if self.usage.empty:
            return pd.DataFrame(0.0, index=self.hours, columns=teams)
        wide = self.usage.pivot_table(index="hour", columns="team", values="gpu_hours", aggfunc="sum")
        return wide.reindex(index=self.hours, columns=teams).fillna(0.0)


class FairshareAlgorithm(Protocol):
    name: str

    def lookback_days(self, config: Config) -> float:
        """How much history decides the state at an instant."""

    def history(self, inputs: FairshareInputs, config: Config) -> pd.DataFrame:
        """The factor per team and hour of `inputs.hours` (BASE_COLUMNS plus the algorithm's own)."""


def algorithm_for(config: Config) -> FairshareAlgorithm:
    from gpuledger.policies.fairshare.kai_time_based import KaiTimeBased
    from gpuledger.policies.fairshare.slurm_classic import SlurmClassic
    from gpuledger.policies.fairshare.slurm_fair_tree import SlurmFairTree
    algorithms: dict[str, FairshareAlgorithm] = {a.name: a for a in (SlurmClassic(), SlurmFairTree(), KaiTimeBased())}
    return algorithms[config.fairshare.algorithm]


def _hour(ts: datetime) -> pd.Timestamp:
    return pd.Timestamp(ts).floor("h")


def inputs_for(store: Store, start: datetime, end: datetime) -> FairshareInputs:
    """Usage, capacity and the share tree for the hours from `start` up to (not including) `end`."""
    teams = store.team_table()
    teams = teams[teams["share"] > 0][["team", "share", "parent"]].reset_index(drop=True)
    hours = pd.date_range(_hour(start), _hour(end - timedelta(microseconds=1)), freq="h")
    usage = hourly_user_usage(store, start, end)
    usage = usage[usage["team"].isin(teams["team"])]
    capacity = hourly_capacity(store, start, end)
    capacity = (capacity.set_index("hour")["gpu_hours"].reindex(hours).fillna(0.0)
                if not capacity.empty else pd.Series(0.0, index=hours))
    return FairshareInputs(hours, usage, capacity, teams)


def fairshare_history(store: Store, config: Config, start: datetime, end: datetime) -> pd.DataFrame:
    """The factor per team and hour for the hours in [start, end), each computed from its whole lookback."""
    algorithm = algorithm_for(config)
    since = min(start, end - timedelta(days=algorithm.lookback_days(config)))
    inputs = inputs_for(store, since, end)
    if inputs.teams.empty or len(inputs.hours) == 0:
        return pd.DataFrame(columns=BASE_COLUMNS)
    history = algorithm.history(inputs, config)
    return history[history["hour"] >= _hour(start)].reset_index(drop=True)


def fairshare_at(store: Store, config: Config, at: datetime) -> pd.DataFrame:
    """Each team's state in the last hour before `at` (one row per team with a share)."""
    history = fairshare_history(store, config, at - timedelta(hours=1), at)
    return history.sort_values("hour").groupby("team").tail(1).set_index("team")
