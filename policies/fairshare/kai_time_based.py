"""KAI-Scheduler's time-based fairshare: over-quota weight from usage over a window.

For each queue (team) at each hour: U = its allocated GPU-hours over the last `window_days` (KAI's
windowSize, sliding), optionally decayed with `kai_half_life_days` (halfLifePeriod; 0 = off, KAI's
default), divided by the cluster's GPU-hours present over the same window, decayed the same way. W is its
share over all shares (KAI's overQuotaWeight, normalised). P = max(0, W + k (W - U)) with k = `k_value`.
`fairshare` is P over the sum of P: the part of over-quota GPUs the team would receive now. A team whose
usage is above its weight (U > W) is over-served and its over-quota part shrinks, down to 0.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from gpuledger.analytics.config import Config


def windowed(values: np.ndarray, window_hours: int, half_life_hours: float) -> np.ndarray:
    """For each row (hour), the sum of the last `window_hours` rows, each weighted 0.5^(age / half-life)
    (all 1 without a half-life): a sliding window, kept as a running sum."""
    decay = 0.5 ** (1.0 / half_life_hours) if half_life_hours > 0 else 1.0
    leaving = decay ** window_hours  # the weight a row has when it falls out of the window
    out = np.zeros(values.shape, dtype=float)
    running = np.zeros(values.shape[1:])
    for i, row in enumerate(values):
        running = running * decay + row
        if i >= window_hours:
            running = running - values[i - window_hours] * leaving
        out[i] = running
    return out


class KaiTimeBased:
    name = "kai_time_based"

    def lookback_days(self, config: Config) -> float:
        return config.fairshare.window_days

    def history(self, inputs, config: Config) -> pd.DataFrame:
        teams = inputs.teams["team"].tolist()
        wide = inputs.wide().to_numpy()
        window = max(1, round(config.fairshare.window_days * 24))
        half_life = config.fairshare.kai_half_life_days * 24.0
        used = windowed(wide, window, half_life)
        capacity = windowed(inputs.capacity.to_numpy(), window, half_life)
        usage = np.divide(used, capacity[:, None], out=np.zeros_like(used), where=capacity[:, None] > 0)
        shares = inputs.teams["share"].astype(float).to_numpy()
        weight = shares / shares.sum()
        priority = np.maximum(0.0, weight + config.fairshare.k_value * (weight - usage))
        totals = priority.sum(axis=1, keepdims=True)
        factor = np.divide(priority, totals, out=np.broadcast_to(weight, priority.shape).copy(), where=totals > 0)
        frame = pd.DataFrame({
            "hour": np.repeat(inputs.hours, len(teams)),
            "team": np.tile(teams, len(inputs.hours)),
            "gpu_hours": wide.ravel(),
            "usage": usage.ravel(),
            "weight": np.broadcast_to(weight, usage.shape).ravel(),
            "over_quota_weight": priority.ravel(),
            "fairshare": factor.ravel(),
        })
        frame["over_served"] = frame["usage"] > frame["weight"]
        return frame
