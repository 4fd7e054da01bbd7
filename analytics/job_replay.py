"""The recorded jobs a what-if replays (policies/whatif): every job that asked for GPUs and was in the system at some
point of a window, with the instants the scheduler reported. Read-only; the replay decides what each row means
(a job running at the window's start continues, one still waiting at its end has no known run time, ...).
"""
from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.collector.jobs.lifecycle import HELD_REASONS
from gpuledger.collector.samples import UNATTRIBUTED

REPLAY_COLUMNS = ("job_id", "team", "gpu_model", "gpus", "submit_ts", "start_ts", "end_ts", "state",
                  "workload_class", "held")


def replay_jobs(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Jobs with GPUs that were submitted before `end` and had not ended by `start` (pending, running or finished
    inside the window), oldest submission first. `held`: the scheduler held the job for something other than GPUs
    (HELD_REASONS), so no quota would have started it sooner."""
    sql = """
        SELECT job_id, owner(team, $unattributed) AS team, gpu_model, gpus, submit_ts, start_ts, end_ts, state,
               coalesce(workload_class, 'unclassified') AS workload_class,
               coalesce(pending_reason IN (SELECT unnest($held)), false) AS held
        FROM jobs
        WHERE coalesce(gpus, 0) > 0
          AND coalesce(submit_ts, start_ts) < $end
          AND (end_ts IS NULL OR end_ts > $start)
        ORDER BY coalesce(submit_ts, start_ts), job_id"""
    frame = store.query(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED, "held": list(HELD_REASONS)})
    return frame[list(REPLAY_COLUMNS)] if len(frame) else pd.DataFrame(columns=list(REPLAY_COLUMNS))


def prior_usage(store: Store, start: datetime, half_life_s: float, lookback: timedelta) -> dict[str, float]:
    """Each team's GPU-seconds run before `start` (within `lookback`), decayed with the fair-share half life to
    `start` as a scheduler's usage is: what orders a replay's first fair-share pass, as the scheduler's history did
    (a team that ran much just before the window is behind at its start)."""
    sql = """
        WITH ran AS (
            SELECT owner(team, $unattributed) AS team, gpus, start_ts,
                   least(coalesce(end_ts, $start), $start) AS stop
            FROM jobs
            WHERE coalesce(gpus, 0) > 0 AND start_ts < $start AND coalesce(end_ts, $start) > $since)
        SELECT team, sum(gpus * date_diff('millisecond', start_ts, stop) / 1000.0
                         * pow(0.5, date_diff('millisecond', stop, $start) / 1000.0 / $half_life)) AS usage
        FROM ran WHERE stop > start_ts GROUP BY team"""
    frame = store.query(sql, {"start": start, "since": start - lookback, "half_life": max(half_life_s, 1.0),
                              "unattributed": UNATTRIBUTED})
    return {str(t): float(u) for t, u in zip(frame["team"], frame["usage"]) if u and u > 0}
