"""Usage, cost, waste and fairshare on small hand-built data whose answers can be worked out by hand."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpuledger.analytics.config import DEFAULT_RATES, WasteConfig
from gpuledger.analytics.cost import cost_by_team, cost_by_team_and_model
from gpuledger.analytics.usage import cluster_utilization, team_usage, team_usage_series
from gpuledger.analytics.waste import idle_runs, oversized_jobs, smallest_fit, waste, waste_by_team
from gpuledger.analytics.windows import iso_week
from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED
from tests.helpers import T0, gpu_rows, table

END = T0 + timedelta(days=1)


@pytest.fixture
def mixed(store):
    store.append_samples(table(
        gpu_rows("n1", 0, "H100", 120, util=50.0, job="a/1", team="a"),
        gpu_rows("n1", 1, "L4", 60, util=100.0, job="b/1", team="b", mem_total=23034),
        gpu_rows("n1", 2, "H100", 120),  # free GPU: idle capacity
        gpu_rows("n2", 0, "Z9000", 60, util=10.0, job="c/1", team="c"),  # no rate for this model
        gpu_rows("n3", 0, "A100-80GB", 70, util=100.0, job="a/2", team="a", gpu_fraction=3 / 7,
                 mig_profile="3g.40gb", mig_instance=1),
    ))
    return store


def test_team_usage_allocated_vs_used(mixed):
    got = team_usage(mixed, T0, END).set_index("team")
    assert got.loc["a", "allocated_gpu_hours"] == pytest.approx(2.0 + 70 / 60 * 3 / 7)
    assert got.loc["a", "used_gpu_hours"] == pytest.approx(1.0 + 70 / 60 * 3 / 7)
    assert got.loc["b", "efficiency"] == pytest.approx(1.0)
    assert got.loc["a", "jobs"] == 2
    assert IDLE_CAPACITY not in got.index and len(got) == 3


def test_cost_uses_rate_card_and_reports_idle_capacity_and_unpriced(mixed):
    got = cost_by_team(mixed, T0, END).set_index("team")
    assert got.loc["a", "cost_usd"] == pytest.approx(2.0 * DEFAULT_RATES["H100"] + 0.5 * DEFAULT_RATES["A100-80GB"])
    assert got.loc["b", "cost_usd"] == pytest.approx(DEFAULT_RATES["L4"])
    assert got.loc[IDLE_CAPACITY, "gpu_hours"] == pytest.approx(2.0)
    assert got.loc[IDLE_CAPACITY, "cost_usd"] == pytest.approx(2.0 * DEFAULT_RATES["H100"])
    assert got.loc["c", "cost_usd"] == 0 and got.loc["c", "unpriced_gpu_hours"] == pytest.approx(1.0)
    assert got.index[-1] == IDLE_CAPACITY  # idle capacity is its own last line
    models = cost_by_team_and_model(mixed, T0, END, team="a").set_index("gpu_model")
    assert set(models.index) == {"H100", "A100-80GB"}


def test_rate_card_override_changes_cost(mixed):
    mixed.set_rates({"H100": 1.0})
    got = cost_by_team(mixed, T0, END).set_index("team")
    assert got.loc[IDLE_CAPACITY, "cost_usd"] == pytest.approx(2.0)


def test_utilization_series_averages_concurrent_gpus(mixed):
    series = cluster_utilization(mixed, T0, T0 + timedelta(hours=1), bucket_minutes=60)
    assert len(series) == 1
    row = series.iloc[0]
    assert row["total_gpus"] == pytest.approx(4 + 3 / 7)
    assert row["allocated_gpus"] == pytest.approx(3 + 3 / 7)
    assert row["used_gpus"] == pytest.approx(0.5 + 1.0 + 0.1 + 3 / 7)
    assert row["busy_gpus"] == pytest.approx(3 + 3 / 7)  # every allocated GPU is at or over the 5% threshold
    team = team_usage_series(mixed, T0, T0 + timedelta(hours=2), "b", bucket_minutes=60)
    assert team["allocated_gpus"].tolist() == pytest.approx([1.0, 0.0])


def test_idle_runs_need_the_threshold_and_split_on_activity(store):
    pattern = [0.0] * 40 + [80.0] * 10 + [0.0] * 20 + [80.0] * 5 + [1.0] * 35
    store.append_samples(table(
        gpu_rows("n", 0, "H100", 110, util=pattern, job="a/nb", team="a"),
        gpu_rows("n", 1, "H100", 45, util=0.0, job=None, allocated=True),  # allocated, owner unknown
    ))
    runs = idle_runs(store, T0, END, WasteConfig(idle_minutes=30, idle_util_pct=5))
    mine = runs[runs["job_id"] == "a/nb"].sort_values("start_ts")
    assert mine["idle_minutes"].tolist() == [40.0, 35.0]  # the 20-minute lull is too short to count
    assert mine["idle_cost_usd"].tolist() == pytest.approx([40 / 60 * 6.88, 35 / 60 * 6.88])
    assert mine.iloc[0]["end_ts"] == T0 + timedelta(minutes=40)
    orphan = runs[runs["team"] == UNATTRIBUTED]
    assert orphan["idle_minutes"].tolist() == [45.0]
    waste = waste_by_team(store, T0, END, WasteConfig(30, 5, 0.25)).set_index("team")
    assert waste.loc["a", "idle_gpu_hours"] == pytest.approx(75 / 60)


def test_oversized_jobs_get_the_smallest_shape_that_fits(store):
    store.append_samples(table(
        gpu_rows("n", 0, "H100", 90, util=20.0, job="a/small", team="a", mem_used=6000),
        gpu_rows("n", 1, "H100", 90, util=90.0, job="a/big", team="a", mem_used=70000),
        gpu_rows("n", 2, "L40S", 90, util=30.0, job="b/small", team="b", mem_used=10000, mem_total=46068),
    ))
    over = oversized_jobs(store, T0, END, WasteConfig(oversized_mem_fraction=0.25)).set_index("job_id")
    assert set(over.index) == {"a/small", "b/small"}
    assert over.loc["a/small", "fits"]["target"] == "H100 MIG 2g.20gb"  # 1g has the memory, not the compute
    assert over.loc["b/small", "fits"] == {"kind": "gpu", "target": "T4", "gpu_fraction": 1.0}


def test_an_idle_oversized_job_is_listed_without_a_shape(store):
    store.append_samples(table(*[gpu_rows("n", g, "H100", 90, util=0.0, job="a/idle8", team="a", mem_used=2000)
                                 for g in range(8)]))
    over = oversized_jobs(store, T0, END, WasteConfig(30, 5.0, 0.25)).set_index("job_id")
    assert bool(over.loc["a/idle8", "idle"]) and over.loc["a/idle8", "fits"] is None
    never_idle = WasteConfig(idle_util_pct=0.0, oversized_mem_fraction=0.25)
    assert oversized_jobs(store, T0, END, never_idle).loc[0, "fits"]["target"] == "H100 MIG 1g.10gb"


def test_a_gpu_is_present_at_most_once_where_backfill_and_live_samples_overlap(store):
    """The backfill's last 5-minute sample and the first live 15-second ones cover the same minutes: the GPU is
    still one GPU present there, not more (the hour where live data took over showed 51 GPUs of 48)."""
    store.append_samples(table(
        gpu_rows("n", 0, "H100", 60, step_s=300.0, util=50.0, job="a/1", team="a"),
        gpu_rows("n", 0, "H100", 23, step_s=15.0, start=T0 + timedelta(minutes=57), util=50.0, job="a/1", team="a"),
        gpu_rows("n", 1, "H100", 80, util=50.0),
    ))
    series = cluster_utilization(store, T0, T0 + timedelta(hours=2), bucket_minutes=60)
    assert series["total_gpus"].tolist() == pytest.approx([2.0, 2.0])
    assert (series["allocated_gpus"] <= 1.0 + 1e-9).all()


def test_an_idle_job_is_one_stretch_and_not_also_oversized(store):
    """An 8-GPU job idle for 90 minutes is one idle stretch of 8 GPUs (12 GPU-hours), not eight rows, and it is
    not listed again as memory-oversized; a busy oversized job still is. Two stretches of one job split by busy
    minutes stay two, and GPUs without a job stay one row each."""
    store.append_samples(table(
        *[gpu_rows("n", g, "H100", 90, util=0.0, job="a/idle8", team="a", mem_used=2000) for g in range(8)],
        gpu_rows("n", 8, "H100", 83, util=[0.0] * 40 + [80.0] * 3 + [0.0] * 40, job="a/gap", team="a",
                 mem_used=2000),
        gpu_rows("m", 0, "H100", 90, util=40.0, job="b/small", team="b", mem_used=2000),
        *[gpu_rows("o", g, "H100", 45, util=0.0, job=None, allocated=True) for g in range(2)],
    ))
    found = waste(store, T0, END, WasteConfig(30, 5.0, 0.25))
    assert len(found.runs[found.runs["job_id"] == "a/idle8"]) == 8  # per GPU, as the policies read them
    mine = found.stretches[found.stretches["job_id"] == "a/idle8"]
    assert mine["gpus"].tolist() == [8] and mine["idle_minutes"].tolist() == [90.0]
    assert mine["idle_gpu_hours"].tolist() == pytest.approx([12.0])
    assert mine.iloc[0]["gpu_uuids"] == [f"GPU-n-{g}" for g in range(8)]
    assert mine.iloc[0]["mean_util_pct"] == pytest.approx(0.0)
    gap = found.stretches[found.stretches["job_id"] == "a/gap"]
    assert gap["idle_minutes"].tolist() == [40.0, 40.0] and gap["gpus"].tolist() == [1, 1]
    orphans = found.stretches[found.stretches["team"] == UNATTRIBUTED]
    assert len(orphans) == 2 and orphans["gpus"].tolist() == [1, 1]
    assert found.oversized["job_id"].tolist() == ["b/small"]
    assert "a/idle8" in set(oversized_jobs(store, T0, END, WasteConfig(30, 5.0, 0.25))["job_id"])  # policies see it
    teams = found.by_team.set_index("team")
    assert teams.loc["a", "idle_stretches"] == 3 and teams.loc["a", "oversized_jobs"] == 0
    assert teams.loc["b", "oversized_jobs"] == 1
    assert found.stretches["idle_gpu_hours"].sum() == pytest.approx(found.runs["idle_gpu_hours"].sum())


def test_smallest_fit_edges():
    assert smallest_fit("H100", 70000, 10) is None  # needs 82 GB: nothing smaller holds it
    assert smallest_fit("H100", 2000, 10)["target"] == "H100 MIG 1g.10gb"
    assert smallest_fit("H100", 2000, 50)["target"] == "H100 MIG 4g.40gb"
    assert smallest_fit("H100", 2000, 90) is None  # too busy for a slice or a smaller card
    assert smallest_fit("L40S", 2000, 25)["target"] == "T4"
    assert smallest_fit("T4", 15000, 20) is None


def test_iso_weeks():
    start, end, label = iso_week("2026-W48")
    assert (start, end, label) == (datetime(2026, 11, 23, tzinfo=timezone.utc),
                                   datetime(2026, 11, 30, tzinfo=timezone.utc), "2026-W48")
    assert iso_week(None, now=datetime(2026, 12, 3, 15, tzinfo=timezone.utc))[2] == "2026-W48"
    assert iso_week("last", now=datetime(2026, 11, 30, 0, 5, tzinfo=timezone.utc))[2] == "2026-W48"
    for bad in ("2026-48", "2026-W54", "next"):
        with pytest.raises(ValueError):
            iso_week(bad)
