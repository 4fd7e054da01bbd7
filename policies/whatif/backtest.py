"""Backtest: does the replay of the quotas in force reproduce what was measured?

A what-if's effect is the difference between two replays. That difference means something only if the replay of
the configuration in force gives back the window's history: the waits the scheduler's own records show, the jobs
that started, the GPU-hours served. So every what-if first compares that replay with the record, per team and per
(team, GPU model), on the same footing: jobs that arrived in the window, a wait counted from submission to the
first start and cut at the window's end (a job still waiting then counts what it had waited; the record cannot
say more), GPU-hours inside the window.

A team is judged on its p95 wait when it has at least `[whatif] backtest_min_jobs` jobs: the replay is within
tolerance when |replayed - measured| <= max(backtest_minutes, backtest_fraction x measured). The backtest is
`calibrated` when every judged team and all teams together are within it, and at least all teams together have
enough jobs to be judged; an effect of an uncalibrated replay is shown marked so, and no advice rests on it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuledger.analytics.config import WhatIfConfig
from gpuledger.policies.whatif.workload import SimJob

ALL = "all"
SHOWN = ("jobs", "started", "wait_p50_minutes", "wait_p95_minutes", "wait_mean_minutes", "gpu_hours")


def _figures(jobs: list[tuple[SimJob, float | None, float]], length_s: float) -> dict[str, Any]:
    """SHOWN for (job, first start or None, GPU-seconds served in the window) of arrived jobs."""
    arrived = [(j, s, g) for j, s, g in jobs if not j.running_at_start]
    waits = [(min(s if s is not None else length_s, length_s) - j.submit) / 60.0 for j, s, _ in arrived]
    return {"jobs": len(arrived), "started": sum(s is not None and s <= length_s for _, s, _ in arrived),
            "wait_p50_minutes": float(np.quantile(waits, 0.5)) if waits else None,
            "wait_p95_minutes": float(np.quantile(waits, 0.95)) if waits else None,
            "wait_mean_minutes": float(np.mean(waits)) if waits else None,
            "gpu_hours": sum(g for *_, g in jobs) / 3600.0}


def _grouped(rows: list[tuple[SimJob, float | None, float]], length_s: float) -> dict[str, Any]:
    teams: dict[str, list] = {}
    pairs: dict[tuple[str, str], list] = {}
    for row in rows:
        teams.setdefault(row[0].team, []).append(row)
        pairs.setdefault((row[0].team, row[0].model), []).append(row)
    return {"teams": {**{t: _figures(r, length_s) for t, r in sorted(teams.items())}, ALL: _figures(rows, length_s)},
            "pairs": {k: _figures(r, length_s) for k, r in sorted(pairs.items())}}


def measured(jobs: list[SimJob], length_s: float) -> dict[str, Any]:
    """The record's figures: each job's recorded first start and the GPU-seconds it ran inside the window."""
    rows = []
    for job in jobs:
        began = 0.0 if job.running_at_start else job.recorded_start
        served = (job.gpus * max(0.0, min(began + job.run, length_s) - max(began, 0.0))
                  if began is not None else 0.0)
        rows.append((job, began, served))
    return _grouped(rows, length_s)


def replayed(jobs: list[SimJob], length_s: float) -> dict[str, Any]:
    """The replay's figures on the record's footing (waits cut at the window's end)."""
    return _grouped([(j, j.first_start, j.served_gpu_s) for j in jobs], length_s)


@dataclass
class Backtest:
    """The replay of the quotas in force against the record, per team and per (team, GPU model)."""
    teams: list[dict[str, Any]]
    pairs: list[dict[str, Any]]
    calibrated: bool
    judged: int
    worst: dict[str, Any] | None
    tolerance: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"calibrated": self.calibrated, "teams_judged": self.judged, "tolerance": self.tolerance,
                "worst": self.worst, "teams": self.teams, "pairs": self.pairs}

    def why_not(self) -> str:
        """Why the replay is not calibrated, in one sentence (empty when it is)."""
        if self.calibrated:
            return ""
        if self.worst is None or self.worst["excess_minutes"] <= 1e-9:
            return (f"too few jobs in the window to check the replay against the record (fewer than "
                    f"{self.tolerance['min_jobs']:g} arrived)")
        w = self.worst
        return (f"the replay of the quotas in force does not reproduce the window: {w['team']}'s p95 wait "
                f"{w['replayed']:.0f} min replayed against {w['measured']:.0f} min measured (error "
                f"{w['error_minutes']:+.0f} min, tolerance {w['tolerance_minutes']:.0f} min)")


def _row(key: dict[str, Any], was: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    row = dict(key)
    for name in SHOWN:
        row[name] = {"measured": was.get(name), "replayed": now.get(name)}
    m, r = was.get("wait_p95_minutes"), now.get("wait_p95_minutes")
    row["p95_error_minutes"] = r - m if m is not None and r is not None else None
    row["p95_error_fraction"] = (r - m) / m if m and r is not None else None
    return row


def backtest(jobs: list[SimJob], replay: list[SimJob], length_s: float, settings: WhatIfConfig) -> Backtest:
    """Compare `replay` (the workload `jobs` replayed under the quotas in force) with the record."""
    was, now = measured(jobs, length_s), replayed(replay, length_s)
    tolerance = {"minutes": settings.backtest_minutes, "fraction": settings.backtest_fraction,
                 "min_jobs": float(settings.backtest_min_jobs)}
    teams, judged, worst, calibrated, whole = [], 0, None, True, False
    for team, figures in was["teams"].items():
        row = _row({"team": team}, figures, now["teams"].get(team, {}))
        m, err = figures.get("wait_p95_minutes"), row["p95_error_minutes"]
        row["judged"] = figures["jobs"] >= settings.backtest_min_jobs and m is not None and err is not None
        if row["judged"]:
            judged += team != ALL
            whole |= team == ALL
            bound = max(settings.backtest_minutes, settings.backtest_fraction * m)
            row["within_tolerance"] = abs(err) <= bound + 1e-9
            calibrated &= row["within_tolerance"]
            excess = abs(err) - bound
            if worst is None or excess > worst["excess_minutes"]:
                worst = {"team": team, "measured": m, "replayed": m + err, "error_minutes": err,
                         "tolerance_minutes": bound, "excess_minutes": excess}
        teams.append(row)
    pairs = [_row({"team": t, "gpu_model": m}, f, now["pairs"].get((t, m), {})) for (t, m), f in was["pairs"].items()]
    return Backtest(teams, pairs, calibrated and whole, judged, worst, tolerance)
