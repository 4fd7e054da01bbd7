"""Unknown is never zero (issue 20, defect 5): a sample without a utilisation reading (the Philly and Helios traces)
counts for allocation and cost, which need no reading, but is neither idle, busy nor used. Every figure that rests on
utilisation comes with the share of GPU-hours it covers and is null where nothing was measured, and no advice is
drawn from missing readings."""
from __future__ import annotations

import math
from datetime import timedelta

import duckdb
import pandas as pd
import pytest

from gpuledger.analytics.config import Config, QuotaConfig
from gpuledger.analytics.cost import cost_by_team
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import NO_UTILISATION, cluster_utilization, team_gauges, team_usage
from gpuledger.analytics.waste import idle_runs, job_table
from gpuledger.policies.placement import placement_advice
from gpuledger.policies.quota import evaluate_quotas
from tests.helpers import T0, gpu_rows, table

HOURS = 3
END = T0 + timedelta(hours=HOURS)
MODEL = "NVIDIA H100 80GB HBM3"
CONFIG = Config(quota=QuotaConfig(min_coverage=0.0))


def _rows(util_blind: bool) -> list[dict]:
    """Team `blind` holds two idle-looking GPUs with no readings (or, as the oracle, readings of 0); team `seen` one
    GPU at 50%; job `mixed` (team `seen`) one GPU whose first half has readings of 40% and second half none (or 0).
    Memory is well used, so no job is flagged for memory."""
    n, mem = HOURS * 60, {"mem_used": 60000.0}
    blind = [*gpu_rows("n1", 0, MODEL, HOURS * 60, util=0.0, job="blind-1", team="blind", **mem),
             *gpu_rows("n1", 1, MODEL, HOURS * 60, util=0.0, job="blind-1", team="blind", **mem)]
    seen = gpu_rows("n2", 0, MODEL, HOURS * 60, util=50.0, job="seen-1", team="seen", **mem)
    mixed = gpu_rows("n2", 1, MODEL, HOURS * 60, util=[40.0] * (n // 2) + [0.0] * (n - n // 2), job="mixed",
                     team="seen", **mem)
    if util_blind:
        for row in blind:
            row["util_pct"] = None
        for row in mixed[n // 2:]:
            row["util_pct"] = None
    return blind + seen + mixed


def _store(path, util_blind: bool) -> Store:
    store = Store(path)
    store.set_rates(Config().rates)
    store._folded_at = float("inf")
    store.append_samples(table(_rows(util_blind)))
    store.fold(until=END)
    return store


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("unknown")
    blind, measured = _store(root / "blind.duckdb", True), _store(root / "measured.duckdb", False)
    yield blind, measured
    blind.close()
    measured.close()


def test_allocation_and_cost_do_not_need_utilisation(stores):
    blind, measured = stores
    got = cost_by_team(blind, T0, END).set_index("team")
    want = cost_by_team(measured, T0, END).set_index("team")
    assert sorted(got.index) == sorted(want.index)
    for column in ("gpu_hours", "cost_usd"):
        assert got[column].round(6).to_dict() == want[column].round(6).to_dict(), column
    assert got.loc["blind", "gpu_hours"] == pytest.approx(2 * HOURS)
    # the same bill, and the bill says which of its GPU-hours had a utilisation reading
    assert got.loc["blind", "util_coverage"] == 0.0 and want.loc["blind", "util_coverage"] == 1.0
    assert got.loc["seen", "util_coverage"] == pytest.approx(0.75)


def test_unmeasured_team_has_no_used_idle_or_busy_figures(stores):
    blind, _ = stores
    usage = team_usage(blind, T0, END).set_index("team")
    assert math.isnan(usage.loc["blind", "used_gpu_hours"]) and math.isnan(usage.loc["blind", "efficiency"])
    assert usage.loc["blind", "util_coverage"] == 0.0
    assert usage.loc["blind", "allocated_gpu_hours"] == pytest.approx(2 * HOURS)
    # team seen: one GPU measured throughout at 50%, one half measured at 40%
    assert usage.loc["seen", "util_coverage"] == pytest.approx(0.75)
    assert usage.loc["seen", "used_gpu_hours"] == pytest.approx(HOURS * 0.5 + HOURS / 2 * 0.4)
    assert usage.loc["seen", "efficiency"] == pytest.approx((HOURS * 0.5 + HOURS / 2 * 0.4) / (HOURS * 1.5))

    costs = cost_by_team(blind, T0, END).set_index("team")
    assert math.isnan(costs.loc["blind", "used_gpu_hours"]) and costs.loc["blind", "util_coverage"] == 0.0

    gauges = team_gauges(blind, T0, END, CONFIG.waste.idle_util_pct).set_index("team")
    assert math.isnan(gauges.loc["blind", "busy_gpus"]) and math.isnan(gauges.loc["blind", "idle_gpus"])
    assert gauges.loc["blind", "allocated_gpus"] == pytest.approx(2.0)
    assert gauges.loc["seen", "idle_gpus"] == pytest.approx(0.0)  # the mixed job's blind half is not idle

    series = cluster_utilization(blind, T0, END, 60)
    # of the four GPUs held each hour: team seen's measured one, the mixed job's until half-way through hour 2
    assert series["util_coverage"].round(6).tolist() == [0.5, 0.375, 0.25]


def test_no_idle_stretch_and_no_reclaim_from_missing_readings(stores):
    blind, measured = stores
    runs = idle_runs(blind, T0, END, CONFIG.waste)
    assert runs.empty, runs  # no reading is no idleness: neither the blind team nor the mixed job's blind half
    assert set(idle_runs(measured, T0, END, CONFIG.waste)["team"]) == {"blind", "seen"}  # the oracle: readings of 0

    at = END - timedelta(minutes=1)
    advice = placement_advice(blind, CONFIG, at)
    assert not [a for a in advice if a.kind == "reclaim"], [a.reason for a in advice]
    assert {a.team for a in placement_advice(measured, CONFIG, at) if a.kind == "reclaim"} == {"blind", "seen"}


def test_jobs_table_says_no_utilisation_data(stores):
    blind, _ = stores
    jobs = job_table(blind, T0, END).set_index("job_id")
    row = jobs.loc["blind-1"]
    assert pd.isna(row["mean_util_pct"]) and pd.isna(row["p95_util_pct"]) and pd.isna(row["idle_share"])
    assert row["util_coverage"] == 0.0 and row["util_note"] == NO_UTILISATION
    assert not row["waste"]
    assert jobs.loc["blind-1", "gpu_hours"] == pytest.approx(2 * HOURS)
    # the mixed job: half its samples measured at 40%, its mean from that half only
    mixed = jobs.loc["mixed"]
    assert mixed["util_coverage"] == pytest.approx(0.5)
    assert mixed["mean_util_pct"] == pytest.approx(40.0)
    assert mixed["p95_util_pct"] == pytest.approx(40.0)
    assert mixed["idle_share"] == pytest.approx(0.0)
    assert "50%" in mixed["util_note"]
    assert jobs.loc["seen-1", "util_coverage"] == 1.0 and pd.isna(jobs.loc["seen-1", "util_note"])


def test_quota_advice_for_an_unmeasured_team_is_insufficient_data(stores):
    blind, _ = stores
    blind.upsert_teams(pd.DataFrame({"team": ["blind", "seen"], "share": [1.0, 1.0], "quota_gpus": [None, None]}))
    advice = {(a.team, a.gpu_model): a for a in evaluate_quotas(blind, CONFIG, END)}
    mine = advice[("blind", MODEL)]
    assert mine.status == "insufficient_data" and NO_UTILISATION in mine.reason and mine.guarantee is None
    theirs = advice[("seen", MODEL)]
    assert theirs.status != "insufficient_data"
    assert theirs.evidence["util_coverage"] == pytest.approx(0.75)
    # busy demand from the measured GPUs only: the mixed job's blind half is not counted as busy (nor as idle):
    # 2, 1.5 and 1 busy GPUs in the three hours
    assert theirs.evidence["p95_busy_gpus"] == pytest.approx(2.0)
    assert theirs.evidence["always_busy_gpus"] == pytest.approx(1.0)
    assert theirs.evidence["mean_busy_gpus"] == pytest.approx(1.5)


def test_old_rollups_are_carried_over(tmp_path):
    """A store folded before schema 9 (no util_gpu_s; samples without a reading folded as idle) is carried over on
    open: its rows without any reading no longer count as idle nor make idle stretches."""
    path = tmp_path / "old.duckdb"
    _store(path, True).close()
    con = duckdb.connect(str(path))
    for t in ("usage_minute", "usage_hour"):  # what the old fold wrote for a row without readings
        con.execute(f"UPDATE {t} SET idle_gpu_s = gpu_s, idle_s = samples * interval_s, busy_n = 0, lead_s = "
                    "samples * interval_s, lead_gpu_s = gpu_s, lead_end_ts = end_ts WHERE allocated AND util_n = 0")
        con.execute(f"ALTER TABLE {t} DROP COLUMN util_gpu_s")
    con.close()
    store = Store(path)
    try:
        assert store.scalar("SELECT count(*) FROM usage_minute WHERE util_gpu_s IS NULL") == 0
        assert store.scalar("SELECT sum(idle_gpu_s) FROM usage_minute WHERE team = 'blind'") == 0
        assert idle_runs(store, T0, END, CONFIG.waste).empty
        assert team_usage(store, T0, END).set_index("team").loc["blind", "util_coverage"] == 0.0
    finally:
        store.close()
