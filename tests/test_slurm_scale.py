"""Issue 39 item 3, calibrated on a real scheduler at scale: the Slurm-like what-if model's replay of a recorded run
of a multi-team workload standing in for a busy week (time-compressed: seconds for hours) on a real slurmctld gives
each team's mean and p95 wait within the issue's 10% of what sacct measured.

The record (tests/data/slurm_scale_sacct.txt) is `sacct -aP` from Debian's slurmctld 22.05 running the fixed workload
of tests/slurm_workload.py (48 jobs of 6-12 s, four teams of fair shares 40/30/20/10, gangs, two GPU types, GrpTRES
limits from the emitted sacctmgr script that bind), recorded by `python benchmarks/slurm_calibration.py --save` on a
machine with nothing else running. The suite replays the record rather than timing a live scheduler: its waits are
seconds long, and on CI's two loaded cores a slurmctld starved of CPU passed late enough to reorder queues (a live
run in CI once measured 33.6%). A live real Slurm still runs in CI (tests/test_slurm.py); the benchmark re-records.
"""
from __future__ import annotations

from pathlib import Path

from tests.slurm_workload import ISSUE_BAR, calibrate

RECORD = Path(__file__).parent / "data" / "slurm_scale_sacct.txt"


def test_the_slurm_like_replay_of_a_recorded_busy_week_gives_each_teams_waits_measured_in_slurm(tmp_path):
    result = calibrate(RECORD.read_text(), tmp_path)
    print("\n" + result.table())
    for team, _, figures, errors in result.rows:
        for kind in ("mean", "p95"):
            assert errors[kind] <= ISSUE_BAR, (team, kind, figures[kind])
