"""Hostile and broken rows: every row is bounded at ingest, and rows that got into a store some other way (an older
server, an import, the simulator) cannot turn an answer into a 500 or a bill into millions."""
from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from fastapi.testclient import TestClient

from gpuledger.analytics.config import Config, QuotaConfig
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.ingest_writer import IngestWriter
from gpuledger.analytics.store.metrics import REGISTRY as STORE_METRICS
from gpuledger.analytics.cost import cost_by_team, cost_by_team_and_model
from gpuledger.analytics.usage import capacity_by_model, cluster_utilization
from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED, rows_to_table
from gpuledger.collector.simulator import ClusterSimulator, cluster_of
from gpuledger.deploy.api import create_app
from tests.procs import TOKEN

NOW = datetime.now(timezone.utc).replace(microsecond=0)


def node_frame(node: int = 0, at: datetime = NOW - timedelta(seconds=60), nodes: int = 1) -> pa.Table:
    """One 8-GPU node's samples at `at` (node-0000's GPUs unless `node` says another of `nodes`)."""
    frame = cluster_of(max(nodes, node + 1)).frame([at.timestamp()], 10.0)
    return frame.filter(pc.equal(frame["node"], f"node-{node:04d}"))


def edited(table: pa.Table, changes: dict[int, dict]) -> pa.Table:
    rows = table.to_pylist()
    for i, values in changes.items():
        rows[i].update(values)
    return rows_to_table(rows)


def rejected_total(reason: str) -> float:
    return STORE_METRICS.get_sample_value("gpuledger_ingest_rows_rejected_total", {"reason": reason}) or 0.0



def test_values_no_gpu_can_have_are_refused_with_a_reason_per_batch(writer):
    """The $1.9M sample: fractions of a million GPUs, intervals of 30 years, negative GPUs, values past any
    sensor's range. Each is refused and counted; NaN/Inf telemetry is still stored as NULL."""
    w, store = writer
    frame = pa.concat_tables([node_frame(0, nodes=2), node_frame(1, nodes=2)])  # 16 GPUs of one agent
    hostile = edited(frame, {
        0: {"gpu_fraction": 1e6}, 1: {"gpu_fraction": -1000.0}, 2: {"gpu_fraction": None},
        3: {"gpu_fraction": math.inf}, 4: {"gpu_fraction": 1.7e308},
        5: {"interval_s": 1e9}, 6: {"interval_s": 1.7e308}, 7: {"interval_s": 21.5}, 8: {"interval_s": math.nan},
        9: {"util_pct": 250.0}, 10: {"sm_active": 1.5}, 11: {"mem_used_mib": 90_000.0, "mem_total_mib": 81_559.0},
        12: {"power_w": 1e308}, 13: {"temp_c": 500.0},
        14: {"interval_s": 21.0, "power_w": math.inf},  # within the slack; Inf power stored as NULL
        15: {"gpu_fraction": 0.0},  # a whole-GPU row its MIG instances hold entirely: bills nothing, kept
    })
    before = {r: rejected_total(r) for r in ("bad_fraction", "bad_interval", "out_of_range")}
    (result,) = w.submit("n1", "s1", 0, 1, 10.0, hostile)
    assert result.rejected == {"bad_fraction": 5, "bad_interval": 4, "out_of_range": 5}
    assert result.rows == 2 and result.nulled_values == 1
    assert store.scalar("SELECT count(*) FROM samples WHERE gpu_fraction = 0") == 1
    assert {r: rejected_total(r) - before[r] for r in before} == {"bad_fraction": 5, "bad_interval": 4,
                                                                  "out_of_range": 5}
    assert store.scalar("SELECT max(interval_s * gpu_fraction) FROM samples") == pytest.approx(21.0)


def test_names_and_the_bills_own_buckets_cannot_be_written(writer):
    w, store = writer
    hostile = edited(node_frame(), {
        0: {"team": "x;rm -rf /"}, 1: {"pod": "$(curl evil)"}, 2: {"gpu_model": "H100<script>"},
        3: {"team": IDLE_CAPACITY, "allocated": True},
        4: {"team": UNATTRIBUTED, "allocated": False},  # only the sender's own allocated, unclaimed usage
        5: {"team": UNATTRIBUTED, "allocated": True, "job_id": "pid-42"},
        6: {"gpu_model": None, "allocated": True, "team": "nlp"},
    })
    (result,) = w.submit("n1", "s1", 0, 1, 10.0, hostile)
    assert result.rejected == {"bad_name": 3, "reserved_team": 2} and result.rows == 3
    kept = store.query("SELECT team, gpu_model FROM samples ORDER BY gpu_index")
    assert UNATTRIBUTED in set(kept["team"]) and "unknown" in set(kept["gpu_model"])  # billed, unpriced
    assert not store.scalar("SELECT count(*) FROM samples WHERE gpu_model IS NULL")


def test_a_gpu_belongs_to_one_node_at_a_time(writer, tmp_path):
    w, store = writer
    now = datetime.now(timezone.utc).replace(microsecond=0)  # not the module's: the restart below reads the GPUs'
    # homes of the last 10 minutes from the file, and in a long run the module was imported long before this test
    assert w.submit("node-0000", "s1", 0, 1, 10.0, node_frame(0, now - timedelta(seconds=60)))[0].rows == 8
    stolen = node_frame(0, now - timedelta(seconds=50))  # node-0000's GPUs, sent by another agent
    (refused,) = w.submit("node-0001", "s1", 0, 1, 10.0, stolen)
    assert refused.rows == 0 and refused.rejected == {"gpu_on_other_node": 8}
    assert w.submit("node-0000", "s1", 1, 1, 10.0, stolen)[0].rows == 8  # its own node: stored
    # two agents claiming one GPU at once: the first to arrive keeps it, whether both land in one group or not
    with store.transaction():  # the writer is busy: both requests queue behind it
        first = w.enqueue("node-0002", "s1", 0, 1, 10.0, node_frame(2, now - timedelta(seconds=60), nodes=3))
        second = w.enqueue("node-0003", "s1", 0, 1, 10.0, node_frame(2, now - timedelta(seconds=40), nodes=3))
    assert first.result(timeout=60)[0].rows == 8
    assert second.result(timeout=60)[0].rejected == {"gpu_on_other_node": 8}
    w.stop()
    again = IngestWriter(store, idle_checkpoint_s=600)  # a restarted server knows where each GPU is from the file
    try:
        late = node_frame(0, now - timedelta(seconds=30))
        assert again.submit("node-0009", "s1", 0, 1, 10.0, late)[0].rejected == {"gpu_on_other_node": 8}
    finally:
        again.stop()
    assert store.scalar("SELECT count(DISTINCT node) FROM samples WHERE gpu_uuid IN "
                        "(SELECT gpu_uuid FROM samples WHERE node = 'node-0000')") == 1


def test_a_gpu_moved_to_another_machine_is_accepted_once_its_old_node_is_silent(tmp_path):
    with Store(tmp_path / "m.duckdb") as store:
        store.append_samples(node_frame(0, NOW - timedelta(minutes=30)))
        w = IngestWriter(store, idle_checkpoint_s=600)
        try:
            assert w.submit("node-0007", "s1", 0, 1, 10.0, node_frame(0))[0].rows == 8
        finally:
            w.stop()


def test_a_batch_of_a_hundred_thousand_gpus_stores_the_bound(writer):
    w, store = writer
    n = 100_000
    one = node_frame()
    fake = one.take(pa.array(np.zeros(n, np.int64)))
    fake = fake.set_column(fake.schema.get_field_index("gpu_uuid"), "gpu_uuid",
                           pa.array([f"GPU-fake-{i:06d}" for i in range(n)]))
    before = rejected_total("too_many_gpus")
    (result,) = w.submit("n1", "s1", 0, 1, 10.0, fake)
    assert result.rows == 64 and result.rejected == {"too_many_gpus": n - 64}
    assert rejected_total("too_many_gpus") - before == n - 64
    assert store.scalar("SELECT count(DISTINCT gpu_uuid) FROM samples") == 64


def test_pods_sharing_a_gpu_are_each_billed_and_never_over_the_whole_gpu(writer):
    """Time-slicing: one row per pod at the same instant. Both are stored (the key includes the holder), a resent
    copy is still a duplicate, and parts claiming more than the GPU are scaled down to it."""
    w, store = writer
    base = node_frame().slice(0, 1).to_pylist()[0]
    pods = [dict(base, pod=f"pod-{k}", job_id=f"job-{k}", team="nlp", allocated=True, gpu_fraction=0.5)
            for k in range(2)]
    (first,) = w.submit("node-0000", "s1", 0, 1, 10.0, rows_to_table(pods))
    assert first.rows == 2 and not first.rejected
    (again,) = w.submit("node-0000", "s1", 1, 1, 10.0, rows_to_table(pods))  # the same rows, a new batch id
    assert again.rows == 0 and again.rejected == {"duplicate_sample": 2}
    later = NOW - timedelta(seconds=50)
    greedy = [dict(p, ts=later, gpu_fraction=1.0) for p in pods]
    (both,) = w.submit("node-0000", "s1", 2, 1, 10.0, rows_to_table(greedy))
    assert both.rows == 2
    parts = store.query("SELECT ts, sum(gpu_fraction) AS f, count(*) AS n FROM samples GROUP BY ts ORDER BY ts")
    assert parts["n"].tolist() == [2, 2] and parts["f"].tolist() == pytest.approx([1.0, 1.0])
    # the rollups see one GPU, wholly allocated: sharers' rows do not make it look sampled twice as long
    points = cluster_utilization(store, NOW - timedelta(hours=1), NOW, 60)
    assert len(points) and points["total_gpus"].tolist() == pytest.approx([1.0] * len(points))
    assert points["allocated_gpus"].tolist() == pytest.approx([1.0] * len(points))


def test_capacity_counts_every_node_at_its_own_latest_instant(tmp_path):
    """Per-node agents sample at their own instants: one node's rows a few minutes ahead must not make every
    other node's GPUs vanish from the capacity (quota advice said 'no GPU present')."""
    with Store(tmp_path / "cap.duckdb") as store:
        store.append_samples(node_frame(0, NOW - timedelta(seconds=30), nodes=2))
        store.append_samples(node_frame(1, NOW + timedelta(minutes=4), nodes=2))
        capacity = capacity_by_model(store, NOW + timedelta(minutes=5))
        assert dict(zip(capacity["gpu_model"], capacity["gpus"])) == {"H100": pytest.approx(16.0)}
        # a node silent for longer than the staleness bound is not counted as present
        store.append_samples(node_frame(2, NOW - timedelta(hours=3), nodes=3))
        capacity = capacity_by_model(store, NOW + timedelta(minutes=5))
        assert capacity["gpus"].sum() == pytest.approx(16.0)


# --- rows no screening saw: every read answers ------------------------------------------------------------------

HOSTILE_VALUES = [
    {"gpu_fraction": math.inf}, {"gpu_fraction": None}, {"gpu_fraction": 1.7e308}, {"gpu_fraction": -1000.0},
    {"gpu_fraction": math.nan}, {"interval_s": 1e308}, {"interval_s": math.nan}, {"interval_s": -5.0},
    {"interval_s": None}, {"gpu_model": None}, {"util_pct": 1e308}, {"power_w": 1e308, "power_avg_w": 1e308},
    {"mem_used_mib": 1e308, "mem_total_mib": math.inf}, {"temp_c": math.inf},
]


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    """Six hours of a small simulated cluster, plus one row of each hostile kind both in folded minutes and in the
    unfolded tail, written past ingest (as an older server, an import or the simulator could have)."""
    sim = ClusterSimulator(start=NOW - timedelta(days=2), end=NOW + timedelta(days=1), seed=5)
    store = Store(tmp_path_factory.mktemp("hostile") / "h.duckdb")
    store.set_rates(Config().rates)
    store.upsert_teams(sim.team_frame())
    for batch in sim.history(NOW - timedelta(hours=6), NOW - timedelta(minutes=1), step_s=300):
        store.append_samples(batch)
    store.upsert_jobs(sim.jobs_frame(NOW))
    base = sim.frame([(NOW - timedelta(minutes=1)).timestamp()], 60.0).slice(0, 1).to_pylist()[0]
    rows = []
    for k, values in enumerate(HOSTILE_VALUES):
        for at in (NOW - timedelta(hours=2), NOW - timedelta(seconds=30)):
            rows.append({**base, "ts": at, "gpu_uuid": f"GPU-hostile-{k}", "node": "evil", "team": "victim",
                         "job_id": f"h{k}", "allocated": True, "util_pct": 50.0, **values})
    store.append_samples(rows_to_table(rows))
    store.fold()
    yield store
    store.close()


def read_routes(client: TestClient) -> list[str]:
    """Every GET route the API documents (the backup download aside: it copies the file), and /metrics."""
    paths = client.get("/openapi.json").json()["paths"]
    return sorted({p for p, ops in paths.items() if "get" in ops and p != "/v1/backup"} | {"/metrics", "/healthz"})


def test_no_read_answers_500_over_hostile_rows(hostile_store):
    app = create_app(hostile_store, Config(quota=QuotaConfig(window_days=1)), token=TOKEN)
    client = TestClient(app, raise_server_exceptions=False)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    extra = {"/v1/recommendations/export": [{"target": t} for t in ("kai", "kueue", "volcano", "slurm")]}
    answers = {}
    for path in read_routes(client):
        for params in extra.get(path, [{}]):
            url = path.replace("{team}", "victim")
            answers[(path, str(params))] = client.get(url, params={"days": 1, **params} if "days" not in params
                                                      and path.startswith("/v1") else params, headers=auth)
    answers[("/v1/placement", "")] = client.post("/v1/placement", json={"gpus": 1}, headers=auth)
    assert len(answers) > 20
    broken = {key: (r.status_code, r.text[:200]) for key, r in answers.items() if r.status_code >= 500}
    assert not broken
    costs = client.get("/v1/costs", params={"days": 1}, headers=auth).json()
    victim = next(t for t in costs["teams"] if t["team"] == "victim")
    # each of 28 hostile rows can bill at most a whole GPU for its sampling interval (here 60 s): never millions
    assert victim["gpu_hours"] <= 28 * 60 / 3600 and math.isfinite(costs["total_usd"])
    held = client.get("/v1/gpus", params={"days": 1}, headers=auth).json()["holders"]
    assert "unknown" in {h["gpu_model"] for h in held} and None not in {h["gpu_model"] for h in held}
    by_model = cost_by_team_and_model(hostile_store, NOW - timedelta(days=1), NOW + timedelta(minutes=1), "victim")
    assert "unknown" in set(by_model["gpu_model"]) and by_model["gpu_model"].notna().all()  # its own bill line


def test_rollups_an_older_server_folded_from_hostile_rows_are_bounded_when_the_store_opens(tmp_path):
    """Before ingest bounded rows, the fold summed them: a NULL model line, infinite or million-dollar GPU-seconds.
    Opening the store bounds those rows once, so the bills and answers over them are sane."""
    path = tmp_path / "old.duckdb"
    with Store(path) as store:
        store.set_rates(Config().rates)
        store.append_samples(node_frame(0, NOW - timedelta(hours=2)))
        store.fold(until=NOW - timedelta(minutes=5))
        gpus = node_frame()["gpu_uuid"].to_pylist()
        with store.transaction() as cur:  # what the old fold left for rows of gpu_fraction 1e6, Inf and no model
            for table in ("usage_minute", "usage_hour"):
                cur.execute(f"UPDATE {table} SET gpu_s = 1e7, used_gpu_s = 5e6 WHERE gpu_uuid = $g", {"g": gpus[0]})
                cur.execute(f"UPDATE {table} SET gpu_s = 'inf'::DOUBLE, energy_j = 'inf'::DOUBLE WHERE gpu_uuid = $g",
                            {"g": gpus[1]})
                cur.execute(f"UPDATE {table} SET gpu_model = NULL WHERE gpu_uuid = $g", {"g": gpus[2]})
            cur.execute("DELETE FROM meta WHERE key = 'rollups_bounded'")  # as a store written before
        assert not math.isfinite(cost_by_team(store, NOW - timedelta(days=1), NOW)["cost_usd"].sum())
    with Store(path) as store:
        bill = cost_by_team(store, NOW - timedelta(days=1), NOW)
        assert math.isfinite(bill["cost_usd"].sum())
        assert bill["gpu_hours"].sum() <= 8 * 10 / 3600 + 1e-9  # eight GPUs, one 10 s sample each
        assert store.scalar("SELECT count(*) FROM usage_minute WHERE gpu_model = 'unknown'") == 1
        assert not store.scalar("SELECT count(*) FROM usage_hour WHERE gpu_model IS NULL OR NOT isfinite(gpu_s)")
