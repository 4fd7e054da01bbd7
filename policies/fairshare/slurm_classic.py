"""Slurm's classic fairshare (PriorityFlags=NO_FAIR_TREE): F = 2^(-UE/S).

U is a team's GPU-hours decayed with the half-life (Slurm's PriorityDecayHalfLife) over all
teams' decayed GPU-hours; S its share over all shares. With departments (`[teams.X] parent`),
S is the product of the normalised shares along the path and the effective usage is
UE = UA + (UE_parent - UA) * S_team / S_siblings, as slurm's classic_fair_share describes.
F = 1 means no recent usage, 0.5 usage exactly at its share, lower means over-served. Teams
without a share (the unattributed bucket) are left out: nothing can be owed to them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from gpuledger.analytics.config import Config

DECAY_MEMORY_HALF_LIVES = 5  # usage older than this many half-lives weighs under 3%: not worth reading


def decayed_lookback_days(config: Config) -> float:
    """How much history Slurm's decayed usage needs: the policy window, or five half-lives if longer."""
    return max(config.quota.window_days, DECAY_MEMORY_HALF_LIVES * config.fairshare.half_life_days)


def decayed(values: np.ndarray, half_life_hours: float) -> np.ndarray:
    """Running sums of `values` (rows: hours) where each older hour weighs 2^(-age / half-life)."""
    decay = 2.0 ** (-1.0 / half_life_hours)
    out = np.zeros_like(values)
    running = np.zeros(values.shape[1:])
    for i, row in enumerate(values):
        running = running * decay + row
        out[i] = running
    return out


def normalised(values: np.ndarray) -> np.ndarray:
    """Each row divided by its sum (0 where the sum is 0)."""
    totals = values.sum(axis=1, keepdims=True)
    return np.divide(values, totals, out=np.zeros_like(values), where=totals > 0)


class SlurmClassic:
    name = "slurm_classic"

    def lookback_days(self, config: Config) -> float:
        return decayed_lookback_days(config)

    def history(self, inputs, config: Config) -> pd.DataFrame:
        teams = inputs.teams["team"].tolist()
        wide = inputs.wide()
        used = decayed(wide.to_numpy(), config.fairshare.half_life_days * 24.0)
        norm_usage = normalised(used)
        parents = inputs.teams["parent"].where(inputs.teams["parent"].notna(), None).tolist()
        shares = inputs.teams["share"].astype(float).to_numpy()
        norm_share, effective = self._tree(parents, shares, norm_usage)
        factor = np.power(2.0, -np.divide(effective, norm_share, out=np.full_like(effective, np.inf),
                                          where=norm_share > 0))
        frame = pd.DataFrame({
            "hour": np.repeat(inputs.hours, len(teams)),
            "team": np.tile(teams, len(inputs.hours)),
            "gpu_hours": wide.to_numpy().ravel(),
            "decayed_usage": used.ravel(),
            "norm_usage": norm_usage.ravel(),
            "effective_usage": effective.ravel(),
            "norm_share": np.broadcast_to(norm_share, effective.shape).ravel(),
            "fairshare": factor.ravel(),
        })
        frame["over_served"] = frame["fairshare"] < 0.5
        return frame

    @staticmethod
    def _tree(parents: list[str | None], shares: np.ndarray, norm_usage: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Machine-normalised shares and effective usage for teams under root or under one department level.

        A department's share is the sum of its teams' shares and its usage their sum."""
        n = len(shares)
        groups: dict[str | None, list[int]] = {}
        for i, parent in enumerate(parents):
            groups.setdefault(parent, []).append(i)
        # tier 1: teams without a department and departments, side by side under root
        tier1 = [(None, [i]) for i in groups.get(None, [])] + [(p, idx) for p, idx in groups.items() if p is not None]
        tier1_shares = np.array([shares[idx].sum() for _, idx in tier1])
        tier1_norm = tier1_shares / tier1_shares.sum()
        norm_share = np.zeros(n)
        effective = np.zeros_like(norm_usage)
        for (parent, idx), top_norm in zip(tier1, tier1_norm):
            dept_usage = norm_usage[:, idx].sum(axis=1)
            if parent is None:  # a team directly under root: UE = UA
                norm_share[idx[0]] = top_norm
                effective[:, idx[0]] = dept_usage
                continue
            within = shares[idx] / shares[idx].sum()
            for j, w in zip(idx, within):
                norm_share[j] = top_norm * w
                effective[:, j] = norm_usage[:, j] + (dept_usage - norm_usage[:, j]) * w
        return norm_share, effective
