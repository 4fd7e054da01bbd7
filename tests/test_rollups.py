"""Rollups give the answers the raw samples give: to the cent and the second, whatever part of a window is read
from hour rows, minute rows or the not-yet-folded raw tail; late and duplicate samples; retention; a new idle
threshold. The oracles below are plain SQL over the raw `samples` table, written independently of the rollups."""
from __future__ import annotations

import re
from datetime import timedelta

import duckdb
import pandas as pd
import pytest

from gpuledger.analytics.config import Config, WasteConfig
from gpuledger.analytics.cost import cost_by_team, daily_cost_by_team
from gpuledger.analytics.store import Store, database
from gpuledger.analytics.store.ingest_writer import IngestWriter
from gpuledger.analytics.store.metrics import REGISTRY as STORE_METRICS
from gpuledger.analytics.store.schema import SCHEMA_VERSION
from gpuledger.analytics.usage import cluster_utilization, covered_hours, hourly_demand, team_usage
from gpuledger.analytics.waste import idle_runs, job_profiles, with_p95
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.metrics import sample_value
from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED
from gpuledger.collector.simulator import cluster_of, default_simulator
from tests.helpers import T0, gpu_rows, table

NOW = utc_now().replace(second=0, microsecond=0)
START = NOW - timedelta(days=2)
# minute-aligned, not hour-aligned: the window starts and ends inside hours
LO, HI = START + timedelta(hours=5, minutes=13), NOW - timedelta(hours=3, minutes=29)
PARAMS = {"start": LO, "end": HI, "unattributed": UNATTRIBUTED, "idle": IDLE_CAPACITY, "idle_pct": 5.0}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's 48-GPU cluster, two days at 60 s, folded up to a moment inside an hour so that the window reads
    hour rows, minute rows and raw samples."""
    store = Store(tmp_path_factory.mktemp("rollups") / "demo.duckdb")
    store.set_rates(Config().rates)
    sim = default_simulator(days=2, seed=7, now=NOW)
    store._folded_at = float("inf")  # no automatic fold while loading: the test chooses the watermark
    for batch in sim.history(START, NOW, step_s=60.0):
        store.append_samples(batch)
    store.fold(until=NOW.replace(minute=0) - timedelta(hours=7) + timedelta(minutes=17))  # inside an hour, always
    yield store
    store.close()


def test_the_window_spans_all_three_levels(demo):
    state = demo.rollup_params()
    # the fold is visible on /metrics: how far it got, so an admin can alert on a stalled fold
    assert sample_value(STORE_METRICS, "gpuledger_rollup_watermark_timestamp_seconds") >= state["mwm"].timestamp()
    assert LO < state["hwm"] < state["mwm"] < HI
    assert state["mwm"].minute != 0  # minute rows past the last whole hour
    assert demo.scalar("SELECT count(*) FROM usage_hour") > 0
    assert demo.scalar("SELECT count(*) FROM samples WHERE ts >= ?", [state["mwm"]]) > 0


def raw(store: Store, sql: str, params: dict = PARAMS) -> pd.DataFrame:
    used = set(re.findall(r"\$(\w+)", sql))
    return store.query(sql, {k: v for k, v in params.items() if k in used})


def test_cost_and_usage_match_the_raw_samples_to_the_cent(demo):
    want = raw(demo, """
        SELECT bill_line(allocated, team, $unattributed, $idle) AS team,
               sum(interval_s * gpu_fraction) / 3600 AS gpu_hours,
               sum(interval_s * gpu_fraction * coalesce(util_pct, 0) / 100) / 3600 AS used_gpu_hours,
               sum(interval_s * gpu_fraction / 3600 * coalesce(usd_per_gpu_hour, 0)) AS cost_usd
        FROM samples LEFT JOIN rate_versions USING (gpu_model) WHERE ts >= $start AND ts < $end GROUP BY 1""")
    got = cost_by_team(demo, LO, HI).set_index("team")
    want = want.set_index("team").loc[got.index]
    assert len(got) == len(want) >= 4
    for column in ("gpu_hours", "used_gpu_hours", "cost_usd"):
        assert got[column].round(2).tolist() == want[column].round(2).tolist(), column
    daily = daily_cost_by_team(demo, LO, HI)
    assert daily["cost_usd"].sum() == pytest.approx(want["cost_usd"].sum(), abs=0.005)

    jobs = raw(demo, "SELECT owner(team, $unattributed) AS team, count(DISTINCT job_id) AS jobs FROM samples "
                     "WHERE allocated AND ts >= $start AND ts < $end GROUP BY 1")
    usage = team_usage(demo, LO, HI).set_index("team")
    assert usage["jobs"].to_dict() == jobs.set_index("team")["jobs"].to_dict()


def test_hourly_demand_and_coverage_match_the_raw_samples(demo):
    want = raw(demo, """
        SELECT owner(team, $unattributed) AS team, gpu_model, time_bucket(INTERVAL 1 HOUR, ts) AS hour,
               sum(interval_s * gpu_fraction) / 3600 AS allocated_gpus,
               coalesce(sum(interval_s * gpu_fraction) FILTER (WHERE coalesce(sm_active * 100.0, util_pct, 0) < $idle_pct), 0) / 3600
                   AS idle_gpus
        FROM samples WHERE allocated AND ts >= $start AND ts < $end GROUP BY ALL""")
    key = ["team", "gpu_model", "hour"]
    got = hourly_demand(demo, LO, HI, 5.0).sort_values(key).reset_index(drop=True)
    want = want.sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(got[key], want[key])
    for column in ("allocated_gpus", "idle_gpus"):
        assert got[column].tolist() == pytest.approx(want[column].tolist(), abs=1e-9)
    hours = covered_hours(demo, LO, HI).set_index("gpu_model")["hours"]
    hours_raw = raw(demo, "SELECT gpu_model, list_sort(list(DISTINCT time_bucket(INTERVAL 1 HOUR, ts))) AS hours "
                          "FROM samples WHERE ts >= $start AND ts < $end GROUP BY 1").set_index("gpu_model")["hours"]
    assert {m: list(h) for m, h in hours.items()} == {m: list(h) for m, h in hours_raw.items()}


def test_utilisation_series_matches_the_per_instant_average(demo):
    for minutes in (60, 15):  # hour rows; minute rows only
        want = raw(demo, """
            WITH per_instant AS (
                SELECT ts, sum(gpu_fraction) AS present,
                       coalesce(sum(gpu_fraction) FILTER (WHERE allocated), 0) AS allocated
                FROM samples WHERE ts >= $start AND ts < $end GROUP BY ts)
            SELECT time_bucket(to_minutes($minutes::INTEGER), ts) AS bucket, avg(present) AS total_gpus,
                   avg(allocated) AS allocated_gpus
            FROM per_instant GROUP BY 1 ORDER BY 1""", {**PARAMS, "minutes": minutes})
        got = cluster_utilization(demo, LO, HI, bucket_minutes=minutes)
        assert got["bucket"].tolist() == want["bucket"].tolist()
        assert got["total_gpus"].tolist() == pytest.approx(want["total_gpus"].tolist(), rel=1e-9)
        assert got["allocated_gpus"].tolist() == pytest.approx(want["allocated_gpus"].tolist(), rel=1e-9)


# idle: SM activity under the threshold where the GPU reports it, else GPU utilisation (the fold's signal)
RAW_IDLE_RUNS = """
    WITH s AS (
        SELECT *, coalesce(sm_active * 100.0, util_pct, 0) < $idle_pct AS idle FROM samples WHERE allocated AND ts >= $start AND ts < $end
    ), g AS (
        SELECT *, row_number() OVER (PARTITION BY gpu_uuid, mig_instance, job_id ORDER BY ts)
                - row_number() OVER (PARTITION BY gpu_uuid, mig_instance, job_id, idle ORDER BY ts) AS grp FROM s)
    SELECT owner(team, $unattributed) AS team, job_id, gpu_uuid, min(ts) AS start_ts,
           max(ts) + to_seconds(any_value(interval_s)::BIGINT) AS end_ts, sum(interval_s) / 60 AS idle_minutes,
           sum(interval_s * gpu_fraction) / 3600 AS idle_gpu_hours, avg(util_pct) AS mean_util_pct
    FROM g WHERE idle GROUP BY team, job_id, gpu_uuid, mig_instance, grp HAVING sum(interval_s) >= 30 * 60"""


def test_idle_stretches_match_the_raw_gaps_and_islands_to_the_second(demo):
    key = ["gpu_uuid", "start_ts"]
    want = raw(demo, RAW_IDLE_RUNS).sort_values(key).reset_index(drop=True)
    got = idle_runs(demo, LO, HI, WasteConfig(30, 5.0)).sort_values(key).reset_index(drop=True)
    assert len(want) > 5
    columns = ["team", "job_id", "gpu_uuid", "start_ts", "end_ts"]
    pd.testing.assert_frame_equal(got[columns], want[columns])
    for column in ("idle_minutes", "idle_gpu_hours", "mean_util_pct"):
        assert got[column].tolist() == pytest.approx(want[column].tolist(), rel=1e-9, nan_ok=True), column


def test_job_profiles_match_the_raw_samples(demo):
    want = raw(demo, """
        SELECT job_id, count(DISTINCT gpu_uuid) AS gpus, min(ts) AS first_ts, max(ts) AS last_ts,
               max(mem_used_mib) AS peak_mem_mib, avg(coalesce(util_pct, 0)) AS mean_util_pct,
               quantile_cont(coalesce(util_pct, 0), 0.95) AS p95_util_pct,  -- the demo samples once a minute
               sum(interval_s * gpu_fraction) / 3600 AS gpu_hours
        FROM samples WHERE allocated AND job_id IS NOT NULL AND mig_profile IS NULL AND ts >= $start AND ts < $end
        GROUP BY job_id ORDER BY job_id""")
    got = with_p95(demo, job_profiles(demo, LO, HI), LO, HI).sort_values("job_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["job_id", "gpus", "first_ts", "last_ts"]],
                                  want[["job_id", "gpus", "first_ts", "last_ts"]])
    for column in ("peak_mem_mib", "mean_util_pct", "p95_util_pct", "gpu_hours"):
        assert got[column].tolist() == pytest.approx(want[column].tolist(), rel=1e-9), column


def totals(store: Store, lo=START, hi=NOW) -> tuple[float, float]:
    """GPU-hours and cost of the whole bill, from the rollups."""
    bill = cost_by_team(store, lo, hi)
    return round(bill["gpu_hours"].sum(), 6), round(bill["cost_usd"].sum(), 2)


def raw_totals(store: Store, lo=START, hi=NOW) -> tuple[float, float]:
    row = store.query("""SELECT sum(interval_s * gpu_fraction) / 3600 AS h,
                                sum(interval_s * gpu_fraction / 3600 * coalesce(usd_per_gpu_hour, 0)) AS c
                         FROM samples LEFT JOIN rate_versions USING (gpu_model) WHERE ts >= $lo AND ts < $hi""",
                      {"lo": lo, "hi": hi})
    return round(row["h"][0], 6), round(row["c"][0], 2)


def history(hours: float, step_s: float = 60.0):
    sim = default_simulator(days=1, seed=3, now=NOW)
    return list(sim.history(NOW - timedelta(hours=hours), NOW - timedelta(minutes=5), step_s=step_s,
                            chunk_s=1800.0))


def test_late_samples_for_folded_minutes_and_hours_are_refolded_in_their_transaction(open_store, monkeypatch):
    batches = history(6)
    with open_store("late") as store:
        store.set_rates(Config().rates)
        monkeypatch.setattr(database, "FOLD_EVERY_S", 0.0)  # fold after every append
        late_node = batches[2]["node"][0].as_py()
        held = [b.filter(pa_equal(b, late_node)) for b in batches[2:5]]  # one node's hour, held back
        for i, batch in enumerate(batches):
            store.append_samples(batch.filter(pa_not_equal(batch, late_node)) if 2 <= i < 5 else batch)
        assert store.rollup_params()["hwm"] > held[-1]["ts"][0].as_py()  # its hours are already folded
        for batch in held:  # the node drains its backlog
            store.append_samples(batch)
        assert totals(store) == raw_totals(store)
        minute = store.query("SELECT sum(gpu_s) AS s FROM usage_minute")["s"][0]
        hour = store.query("SELECT sum(gpu_s) AS s FROM usage_hour")["s"][0]
        folded_raw = store.query("SELECT sum(interval_s * gpu_fraction) AS s FROM samples WHERE ts < $h",
                                 {"h": store.rollup_params()["hwm"]})["s"][0]
        assert hour == pytest.approx(folded_raw, rel=1e-12) and minute >= hour


def pa_equal(batch, node):
    import pyarrow.compute as pc
    return pc.equal(batch["node"], node)


def pa_not_equal(batch, node):
    import pyarrow.compute as pc
    return pc.not_equal(batch["node"], node)


def test_a_resent_batch_changes_neither_samples_nor_rollups(open_store, monkeypatch):
    monkeypatch.setattr(database, "FOLD_EVERY_S", 0.0)
    batches = history(3)
    with open_store("once") as store:
        store.set_rates(Config().rates)
        writer = IngestWriter(store, idle_checkpoint_s=600)
        try:
            per_node = {}
            for batch in batches:
                for node in sorted(set(batch["node"].to_pylist())):
                    per_node.setdefault(node, []).append(batch.filter(pa_equal(batch, node)))
            for node, tables in per_node.items():
                for seq, part in enumerate(tables):
                    writer.submit(node, "s1", seq, 1, 60.0, part)
            store.fold()
            before = (totals(store), store.scalar("SELECT count(*) FROM usage_minute"))
            node, tables = next(iter(per_node.items()))
            again = writer.submit(node, "s1", 0, 1, 60.0, tables[0])  # a lost acknowledgement: resent
            assert not again.fresh[0]
            assert (totals(store), store.scalar("SELECT count(*) FROM usage_minute")) == before
            assert totals(store) == raw_totals(store)
        finally:
            writer.stop()


def test_compaction_drops_raw_samples_and_old_minutes_but_no_total_changes(open_store):
    with open_store("retain") as store:
        store.set_rates(Config().rates)
        for batch in history(5):
            store.append_samples(batch)
        before, raw_before = totals(store), raw_totals(store)
        assert before == raw_before
        runs_before = idle_runs(store, START, NOW, WasteConfig(30, 5.0))
        # eleven days later with raw kept 10 days: every folded sample goes; minutes kept 10 days: every minute
        # already rolled into its hour goes too
        counted = sample_value(STORE_METRICS, "gpuledger_retention_rows_dropped_total", table="samples")
        dropped = store.retain(NOW + timedelta(days=11), database.Retention(raw_days=10, minute_days=10))
        assert dropped["samples"] > 0 and dropped["usage_minute"] > 0
        assert sample_value(STORE_METRICS, "gpuledger_retention_rows_dropped_total", table="samples") \
            == counted + dropped["samples"]
        state = store.rollup_params()
        assert store.scalar("SELECT min(ts) FROM samples") >= state["mwm"]  # only the unfolded last minutes stay
        assert store.scalar("SELECT min(bucket) FROM usage_minute") >= state["hwm"]
        assert totals(store) == before  # whole hours answer from the hour rollups
        assert store.sample_count(START, NOW) > 0  # the evidence is still counted
        # with the minutes gone, idle stretches still come out the same: whole hours carry their own edges
        runs_after = idle_runs(store, START, NOW, WasteConfig(30, 5.0))
        columns = ["gpu_uuid", "start_ts", "end_ts", "idle_minutes"]
        assert len(runs_before) > 0
        pd.testing.assert_frame_equal(runs_after[columns].sort_values(columns).reset_index(drop=True),
                                      runs_before[columns].sort_values(columns).reset_index(drop=True))


def test_retention_keeps_what_is_not_folded_yet_and_refuses_nonsense(open_store):
    with pytest.raises(ValueError, match="raw_days"):
        database.Retention(raw_days=100, minute_days=90)
    with open_store("unfolded") as store:
        store._folded_at = float("inf")
        for batch in history(2):
            store.append_samples(batch)
        rows = store.scalar("SELECT count(*) FROM samples")
        store.fold(until=NOW - timedelta(hours=1))
        store.retain(NOW + timedelta(days=40))  # retain folds what is closed first, then drops
        assert store.scalar("SELECT min(ts) FROM samples") >= store.rollup_params()["mwm"] > NOW - timedelta(hours=1)
        assert store.sample_count() == rows


def test_a_new_idle_threshold_rebuilds_the_rollups(demo, open_store):
    with pytest.raises(Exception, match="idle under 5%"):
        idle_runs(demo, LO, HI, WasteConfig(30, 20.0))
    with open_store("threshold") as store:
        store.set_rates(Config().rates)
        for batch in history(6):
            store.append_samples(batch)
        assert store.use_idle_threshold(20.0) > 0
        params = {**PARAMS, "idle_pct": 20.0, "start": START, "end": NOW}
        want = raw(store, RAW_IDLE_RUNS, params).sort_values(["gpu_uuid", "start_ts"]).reset_index(drop=True)
        got = idle_runs(store, START, NOW, WasteConfig(30, 20.0))
        got = got.sort_values(["gpu_uuid", "start_ts"]).reset_index(drop=True)
        assert len(got) == len(want) > 0
        assert got["idle_minutes"].tolist() == pytest.approx(want["idle_minutes"].tolist())
        assert store.use_idle_threshold(20.0) == 0  # unchanged: nothing rebuilt


def test_stretches_inside_an_hour_and_across_hours_match_the_raw_samples(store):
    """Busy 5 min, idle 45, busy 10 | idle 30, busy 1, idle 29 | idle 60 | idle 10, busy 50 (at 10 s): a stretch
    inside an hour (45), one at an hour's start (30) and one across three hours (29 + 60 + 10)."""
    minutes = [100.0] * 5 + [0.0] * 45 + [100.0] * 10 + [0.0] * 30 + [100.0] + [0.0] * 29 + [0.0] * 60 \
        + [0.0] * 10 + [100.0] * 50
    util = [u for u in minutes for _ in range(6)]
    store.append_samples(table(gpu_rows("n", 0, "H100", 240, step_s=10.0, util=util, job="a/1", team="a")))
    store.fold(until=T0 + timedelta(hours=5))
    assert store.rollup_params()["hwm"] >= T0 + timedelta(hours=4)  # every hour above is folded
    params = {**PARAMS, "start": T0, "end": T0 + timedelta(hours=4)}
    want = raw(store, RAW_IDLE_RUNS, params).sort_values("start_ts").reset_index(drop=True)
    got = idle_runs(store, T0, T0 + timedelta(hours=4), WasteConfig(30, 5.0))
    got = got.sort_values("start_ts").reset_index(drop=True)
    assert got["idle_minutes"].tolist() == want["idle_minutes"].tolist() == [45.0, 30.0, 99.0]
    assert got["start_ts"].tolist() == want["start_ts"].tolist()
    assert got["end_ts"].tolist() == want["end_ts"].tolist()


def test_a_store_from_before_temperature_gains_it_and_folds_it(tmp_path):
    """A schema-7 file (rollups without temp_max) opened by this version: the column is added, old rows keep
    none, and minutes folded from then on carry the hottest reading."""
    path = tmp_path / "old.duckdb"
    Store(path).close()
    con = duckdb.connect(str(path))
    for rollup in ("usage_minute", "usage_hour"):
        con.execute(f"ALTER TABLE {rollup} DROP COLUMN temp_max")
    con.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
    con.close()
    with Store(path) as store:
        assert store.meta("schema_version") == SCHEMA_VERSION
        frame = cluster_of(1).frame([NOW.timestamp() - 600 + 10 * k for k in range(30)], 10.0)
        store.append_samples(frame)
        store.fold(until=NOW)
        folded = store.query("SELECT gpu_uuid, max(temp_max) AS t FROM usage_minute GROUP BY 1 ORDER BY 1")
        raw = store.query("SELECT gpu_uuid, max(temp_c) AS t FROM samples "
                          "WHERE ts < date_trunc('minute', ?::TIMESTAMPTZ) GROUP BY 1 ORDER BY 1", [NOW])
        assert folded["t"].tolist() == pytest.approx(raw["t"].tolist()) and len(folded) == 8
