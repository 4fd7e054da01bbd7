"""The recorded jobs of a window as a replay's arrivals: what each asked for and how long it ran, and what had to
be assumed or left out to replay it (counted and named, never silent).

Times are seconds from the window's start. Rules, applied per job record (analytics/job_replay.py):
- a job running when the window starts keeps its GPUs from the start for what is left of its run (its wait lies
  before the window: no wait is counted for it);
- a job submitted before the window and still waiting at its start arrives at the start, its wait counted from its
  real submission;
- run time is end - start as the scheduler reported it; a job still running at the window's end runs to the end
  (`run_censored`: its real run is longer); a job that never started has no run time of its own, so it runs the
  median of its team's runs in the window (`run_assumed`, else the median of all runs);
- a job that left the queue without starting (cancelled while it waited) or that the scheduler held for something
  other than GPUs (a begin time, a dependency) is not replayed: no quota changes when it would start;
- a job that named no GPU model runs on its team's most asked model, else the model with the most GPUs
  (`model_assumed`); a job for a model with no GPU present, or asking more GPUs than its model has, cannot run in
  any configuration and is left out (`no_capacity`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pandas as pd


@dataclass(slots=True)
class SimJob:
    idx: int
    job_id: str
    team: str
    model: str
    gpus: int
    submit: float  # seconds from the window's start (negative: submitted before it)
    run: float  # seconds of running it needs
    workload_class: str
    running_at_start: bool = False
    start: float | None = None  # when it (last) started in the replay
    first_start: float | None = None
    end: float | None = None
    preemptions: int = 0
    lost_gpu_s: float = 0.0  # GPU-seconds of work thrown away by preemptions
    served_gpu_s: float = 0.0  # GPU-seconds it ran inside the window, kept or lost
    recorded_start: float | None = None  # when the record says it started (None: it had not): the backtest's truth


# what the replay assumed or left out, by name; shown with every answer
ASSUMPTIONS = {
    "running_at_start": "running when the window starts: keeps its GPUs for the rest of its run",
    "waiting_at_start": "submitted before the window and waiting at its start: arrives at the start",
    "run_censored": "still running at the window's end: replayed as running until the end only",
    "run_assumed": "never started: runs its team's median run time",
    "model_assumed": "named no GPU model: replayed on its team's most asked model",
    "left_queue": "left the queue without starting: not replayed",
    "held": "held by the scheduler for something other than GPUs: not replayed",
    "no_capacity": "asks for a model with no GPU present, or more GPUs than the model has: not replayed",
}


@dataclass
class Workload:
    jobs: list[SimJob]
    assumed: Counter = field(default_factory=Counter)

    def notes(self) -> list[dict[str, object]]:
        return [{"assumption": name, "jobs": self.assumed[name], "meaning": ASSUMPTIONS[name]}
                for name in ASSUMPTIONS if self.assumed[name]]


def _seconds(value, origin: pd.Timestamp) -> float | None:
    return None if value is None or pd.isna(value) else (pd.Timestamp(value) - origin).total_seconds()


def workload_of(records: pd.DataFrame, start: datetime, end: datetime, capacity: dict[str, int]) -> Workload:
    """The replay's jobs from the window's job records (REPLAY_COLUMNS), under the rules above."""
    origin, length = pd.Timestamp(start), (pd.Timestamp(end) - pd.Timestamp(start)).total_seconds()
    assumed: Counter = Counter()
    rows = []
    for row in records.itertuples(index=False):
        submit, began, ended = (_seconds(v, origin) for v in (row.submit_ts, row.start_ts, row.end_ts))
        if bool(row.held):
            assumed["held"] += 1
            continue
        if began is None and (ended is not None or row.state not in ("pending", None)):
            assumed["left_queue"] += 1
            continue
        if began is not None and began < 0:  # running as the window opens
            finish = ended if ended is not None and ended <= length else length
            rows.append((row, 0.0, max(finish, 0.0), True, 0.0))
            assumed["running_at_start"] += 1
            assumed["run_censored"] += ended is None or ended > length
            continue
        if submit is None:
            submit = began
        if submit < 0:
            assumed["waiting_at_start"] += 1
        if began is None:
            rows.append((row, submit, None, False, None))
        else:
            censored = ended is None or ended > length
            assumed["run_censored"] += censored
            rows.append((row, submit, (length if censored else ended) - began, False, began))
    teams_models = Counter((row.team, row.gpu_model) for row, *_ in rows if isinstance(row.gpu_model, str))
    runs = [(row.team, run) for row, _, run, at_start, _ in rows if run is not None and not at_start]
    every = float(np.median([r for _, r in runs])) if runs else 3600.0
    by_team = {team: float(np.median([r for t, r in runs if t == team])) for team in {t for t, _ in runs}}
    widest = max(capacity, key=lambda m: (capacity[m], m)) if capacity else None
    jobs = []
    for row, submit, run, at_start, began in rows:
        model = row.gpu_model if isinstance(row.gpu_model, str) else None
        if model is None:
            asked = [(n, m) for (t, m), n in teams_models.items() if t == row.team and m in capacity]
            model = max(asked)[1] if asked else widest
            assumed["model_assumed"] += 1
        gpus = int(row.gpus)
        if model is None or gpus > capacity.get(model, 0):
            assumed["no_capacity"] += 1
            continue
        if run is None:
            run = by_team.get(row.team, every)
            assumed["run_assumed"] += 1
        jobs.append(SimJob(len(jobs), str(row.job_id), str(row.team), model, gpus, float(submit), float(run),
                           str(row.workload_class), running_at_start=at_start, recorded_start=began))
    return Workload(jobs, assumed)
