"""Efficiency beyond GPU_UTIL (issue 23): profiling readings rolled up, per job and team, used by the advice.

A job at 100% GPU_UTIL with its SMs 5% active looked perfectly efficient before: the profiling fields were stored
raw and dropped after 30 days, never read. These tests hold the rollups to the raw readings, the flags to their
thresholds, and "not reported" to null (never 0).
"""
from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from gpuledger.analytics.config import Config, EfficiencyConfig, WasteConfig
from gpuledger.analytics.efficiency import EFFICIENCY_FLAGS, job_efficiency, team_efficiency
from gpuledger.analytics.waste import oversized_jobs
from gpuledger.deploy.api import create_app
from gpuledger.policies.recommender import evaluate
from tests.helpers import T0, gpu_rows, table

HOURS = 3
END = T0 + timedelta(hours=HOURS)


def _jobs(store) -> None:
    """starved: GPU_UTIL 98%, SM active 5% (input pipeline); comm: the same with NVLink traffic of 100 GB/s;
    fine: 95% and 80%; fp32: a training job busy on its SMs with idle tensor pipes; blind: no profiling field."""
    store.append_samples(table(
        *[gpu_rows("n1", g, "H100", HOURS * 60, util=98.0, job="ml/starved", team="ml", mem_used=60000,
                   sm_active=0.05, sm_occupancy=0.03, tensor_active=0.02, dram_active=0.04, pcie_tx_bps=1e9,
                   pcie_rx_bps=2e9) for g in range(2)],
        gpu_rows("n1", 2, "H100", HOURS * 60, util=97.0, job="ml/comm", team="ml", mem_used=60000, sm_active=0.1,
                 dram_active=0.05, tensor_active=0.05, nvlink_tx_bps=5e10, nvlink_rx_bps=5e10),
        gpu_rows("n1", 3, "H100", HOURS * 60, util=95.0, job="ml/fine", team="ml", mem_used=60000, sm_active=0.8,
                 tensor_active=0.5, dram_active=0.3),
        gpu_rows("n1", 4, "H100", HOURS * 60, util=90.0, job="cv/fp32", team="cv", mem_used=60000, sm_active=0.7,
                 tensor_active=0.0, dram_active=0.3),
        gpu_rows("n2", 0, "H100", HOURS * 60, util=99.0, job="cv/blind", team="cv", mem_used=60000),
        # SMs starved while DRAM is busy: memory-bandwidth bound
        gpu_rows("n2", 2, "H100", HOURS * 60, util=90.0, job="ml/membound", team="ml", mem_used=60000,
                 sm_active=0.15, tensor_active=0.05, dram_active=0.85),
        # memory-light and busy by GPU_UTIL, but a tenth of its SMs work: by SM activity it fits a small slice
        gpu_rows("n2", 1, "H100", HOURS * 60, util=100.0, job="cv/small", team="cv", mem_used=3000, sm_active=0.1,
                 tensor_active=0.05, dram_active=0.05),
    ))
    store.upsert_jobs(__import__("pandas").DataFrame([
        {"job_id": "cv/fp32", "team": "cv", "name": "pretrain-llm", "gpus": 1, "state": "running"}]))


def test_a_busy_but_starved_job_is_flagged_and_unreported_fields_stay_unknown(store):
    _jobs(store)
    jobs = job_efficiency(store, T0, END, EfficiencyConfig()).set_index("job_id")
    assert jobs.loc["ml/starved", "flags"] == ["input_pipeline_bound"]
    assert jobs.loc["ml/starved", "sm_active"] == pytest.approx(0.05)
    assert jobs.loc["ml/starved", "util_on_profiled_pct"] == pytest.approx(98.0)
    assert jobs.loc["ml/starved", "pcie_gb"] == pytest.approx(2 * 3e9 * HOURS * 3600 / 1e9)
    assert jobs.loc["ml/comm", "flags"] == ["communication_bound"]
    assert jobs.loc["ml/membound", "flags"] == ["memory_bandwidth_bound"]
    assert jobs.loc["ml/fine", "flags"] == []
    assert jobs.loc["cv/fp32", "flags"] == ["tensor_cores_idle"]
    blind = jobs.loc["cv/blind"]
    assert blind["flags"] == [] and "no profiling readings" in blind["note"]
    for field in ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "profiling_coverage", "pcie_gb"):
        assert blind[field] is None or blind[field] != blind[field], field  # null, never 0
    teams = team_efficiency(store, T0, END).set_index("team")
    # ml: 2 starved GPUs at 0.05, comm at 0.1, fine at 0.8, membound at 0.15, over equal time
    assert teams.loc["ml", "sm_active"] == pytest.approx((0.05 * 2 + 0.1 + 0.8 + 0.15) / 5)
    # cv: the blind GPU has no reading, so the mean is over the two that read it, and the coverage says so
    assert teams.loc["cv", "sm_active"] == pytest.approx((0.7 + 0.1) / 2)
    assert teams.loc["cv", "profiling_coverage"] == pytest.approx(2 / 3)


def test_the_flags_need_enough_readings(store):
    rows = gpu_rows("n1", 0, "H100", 60, util=98.0, job="ml/part", team="ml", sm_active=0.05)
    for row in rows[20:]:
        row["sm_active"] = None  # read on a third of its time
    store.append_samples(table(rows))
    job = job_efficiency(store, T0, T0 + timedelta(hours=1), EfficiencyConfig()).iloc[0]
    assert job["flags"] == [] and "33%" in job["note"]
    job = job_efficiency(store, T0, T0 + timedelta(hours=1), EfficiencyConfig(min_coverage=0.3)).iloc[0]
    assert job["flags"] == ["input_pipeline_bound"]


def test_profiling_rollups_survive_compaction_and_match_the_raw_readings(store):
    _jobs(store)
    before = job_efficiency(store, T0, END, EfficiencyConfig()).set_index("job_id")
    raw = store.query("SELECT avg(sm_active) FROM samples WHERE job_id = 'ml/starved'").iloc[0, 0]
    assert before.loc["ml/starved", "sm_active"] == pytest.approx(raw)
    store.fold(until=END + timedelta(hours=2))
    hours = store.scalar("SELECT count(*) FROM usage_hour WHERE sm_active_cov_s > 0")
    assert hours > 0  # whole hours answer from the hour rollups, which keep the profiling sums
    after = job_efficiency(store, T0, END, EfficiencyConfig()).set_index("job_id")
    assert after.loc["ml/starved", "sm_active"] == pytest.approx(before.loc["ml/starved", "sm_active"])


def test_advice_names_the_bottleneck_and_resize_reads_sm_activity(store):
    _jobs(store)
    config = Config()
    at = END - timedelta(seconds=30)
    kinds = {(r.kind, r.job_id): r for r in evaluate(store, config, at).proposals()}
    starved = kinds[("efficiency", "ml/starved")]
    assert starved.action["bottleneck"] == "input_pipeline_bound"
    assert starved.evidence["sm_active"] == pytest.approx(0.05) and starved.evidence["effect_usd_per_week"] > 0
    assert kinds[("efficiency", "cv/fp32")].action["bottleneck"] == "tensor_cores_idle"
    assert ("efficiency", "ml/fine") not in kinds and ("efficiency", "cv/blind") not in kinds
    # 100% GPU_UTIL p95 fits no slice; 10% of its SMs active does
    over = oversized_jobs(store, T0, END, WasteConfig()).set_index("job_id")
    assert over.loc["cv/small", "compute_signal"] == "sm_active"
    assert over.loc["cv/small", "compute_pct"] == pytest.approx(10.0)
    assert over.loc["cv/small", "fits"]["kind"] == "mig"
    resize = kinds[("resize", "cv/small")]
    assert resize.evidence["compute_signal"] == "sm_active" and "by SM activity" in resize.reason


def test_the_api_and_metrics_show_profiling_and_leave_unreported_fields_out(store):
    _jobs(store)
    client = TestClient(create_app(store, Config(), open_reads=True))
    body = client.get("/v1/efficiency", params={"days": 1, "end": END.isoformat()}).json()
    flagged = {(r["team"], r["flag"]) for r in body["flagged"]}
    # cv/small is starved too: 100% GPU_UTIL, 10% SM active; every flag is served
    assert flagged == {("ml", "input_pipeline_bound"), ("ml", "communication_bound"), ("cv", "tensor_cores_idle"),
                       ("cv", "input_pipeline_bound"), ("ml", "memory_bandwidth_bound")}
    assert {flag for _, flag in flagged} == set(body["flags"]) == set(EFFICIENCY_FLAGS)
    jobs = {r["job_id"]: r for r in client.get("/v1/jobs", params={"days": 1, "end": END.isoformat()}).json()}
    assert jobs["ml/starved"]["sm_active"] == pytest.approx(0.05) and jobs["cv/blind"]["sm_active"] is None
    gpus = client.get("/v1/gpus", params={"days": 1, "end": END.isoformat(), "bucket_minutes": 60}).json()
    blind = [p for p in gpus["series"] if p["gpu_uuid"] == "GPU-n2-0"]
    assert blind and all(p["sm_active"] is None for p in blind)
