"""An agent is trusted for its own node's registered GPUs only, and no token bills time that did not pass (issue 40).

Each test pushes what a hostile or broken agent would through the real ingest writer on a real DuckDB file and
checks the invariant on what is stored: per GPU, the time billed over a span is at most the span (plus one
interval); a GPU registered to one node is never billed from another without an admin's move; nothing held is lost.
"""
from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.analytics.config import Config, IngestConfig
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.gpu_inventory import NOT_REGISTERED, ON_OTHER_NODE, SEEDED_KEY
from gpuledger.analytics.store.gpu_time import OVERLAPS
from gpuledger.analytics.store.ingest_screen import InvalidBatch
from gpuledger.analytics.store.ingest_writer import IngestWriter
from gpuledger.collector.samples import rows_to_table
from gpuledger.collector.simulator import cluster_of
from gpuledger.collector.wire import encode, request_headers
from tests.helpers import api_client
from tests.procs import TOKEN


def now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def node_rows(node: int, stamps: list[float], interval: float = 10.0, nodes: int = 2) -> pa.Table:
    """Node `node`'s 8 GPUs at each of `stamps` (epoch seconds), stamped as that node."""
    frame = cluster_of(nodes).frame(stamps, interval)
    return frame.filter(pc.equal(frame["node"], f"node-{node:04d}"))


def one_gpu(table: pa.Table, gpu: str | None = None) -> pa.Table:
    gpu = gpu or table["gpu_uuid"][0].as_py()
    return table.filter(pc.equal(table["gpu_uuid"], gpu))


def gpu_seconds(store: Store, gpu: str | None = None, node: str | None = None) -> float:
    return float(store.scalar("""SELECT coalesce(sum(interval_s), 0) FROM samples
                                 WHERE ($g IS NULL OR gpu_uuid = $g) AND ($n IS NULL OR node = $n)""",
                              {"g": gpu, "n": node}))



def test_rows_of_one_gpu_microseconds_apart_bill_one_interval(writer):
    """1,000 rows of one real GPU a microsecond apart, each claiming 15 s: one interval is billed, not 4 hours."""
    w, store = writer
    start = now() - timedelta(minutes=5)
    base = one_gpu(node_rows(0, [start.timestamp()], 15.0))
    gpu = base["gpu_uuid"][0].as_py()
    rows = base.take(pa.array(np.zeros(1000, np.int64)))
    stamps = pa.array([start + timedelta(microseconds=i) for i in range(1000)], pa.timestamp("us", tz="UTC"))
    rows = rows.set_column(rows.schema.get_field_index("ts"), "ts", stamps)
    (result,) = w.submit("node-0000", "s1", 0, 1, 15.0, rows)
    assert result.rows == 1 and result.rejected == {OVERLAPS: 999}
    assert gpu_seconds(store, gpu) == pytest.approx(15.0)


def test_rows_a_tenth_of_a_second_apart_bill_the_span_they_cover(writer):
    """The 51.7 GPU-hours in 10 minutes: 6,000 rows 0.1 s apart at an honest 15 s interval now bill at most the
    span from the first row to the end of the last (10 minutes and one interval), in any batches."""
    w, store = writer
    start = now() - timedelta(minutes=20)
    gpu_row = one_gpu(node_rows(0, [start.timestamp()], 15.0))
    gpu = gpu_row["gpu_uuid"][0].as_py()
    rows = gpu_row.take(pa.array(np.zeros(6000, np.int64)))
    rows = rows.set_column(rows.schema.get_field_index("ts"), "ts", pa.array(
        [start + timedelta(milliseconds=100 * i) for i in range(6000)], pa.timestamp("us", tz="UTC")))
    for seq, part in enumerate(range(0, 6000, 1500)):  # four pushes: the rule holds across batches
        w.submit("node-0000", "s1", seq, 1, 15.0, rows.slice(part, 1500))
    assert gpu_seconds(store, gpu) <= 600.0 + 15.0 + 1e-6


def test_a_declared_interval_over_the_bound_is_refused_whole(writer):
    w, _ = writer
    with pytest.raises(InvalidBatch, match="over this server's limit of 300 s"):
        w.submit("node-0000", "s1", 0, 1, 86400.0, node_rows(0, [now().timestamp() - 60]))


def test_a_clock_stepping_back_an_hour_bills_no_minute_twice(writer):
    """An honest hour at 10 s, then the agent's clock steps back an hour (a new stream, as after a restart) and it
    samples the hour again 3 s off the first stamps: every GPU's billed time stays the hour."""
    w, store = writer
    start = (now() - timedelta(hours=2)).timestamp()
    hour = [start + 10 * i for i in range(360)]
    w.submit("node-0000", "s1", 0, 1, 10.0, node_rows(0, hour))
    before = gpu_seconds(store)
    assert before == pytest.approx(8 * 3600.0)
    again = node_rows(0, [t + 3 for t in hour])
    (result,) = w.submit("node-0000", "s2", 0, 1, 10.0, again)
    # each repeated instant keeps at most what is left of its interval after the stored one: 3 s of 10 (the last
    # one's 3 s past the hour included) is a sliver, refused
    assert result.rows == 0 and result.rejected == {OVERLAPS: 8 * 360}
    assert gpu_seconds(store) == pytest.approx(before)
    (later,) = w.submit("node-0000", "s2", 1, 1, 10.0, node_rows(0, [start + 3600 + 5]))  # then time goes on
    assert later.rows == 8 and gpu_seconds(store) == pytest.approx(before + 8 * 10.0)


def test_a_late_row_fills_a_gap_and_stops_at_the_next_stored_instant(writer):
    w, store = writer
    t0 = (now() - timedelta(minutes=30)).timestamp()
    gpu = one_gpu(node_rows(0, [t0]))["gpu_uuid"][0].as_py()
    w.submit("node-0000", "s1", 0, 1, 10.0, one_gpu(node_rows(0, [t0, t0 + 60]), gpu))
    (late,) = w.submit("node-0000", "s1", 1, 1, 10.0, one_gpu(node_rows(0, [t0 + 30, t0 + 52]), gpu))
    assert late.rows == 2 and not late.rejected
    intervals = store.query("SELECT epoch(ts) - $t0 AS at, interval_s FROM samples ORDER BY ts", {"t0": t0})
    assert intervals.to_dict("list") == {"at": [0.0, 30.0, 52.0, 60.0], "interval_s": [10.0, 10.0, 8.0, 10.0]}


def test_sharers_of_one_instant_are_one_instant(writer):
    """Two pods on one GPU at one instant (a row each, halves) are both billed; the next sample is not clipped."""
    w, store = writer
    t0 = (now() - timedelta(minutes=10)).timestamp()
    row = one_gpu(node_rows(0, [t0])).to_pylist()[0]
    shared = [dict(row, pod=f"p{i}", gpu_fraction=0.5, allocated=True, team="vision", ts=row["ts"] + timedelta(
        seconds=10 * k)) for k in range(3) for i in range(2)]
    (result,) = w.submit("node-0000", "s1", 0, 1, 10.0, rows_to_table(shared))
    assert result.rows == 6 and not result.rejected
    assert float(store.scalar("SELECT sum(interval_s * gpu_fraction) FROM samples")) == pytest.approx(30.0)


def test_a_node_cannot_squat_another_nodes_gpus_and_the_real_rows_are_kept(tmp_path):
    """node-0001 sends node-0000's GPUs after node-0000 went silent and the server restarted: held, never billed;
    node-0000's own rows go on being stored. An admin who moves one GPU to node-0001 releases its held rows, less
    the time node-0000 already billed of that GPU."""
    with Store(tmp_path / "s.duckdb") as store:
        store.set_rates(Config().rates)
        w = IngestWriter(store, idle_checkpoint_s=600)
        t0 = (now() - timedelta(minutes=40)).timestamp()
        try:
            w.submit("node-0000", "own", 0, 1, 10.0, node_rows(0, [t0 + 10 * i for i in range(6)]))
        finally:
            w.stop()
        w = IngestWriter(store, idle_checkpoint_s=600)  # a restart, 20 minutes of node-0000's silence later
        try:
            squat = node_rows(0, [t0 + 1200 + 10 * i for i in range(3)])
            (held,) = w.submit("node-0001", "evil", 0, 1, 10.0, squat)
            assert held.rows == 0 and held.rejected == {ON_OTHER_NODE: 24}
            assert gpu_seconds(store, node="node-0001") == 0
            (own,) = w.submit("node-0000", "own", 1, 1, 10.0, node_rows(0, [t0 + 1200 + 10 * i for i in range(2)]))
            assert own.rows == 16  # the real node's rows: stored, squatter or not
            assert store.scalar("SELECT count(*) FROM held_samples WHERE node = 'node-0001'") == 24
            gpu = squat["gpu_uuid"][0].as_py()
            moved = w.assign(gpu, "node-0001", "admin-test")
            # node-0000 billed t0+1200 and +1210 of this GPU: those two instants are refused, the third stored
            assert moved["previous_node"] == "node-0000"
            assert moved["released_rows"] == 1 and moved["refused_rows"] == {OVERLAPS: 2}
            assert gpu_seconds(store, gpu) == pytest.approx(60.0 + 20.0 + 10.0)
            (back,) = w.submit("node-0000", "own", 2, 1, 10.0, node_rows(0, [t0 + 1300]))
            assert back.rejected == {ON_OTHER_NODE: 1} and back.rows == 7  # the moved GPU is node-0001's now
        finally:
            w.stop()


def test_invented_gpus_are_held_once_a_nodes_inventory_is_closed(tmp_path):
    with Store(tmp_path / "i.duckdb") as store:
        store.set_rates(Config().rates)
        w = IngestWriter(store, idle_checkpoint_s=600, register_window_s=0.0)
        try:
            t0 = (now() - timedelta(minutes=10)).timestamp()
            w.submit("node-0000", "s1", 0, 1, 10.0, node_rows(0, [t0]))
            before = gpu_seconds(store)
            fake = node_rows(0, [t0 + 10])
            fake = fake.set_column(fake.schema.get_field_index("gpu_uuid"), "gpu_uuid",
                                   pa.array([f"GPU-invented-{i}" for i in range(fake.num_rows)]))
            (result,) = w.submit("node-0000", "s1", 1, 1, 10.0, fake)
            assert result.rows == 0 and result.rejected == {NOT_REGISTERED: 8}
            assert gpu_seconds(store) == before
            assert store.scalar("SELECT count(*) FROM gpu_inventory WHERE node = 'node-0000'") == 8
        finally:
            w.stop()


def test_a_registered_gpu_keeps_its_model(writer):
    w, store = writer
    t0 = (now() - timedelta(minutes=10)).timestamp()
    first = node_rows(0, [t0])
    w.submit("node-0000", "s1", 0, 1, 10.0, first)
    model = first["gpu_model"][0].as_py()
    other = "H200" if model != "H200" else "H100"
    dearer = node_rows(0, [t0 + 10])
    dearer = dearer.set_column(dearer.schema.get_field_index("gpu_model"), "gpu_model",
                               pa.array([other] * dearer.num_rows))
    (result,) = w.submit("node-0000", "s1", 1, 1, 10.0, dearer)
    assert result.rows == 0 and result.rejected == {"model_mismatch": 8}
    assert set(store.query("SELECT DISTINCT gpu_model FROM samples")["gpu_model"]) == {model}


def test_an_older_store_registers_its_gpus_from_its_samples_once(tmp_path):
    path = tmp_path / "old.duckdb"
    t0 = (now() - timedelta(hours=1)).timestamp()
    with Store(path) as store:
        store.append_samples(pa.concat_tables([node_rows(0, [t0]), node_rows(1, [t0])]))
        with store.transaction() as cur:  # as a store written before the inventory existed
            cur.execute("DELETE FROM gpu_inventory")
            cur.execute("DELETE FROM node_inventory")
            cur.execute("DELETE FROM meta WHERE key = ?", [SEEDED_KEY])
    with Store(path) as store:
        registered = store.query("SELECT node, count(*) AS n, min(registered_by) AS how FROM gpu_inventory "
                                 "GROUP BY node ORDER BY node")
        assert registered.to_dict("list") == {"node": ["node-0000", "node-0001"], "n": [8, 8],
                                               "how": ["history", "history"]}
        w = IngestWriter(store, idle_checkpoint_s=600)
        try:  # an upgraded server refuses a squat at once, and a known node's rows are stored as before
            (squat,) = w.submit("node-0001", "s1", 0, 1, 10.0, node_rows(0, [t0 + 10]))
            assert squat.rejected == {ON_OTHER_NODE: 8}
            assert w.submit("node-0000", "s1", 0, 1, 10.0, node_rows(0, [t0 + 10]))[0].rows == 8
        finally:
            w.stop()


def test_the_inventory_and_an_admins_move_over_the_api(tmp_path):
    """GET /v1/nodes/inventory lists the registered GPUs and the held rows; POST /v1/nodes/{node}/gpus needs an
    admin token (an agent's is refused before anything changes), is audited and releases the held rows."""
    with Store(tmp_path / "a.duckdb") as store:
        store.set_rates(Config().rates)
        config = Config(ingest=IngestConfig(register_window_s=0.0))
        w = IngestWriter(store, idle_checkpoint_s=600, **config.ingest.writer_options())
        try:
            with api_client(store, config, ingest_writer=w, token=TOKEN) as client:
                admin = {"Authorization": f"Bearer {TOKEN}"}
                made = client.post("/v1/tokens", json={"name": "n1", "role": "agent:node-0001"}, headers=admin)
                agent = {"Authorization": f"Bearer {made.json()['token']}"}
                t0 = (now() - timedelta(minutes=5)).timestamp()
                w.submit("node-0000", "s", 0, 1, 10.0, node_rows(0, [t0]))
                squat = node_rows(0, [t0 + 30])
                pushed = client.post("/v1/ingest", content=encode(squat),
                                     headers={**request_headers("node-0001", "s", 0, 10.0), **agent})
                assert pushed.status_code == 200 and pushed.json()["rejected"] == {ON_OTHER_NODE: 8}
                listed = client.get("/v1/nodes/inventory", headers=admin).json()
                assert len(listed["gpus"]) == 8 and {h["registered_to"] for h in listed["held"]} == {"node-0000"}
                gpu = squat["gpu_uuid"][0].as_py()
                refused = client.post("/v1/nodes/node-0001/gpus", json={"gpu_uuid": gpu}, headers=agent)
                assert refused.status_code == 403
                unknown = client.post("/v1/nodes/node-0001/gpus", json={"gpu_uuid": "GPU-nobody"}, headers=admin)
                assert unknown.status_code == 404
                moved = client.post("/v1/nodes/node-0001/gpus", json={"gpu_uuid": gpu}, headers=admin)
                assert moved.status_code == 200, moved.text
                assert moved.json()["released_rows"] == 1 and moved.json()["previous_node"] == "node-0000"
                log = client.get("/v1/audit", headers=admin).json()
                done = [e for e in log["entries"] if e["target"] == "/v1/nodes/node-0001/gpus" and e["status"] == 200]
                assert len(done) == 1 and done[0]["detail"]["released_rows"] == 1 and log["intact"]
        finally:
            w.stop()


def test_a_made_up_token_is_refused_before_any_body_is_read(tmp_path):
    """A 6 MiB topology (or ingest) body with a made-up bearer: the 401 comes back with only the headers sent (the
    server never waited for the body), and the refusal is in the audit log."""
    import socket

    from gpuledger.deploy.server import ApiServer
    with Store(tmp_path / "p.duckdb") as store:
        server = ApiServer(store, Config(), port=0, token=TOKEN)
        url = server.start()
        try:
            host, port = url.removeprefix("http://").split(":")
            for path in ("/v1/topology", "/v1/ingest"):
                with socket.create_connection((host, int(port)), timeout=10) as conn:
                    conn.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  f"Authorization: Bearer glt_made_up_{'x' * 40}\r\n"
                                  f"Content-Length: {6 * 1024 * 1024 - 1}\r\n\r\n").encode())
                    answer = b""  # no body byte was sent: only an answer before it can come back
                    while chunk := conn.recv(4096):
                        answer += chunk
                    answer = answer.decode()
                assert answer.startswith("HTTP/1.1 401"), answer
                assert "unknown or revoked token" in answer
            server.app.state.audit.flush()
            refused = store.query("SELECT target, status FROM audit_log WHERE status = 401 ORDER BY seq")
            assert list(refused["target"]) == ["/v1/topology", "/v1/ingest"]
        finally:
            server.stop()


def test_a_claim_of_a_job_its_scheduler_places_elsewhere_is_taken_off(writer):
    """node-0001 attaches its GPUs to vision's real job, which kube-state-metrics places on node-0000 (and a Slurm
    job on gpu-[01-02]): the rows keep their GPU-time, unattributed, and the job keeps only its own node's GPUs."""
    import pandas as pd

    from gpuledger.analytics.store.job_claims import expand_nodes
    w, store = writer
    t0 = (now() - timedelta(minutes=10)).timestamp()
    store.upsert_jobs(pd.DataFrame([
        {"job_id": "vision/train-0", "team": "vision", "namespace": "vision", "pod": "train-0", "node": "node-0000",
         "gpus": 8, "state": "running", "source": "kube-state"},
        {"job_id": "4242", "team": "nlp", "node": "node-[0000-0000]", "gpus": 8, "state": "running",
         "source": "sacct"}]))

    def claiming(node: int, job: str, team: str) -> pa.Table:
        rows = node_rows(node, [t0]).to_pylist()
        return rows_to_table([dict(r, job_id=job, team=team, namespace=team, pod="train-0", allocated=True)
                              for r in rows])

    assert w.submit("node-0000", "s", 0, 1, 10.0, claiming(0, "vision/train-0", "vision"))[0].rows == 8
    (stolen,) = w.submit("node-0001", "s", 0, 1, 10.0, claiming(1, "vision/train-0", "vision"))
    (slurm,) = w.submit("node-0001", "s", 1, 1, 10.0, claiming(1, "4242", "nlp").set_column(
        0, "ts", pa.array([datetime.fromtimestamp(t0 + 10, timezone.utc)] * 8, pa.timestamp("us", tz="UTC"))))
    assert stolen.rows == 8 and slurm.rows == 8  # stored: the GPUs are node-0001's own
    billed = store.query("SELECT node, job_id, team, count(*) AS n FROM samples GROUP BY ALL ORDER BY node, job_id")
    assert billed.astype(object).where(billed.notna(), None).to_dict("records") == [
        {"node": "node-0000", "job_id": "vision/train-0", "team": "vision", "n": 8},
        {"node": "node-0001", "job_id": None, "team": None, "n": 16}]
    assert expand_nodes("gpu-[01-02,07],login1") == {"gpu-01", "gpu-02", "gpu-07", "login1"}


def test_the_nodes_page_shows_held_rows(tmp_path, monkeypatch):
    """A squat is visible where an admin looks: the Nodes page names the GPU, the node that sent it, where it is
    registered and the GPU-hours held (Streamlit's AppTest over a real server: no exception, no error box)."""
    from gpuledger.deploy.server import ApiServer
    from tests.test_dashboard_live import app_on
    with Store(tmp_path / "d.duckdb") as store:
        store.set_rates(Config().rates)
        server = ApiServer(store, Config(), port=0, open_reads=True)
        url = server.start()
        try:
            t0 = (now() - timedelta(minutes=20)).timestamp()
            server.ingest.submit("node-0000", "s", 0, 1, 10.0, node_rows(0, [t0, t0 + 10]))
            server.ingest.submit("node-0001", "s", 0, 1, 10.0, node_rows(0, [t0 + 20]))
            at = app_on(monkeypatch, url, "Nodes")
            warnings = [w.value for w in at.warning]
            assert any("8 GPU(s) sent by a node they are not registered to" in w for w in warnings), warnings
            held = next(df.value for df in at.dataframe if "Sent by" in df.value.columns)
            assert set(held["Sent by"]) == {"node-0001"} and set(held["Registered to"]) == {"node-0000"}
        finally:
            server.stop()


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 1), st.integers(0, 600), st.integers(1, 40),
                          st.integers(1, 3)), min_size=1, max_size=60))
def test_no_two_kept_spans_of_one_gpu_overlap(instants):
    """Any rows (GPU, MIG instance, start in s, interval in s, sharers): what conserve keeps of one GPU and MIG
    instance never overlaps, no row gains time, and a lone row is kept whole."""
    from gpuledger.analytics.store.gpu_time import conserve
    t0 = now() - timedelta(hours=1)
    rows = [{"ts": t0 + timedelta(seconds=start), "interval_s": float(length), "node": "n1", "gpu_uuid": f"GPU-{g}",
             "mig_instance": None if m < 0 else m, "gpu_fraction": 1.0 / sharers, "pod": f"p{i}-{k}"}
            for i, (g, m, start, length, sharers) in enumerate(instants) for k in range(sharers)]
    declared = {r["pod"]: r["interval_s"] for r in rows}
    kept = conserve(rows_to_table(rows)).rows.to_pylist()
    billed: dict[tuple, dict] = {}  # per GPU and MIG instance, per instant: the longest interval kept
    for row in kept:
        assert row["interval_s"] <= declared[row["pod"]] + 1e-9  # clipping never adds time to a row
        per = billed.setdefault((row["gpu_uuid"], row["mig_instance"]), {})
        per[row["ts"]] = max(per.get(row["ts"], 0.0), row["interval_s"])
    by_gpu: dict[tuple, list] = {}
    for r in rows:
        by_gpu.setdefault((r["gpu_uuid"], r["mig_instance"]), []).append(
            (r["ts"].timestamp(), r["ts"].timestamp() + r["interval_s"]))
    for key, spans in by_gpu.items():  # what is billed of a GPU is at most the time its rows' spans cover
        spans.sort()
        union, reach = 0.0, -math.inf
        for lo, hi in spans:
            union += max(0.0, hi - max(lo, reach))
            reach = max(reach, hi)
        assert sum(billed.get(key, {}).values()) <= union + 1e-6, (key, billed.get(key), spans)
    alone = {(g, m) for g, m, *_ in instants}
    for g, m in alone:
        mine = [i for i in instants if (i[0], i[1]) == (g, m)]
        if len(mine) == 1:
            assert (f"GPU-{g}", None if m < 0 else m) in billed


def test_a_pools_agents_bill_only_the_teams_the_config_names(tmp_path):
    """[pool_teams]: node-0000 is in pool "vision-owned", whose agents may bill vision only; its rows naming nlp
    keep their GPU-time as the node's unattributed use, node-0001 (no such pool) bills whom it says."""
    from gpuledger.analytics.config import load_config
    site = tmp_path / "site.toml"
    site.write_text('[node_pools.nodes]\nvision-owned = ["node-0000"]\n\n[pool_teams]\nvision-owned = ["vision"]\n')
    config = load_config(site)
    assert config.pool_teams == {"vision-owned": ("vision",)}
    with Store(tmp_path / "p.duckdb") as store:
        config.price(store)
        w = IngestWriter(store, idle_checkpoint_s=600, pool_teams=config.pool_teams)
        try:
            t0 = (now() - timedelta(minutes=10)).timestamp()
            for node in (0, 1):
                rows = node_rows(node, [t0]).to_pylist()
                claimed = [dict(r, team="nlp" if i % 2 else "vision", allocated=True, job_id=f"j{i}")
                           for i, r in enumerate(rows)]
                assert w.submit(f"node-{node:04d}", "s", 0, 1, 10.0, rows_to_table(claimed))[0].rows == 8
        finally:
            w.stop()
        billed = store.query("SELECT node, coalesce(team, '-') AS team, count(*) AS n FROM samples GROUP BY ALL "
                             "ORDER BY ALL").to_dict("records")
    assert billed == [{"node": "node-0000", "team": "-", "n": 4}, {"node": "node-0000", "team": "vision", "n": 4},
                      {"node": "node-0001", "team": "nlp", "n": 4}, {"node": "node-0001", "team": "vision", "n": 4}]
    bad = tmp_path / "bad.toml"
    bad.write_text('[pool_teams]\nnowhere = ["vision"]\n')
    with pytest.raises(Exception, match="no node is in that pool"):
        load_config(bad)


def test_a_gpu_bills_nothing_from_before_it_was_registered(writer):
    """Made-up GPUs registered in a node's first minutes, then rows of them dated a day back: held as
    before_registration, never billed (an honest spool backlog is the oldest rows of the first push, so it
    registers the GPU from there)."""
    w, store = writer
    t0 = (now() - timedelta(minutes=5)).timestamp()
    backlog = node_rows(0, [t0 - 3600 + 10 * i for i in range(3)])  # an hour old: spooled while the server was away
    assert w.submit("node-0000", "s", 0, 1, 10.0, backlog)[0].rows == 24
    assert w.submit("node-0000", "s", 1, 1, 10.0, node_rows(0, [t0]))[0].rows == 8
    (early,) = w.submit("node-0000", "s", 2, 1, 10.0, node_rows(0, [t0 - 86400]))
    assert early.rows == 0 and early.rejected == {"before_registration": 8}
    (late,) = w.submit("node-0000", "s", 3, 1, 10.0, node_rows(0, [t0 - 3600 - 1800]))  # within the 2 h grace
    assert late.rows == 8
    assert store.scalar("SELECT count(*) FROM held_samples WHERE held_reason = 'before_registration'") == 8


def test_a_row_dated_ahead_bills_no_further_than_the_clock_skew_allowed(writer):
    """A row 280 s ahead of the server's clock claiming 601 s (within 2 x 300 + 1 s of its request): it bills to
    the edge of the 300 s skew allowed, not 10 minutes of time that has not passed; and that time is not billed
    again when it comes."""
    w, store = writer
    ahead = now() + timedelta(seconds=280)
    rows = one_gpu(node_rows(0, [ahead.timestamp()], 601.0))
    (result,) = w.submit("node-0000", "s", 0, 1, 300.0, rows)
    assert result.rows + sum(result.rejected.values()) == 1
    assert gpu_seconds(store) <= 20.0 + 2.0  # at most from +280 s to +300 s (a sliver of 601 s is refused whole)
    honest = one_gpu(node_rows(0, [(now() + timedelta(seconds=20)).timestamp()]))  # a clock 20 s fast: billed
    assert w.submit("node-0001", "s", 0, 1, 10.0, honest.set_column(
        honest.schema.get_field_index("gpu_uuid"), "gpu_uuid", pa.array(["GPU-skewed"])))[0].rows == 1


def test_a_gpu_moved_there_and_back_keeps_its_model_and_moves_only_to_a_node_that_reports(writer):
    from gpuledger.collector.errors import NotFoundError
    w, store = writer
    t0 = (now() - timedelta(minutes=10)).timestamp()
    first = node_rows(0, [t0])
    w.submit("node-0000", "s", 0, 1, 10.0, first)
    w.submit("node-0001", "s", 0, 1, 10.0, node_rows(1, [t0]))
    gpu, model = first["gpu_uuid"][0].as_py(), first["gpu_model"][0].as_py()
    with pytest.raises(NotFoundError, match="no agent has pushed as node 'node-nope'"):
        w.assign(gpu, "node-nope", "admin")
    assert w.assign(gpu, "node-0001", "admin")["gpu_model"] == model
    assert w.assign(gpu, "node-0000", "admin")["gpu_model"] == model  # and back: still the model it has
    dearer = one_gpu(node_rows(0, [now().timestamp() + 1]), gpu)  # (it bills again from the move back)
    dearer = dearer.set_column(dearer.schema.get_field_index("gpu_model"), "gpu_model",
                               pa.array(["H200" if model != "H200" else "H100"]))
    assert w.submit("node-0000", "s", 1, 1, 10.0, dearer)[0].rejected == {"model_mismatch": 1}
    both = pa.concat_tables([one_gpu(node_rows(0, [t0 - 3 * 3600]), gpu), dearer.set_column(
        0, "ts", pa.array([now() + timedelta(seconds=2)], pa.timestamp("us", tz="UTC")))])
    (mixed,) = w.submit("node-0000", "s", 2, 1, 10.0, both)  # held and mismatched rows in one push
    assert mixed.rejected == {"before_registration": 1, "model_mismatch": 1}


def test_a_node_that_reports_its_hardware_bills_only_those_gpus(tmp_path):
    """POST /v1/topology is the node's own hardware report: its GPUs are registered to it, and from then on a row
    naming any other GPU is held, even in the node's first minutes (no invented UUIDs beside real ones)."""
    from gpuledger.collector.topology import NodeTopology, GpuPlace
    with Store(tmp_path / "h.duckdb") as store:
        store.set_rates(Config().rates)
        w = IngestWriter(store, idle_checkpoint_s=600)
        try:
            with api_client(store, Config(), ingest_writer=w, token=TOKEN) as client:
                admin = {"Authorization": f"Bearer {TOKEN}"}
                agent = {"Authorization": "Bearer " + client.post(
                    "/v1/tokens", json={"name": "n0", "role": "agent:node-0000"}, headers=admin).json()["token"]}
                rows = node_rows(0, [(now() - timedelta(minutes=2)).timestamp()])
                real = rows["gpu_uuid"].to_pylist()
                report = NodeTopology("node-0000", "nvml", "measured", tuple(
                    GpuPlace(uuid, i, rows["gpu_model"][0].as_py(), i) for i, uuid in enumerate(real[:4])))
                assert client.post("/v1/topology", json=report.to_json(), headers=agent).status_code == 200
                registered = client.get("/v1/nodes/inventory", headers=admin).json()["gpus"]
                assert {g["gpu_uuid"] for g in registered} == set(real[:4])
                assert {g["registered_by"] for g in registered} == {"hardware-report"}
                (result,) = w.submit("node-0000", "s", 0, 1, 10.0, rows)  # 4 reported GPUs, 4 it never reported
                assert result.rows == 4 and result.rejected == {"gpu_not_in_inventory": 4}
        finally:
            w.stop()
