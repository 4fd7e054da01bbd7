"""The simulator is deterministic and produces every situation the analytics must catch."""
from __future__ import annotations

from datetime import timedelta

import numpy as np
import pyarrow.compute as pc

from gpuledger.collector.samples import SAMPLE_SCHEMA
from gpuledger.collector.simulator import ClusterSimulator
from tests.conftest import SIM_END


def test_same_seed_same_cluster_and_samples(simulator):
    twin = ClusterSimulator(start=simulator.start, end=simulator.end, seed=11)
    t = [SIM_END.timestamp() - 3600, SIM_END.timestamp()]
    assert simulator.frame(t, 60).equals(twin.frame(t, 60))
    other = ClusterSimulator(start=simulator.start, end=simulator.end, seed=12)
    assert [j.job_id for j in other.jobs] != [j.job_id for j in simulator.jobs] or \
        [j.start for j in other.jobs] != [j.start for j in simulator.jobs]


def test_frame_matches_schema_and_job_placement(simulator):
    now = SIM_END.timestamp() - 7200
    frame = simulator.frame([now], 60)
    assert frame.schema == SAMPLE_SCHEMA and frame.num_rows == simulator.gpu_count == 48
    running = [j for j in simulator.jobs if j.start <= now < j.end]
    held = {(simulator.nodes[j.node].name, g): j.job_id for j in running for g in j.gpu_indices}
    for row in frame.to_pylist():
        assert row["job_id"] == held.get((row["node"], row["gpu_index"]))
        assert row["allocated"] == (row["job_id"] is not None)
    assert len(held) == len(set(held))  # no GPU given to two jobs


def test_workload_has_idle_oversized_nvlink_and_unattributed_jobs(simulator):
    profiles = {j.profile for j in simulator.jobs}
    assert {"busy", "idle", "oversized", "nvlink", "light"} <= profiles
    assert any(j.namespace == "default" for j in simulator.jobs)
    assert all(j.gpus <= 8 for j in simulator.jobs)
    history = list(simulator.history(SIM_END - timedelta(days=1), SIM_END, step_s=600))
    table = history[0]
    nvl = table.filter(pc.greater(table["nvlink_tx_bps"], 1e10))
    assert nvl.num_rows > 0 and set(nvl["gpu_model"].to_pylist()) <= {"H100", "H200", "A100-80GB"}
    assert "unattributed" in table["team"].to_pylist()
    idle = table.filter(pc.and_(table["allocated"], pc.equal(table["util_pct"], 0.0)))
    assert idle.num_rows > 0


def test_history_is_epoch_aligned_and_covers_the_window(simulator):
    tables = list(simulator.history(SIM_END - timedelta(hours=5), SIM_END, step_s=300, chunk_s=3600))
    ts = np.concatenate([t["ts"].to_numpy() for t in tables])
    unique = np.unique(ts)
    assert len(unique) == 60 and all(int(x.astype("int64")) % 300_000_000 == 0 for x in unique.astype("datetime64[us]"))


def test_jobs_frame_knows_only_the_past(simulator):
    jobs = simulator.jobs_frame(SIM_END)
    assert set(jobs["state"]) <= {"running", "pending", "completed", "failed", "timeout", "preempted",
                                  "out_of_memory", "cancelled"}
    ended = jobs[jobs["end_ts"].notna()]
    assert (ended["state"] == "completed").mean() > 0.6 and (ended["state"] != "completed").any()
    assert (jobs["submit_ts"] <= SIM_END).all()
    running = jobs[jobs["state"] == "running"]
    assert running["end_ts"].isna().all() and running["node"].notna().all()
