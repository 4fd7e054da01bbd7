"""The recorded jobs a what-if replays (policies/whatif): every job that asked for GPUs and was in the system at some
point of a window, with the instants the scheduler reported. Read-only; the replay decides what each row means
(a job running at the window's start continues, one still waiting at its end has no known run time, ...).
"""
from __future__ import annotations

from datetime import datetime

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
