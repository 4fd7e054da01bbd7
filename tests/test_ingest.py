"""Central ingest over real HTTP: exactly-once, validation, tokens, and agents fed bad exporter pages."""
from __future__ import annotations

import logging
import math
import re
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
import requests
from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.collector.agent.agent import Agent
from gpuledger.collector.agent.spool import Spool
from gpuledger.collector.dcgm_render import render_page
from gpuledger.collector.samples import SAMPLE_SCHEMA
from gpuledger.collector.simulator import cluster_of
from gpuledger.collector.wire import (
    BATCHES_HEADER,
    INGEST_PATH,
    encode,
    per_batch,
    request_headers,
    stack,
)
from gpuledger.deploy.server import ApiServer

from tests.procs import TOKEN, AgentProc, Server, wait_until

NOW = datetime.now(timezone.utc).replace(microsecond=0)


@pytest.fixture
def central(tmp_path):
    store = Store(tmp_path / "central.duckdb")
    server = ApiServer(store, Config(), port=0, token=TOKEN)
    url = server.start()
    yield url, store
    server.stop()
    store.close()


def batch(when: datetime = NOW) -> pa.Table:
    """One 8-GPU node's samples at `when`."""
    return cluster_of(1).frame([when.timestamp()], 10.0)


def backlog_body(tables: list[pa.Table], first_seq: int) -> pa.Table:
    return stack(enumerate(tables, start=first_seq))


def post(url: str, table: pa.Table | bytes, seq: int, node: str = "node-0000", stream: str = "s1",
         token: str | None = TOKEN) -> requests.Response:
    headers = request_headers(node, stream, seq, 10.0, token=token or None)
    body = table if isinstance(table, bytes) else encode(table)
    return requests.post(url + INGEST_PATH, data=body, headers=headers, timeout=30)


def test_a_resent_batch_is_acknowledged_but_stored_once(central):
    url, store = central
    first = post(url, batch(), seq=0)
    assert first.status_code == 200 and first.json() == {"status": "stored", "rows": 8, "rejected": {},
                                                          "nulled_values": 0}
    again = post(url, batch(), seq=0)
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    assert store.sample_count() == 8
    other_stream = post(url, batch(), seq=0, stream="s2")  # same samples under another id: samples deduplicated
    assert other_stream.json()["rows"] == 0 and other_stream.json()["rejected"] == {"duplicate_sample": 8}
    assert store.sample_count() == 8


def test_duplicate_rows_inside_a_batch_are_stored_once(central):
    url, store = central
    doubled = pa.concat_tables([batch(), batch()])
    body = post(url, doubled, seq=1).json()
    assert body["rows"] == 8 and body["rejected"] == {"duplicate_sample": 8}
    assert store.sample_count() == 8


def test_future_past_and_nan_rows_are_refused_or_nulled_with_a_log_line(central, caplog):
    url, store = central
    good = batch()
    rows = good.to_pylist()
    rows[0]["ts"] = NOW + timedelta(days=2)
    rows[1]["ts"] = NOW - timedelta(days=400)
    rows[2]["util_pct"] = math.nan
    rows[3]["power_w"] = math.inf
    rows[4]["gpu_uuid"] = None
    table = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    with caplog.at_level(logging.WARNING, logger="analytics.ingest"):
        body = post(url, table, seq=2).json()
    assert body["rows"] == 5 and body["nulled_values"] == 2
    assert body["rejected"] == {"future_ts": 1, "stale_ts": 1, "missing_key": 1}
    assert any("future_ts" in r.getMessage() and "NaN/Inf" in r.getMessage() for r in caplog.records)
    stored = store.query("SELECT count(*) FILTER (WHERE util_pct IS NULL) AS u, "
                         "count(*) FILTER (WHERE power_w IS NULL) AS p, count(*) AS n FROM samples")
    assert stored.values.tolist() == [[1, 1, 5]]
    metrics = requests.get(url + "/metrics", timeout=10).text
    assert re.search(r'gpuledger_ingest_rows_rejected_total\{reason="future_ts"\} 1', metrics)


def test_writes_need_the_token_and_a_valid_body(central, tmp_path):
    url, store = central
    assert post(url, batch(), seq=3, token=None).status_code == 401
    assert post(url, batch(), seq=3, token="wrong").status_code == 401
    assert post(url, b"\x00garbage", seq=3).status_code == 422
    assert post(url, batch().drop_columns(["gpu_uuid"]), seq=3).status_code == 422
    assert post(url, batch(), seq=-1).status_code == 422
    assert post(url, batch(), seq=3, node="bad node/../x").status_code == 422
    assert store.sample_count() == 0
    with Store(tmp_path / "other.duckdb") as other:
        closed = ApiServer(other, Config(), port=0)  # started without a token
        other_url = closed.start()
        try:
            refused = post(other_url, batch(), seq=0)
            assert refused.status_code == 403 and "--token" in refused.json()["detail"]
        finally:
            closed.stop()


def test_concurrent_agents_are_group_committed_exactly_once(central, tmp_path):
    url, store = central
    from concurrent.futures import ThreadPoolExecutor
    sim = cluster_of(16)
    frame = sim.frame([NOW.timestamp() - 60], 10.0)
    per_node = [frame.filter(pa.compute.equal(frame["node"], f"node-{i:04d}")) for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: post(url, per_node[i], seq=0, node=f"node-{i:04d}").json(), range(16)))
        resent = list(pool.map(lambda i: post(url, per_node[i], seq=0, node=f"node-{i:04d}").json(), range(16)))
    assert all(r["status"] == "stored" and r["rows"] == 8 for r in results)
    assert all(r["status"] == "duplicate" for r in resent)
    assert store.sample_count() == 128
    nodes = requests.get(url + "/v1/nodes", timeout=10).json()
    assert len(nodes) == 16 and not any(n["stale"] for n in nodes)


def test_a_node_goes_stale_after_three_silent_intervals(central):
    url, _ = central
    table = batch()
    requests.post(url + INGEST_PATH, data=encode(table), timeout=30,
                  headers=request_headers("quiet", "s", 0, interval_s=1.0, token=TOKEN))
    assert requests.get(url + "/v1/nodes", timeout=10).json()[0]["stale"] is False
    time.sleep(3.5)  # three 1 s intervals without a batch
    node = requests.get(url + "/v1/nodes", timeout=10).json()[0]
    assert node["node"] == "quiet" and node["stale"] is True


def test_agent_scraping_bad_dcgm_pages_keeps_going_and_counts(tmp_path, page_server):
    server = Server(tmp_path).start()
    good = render_page(cluster_of(1).frame([NOW.timestamp()], 10.0))
    page_server.body = good
    agent = AgentProc(tmp_path, "dcgm-node", server.url, 0.2,
                      source=["--source", "dcgm", "--dcgm-url", page_server.url]).start()
    try:
        wait_until(lambda: server.nodes().get("dcgm-node", {}).get("rows", 0) >= 16, 60, "good scrapes stored")
        page_server.body = good[: len(good) // 2] + "\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-q\"} NaN\n" \
            "MYSTERY_METRIC 1\n{{{ not prometheus\n"
        wait_until(lambda: 'kind="malformed_line"' in agent.metrics(), 30, "parse errors counted")
        page_server.body = "<html>502 Bad Gateway</html>"
        wait_until(lambda: "returned no GPU samples" in agent.log.read_text(), 30, "empty page logged")
        page_server.body = good
        time.sleep(0.5)
        metrics = agent.metrics()
        assert re.search(r'gpuledger_collector_parse_errors_total\{kind="nan_value"\} [1-9]', metrics)
        assert re.search(r'gpuledger_collector_parse_errors_total\{kind="unknown_metric"\} [1-9]', metrics)
        assert agent.proc.popen.poll() is None  # still running
    finally:
        assert agent.proc.stop() == 0
        server.proc.stop()
    assert agent.spooled() == 0
    (duplicates,) = server.query("SELECT count(*) - count(DISTINCT (gpu_uuid, ts)) FROM samples")[0]
    assert duplicates == 0


def test_spool_survives_reopen_and_never_reuses_a_sequence(tmp_path):
    spool = Spool(tmp_path / "s", max_bytes=25)
    first = spool.put(b"a" * 10, 1)
    spool.put(b"b" * 10, 1)
    assert spool.size() == 20
    spool.put(b"c" * 10, 1)  # over 25 bytes: the oldest goes
    assert spool.size() == 20 and [b.seq for b in spool.pending()] == [1, 2]
    for batch in spool.pending():
        spool.acknowledge(batch)
    assert spool.size() == 0
    first = spool.next_seq - 1
    (tmp_path / "s" / "0000000000000099-1.arrow.tmp").write_bytes(b"half")  # crash mid-write
    again = Spool(tmp_path / "s")
    assert again.stream_id == spool.stream_id and again.next_seq == first + 1
    assert not list((tmp_path / "s").glob("*.tmp"))
    lost = Spool(tmp_path / "fresh")
    assert lost.stream_id != spool.stream_id  # a wiped spool starts a new stream, not old sequence numbers


def test_agent_in_process_rejected_batch_is_kept_aside(tmp_path, central):
    url, _ = central
    spool = Spool(tmp_path / "sp")

    class Broken:
        name = "broken"

        def collect(self):
            return batch().drop_columns(["gpu_uuid"])  # an agent of another version, say

    agent = Agent(Broken(), spool, url, TOKEN, "n1", 1.0)
    agent.sample_once()
    assert agent.drain()
    assert not spool.pending() and len(list((tmp_path / "sp" / "rejected").glob("*.arrow"))) == 1
    reason = next((tmp_path / "sp" / "rejected").glob("*.reason")).read_text()
    assert reason.startswith("422") and "missing column" in reason


def test_a_backlog_travels_in_one_request_with_a_result_per_batch(central):
    url, store = central
    sim = cluster_of(1)
    tables = [sim.frame([NOW.timestamp() - 60 + 10 * k], 10.0) for k in range(3)]
    body = backlog_body(tables, 5)
    post(url, tables[1], seq=6)  # batch 6 already arrived on its own earlier
    headers = request_headers("node-0000", "s1", 5, 10.0, batches=3, token=TOKEN)
    raw = requests.post(url + INGEST_PATH, data=encode(body), headers=headers, timeout=30).json()
    assert raw == {"first_seq": 5, "batches": 3, "rows": [8, 0, 8], "duplicates": [6], "rejected": {},
                   "nulled_values": {}}
    assert [(b["seq"], b["status"], b["rows"]) for b in per_batch(raw)] == [
        (5, "stored", 8), (6, "duplicate", 0), (7, "stored", 8)]
    assert store.sample_count() == 24
    headers[BATCHES_HEADER] = "2"  # body holds seq 7, outside 5..6
    assert requests.post(url + INGEST_PATH, data=encode(body), headers=headers, timeout=30).status_code == 422


def test_samples_stored_by_another_path_or_before_a_restart_are_still_refused(tmp_path):
    """The duplicate check only searches rows no newer than a node's newest stored sample; that mark
    must cover samples the local collector stored and samples stored before the server restarted."""
    sim = cluster_of(1)
    old, new = (sim.frame([NOW.timestamp() - 60 + 10 * k], 10.0) for k in range(2))
    with Store(tmp_path / "c.duckdb") as store:
        store.append_samples(old)  # e.g. `gpuledger serve --source nvml` on the same node
        server = ApiServer(store, Config(), port=0, token=TOKEN)
        url = server.start()
        try:
            assert post(url, old, seq=0).json()["rejected"] == {"duplicate_sample": 8}
            assert post(url, new, seq=1).json()["rows"] == 8
        finally:
            server.stop()
    with Store(tmp_path / "c.duckdb") as store:  # restarted: marks and batch ids come back from the file
        server = ApiServer(store, Config(), port=0, token=TOKEN)
        url = server.start()
        try:
            assert post(url, new, seq=1).json()["status"] == "duplicate"
            both = post(url, pa.concat_tables([old, new, sim.frame([NOW.timestamp() - 40], 10.0)]), seq=2).json()
            assert both["rows"] == 8 and both["rejected"] == {"duplicate_sample": 16}
            assert store.sample_count() == 24
        finally:
            server.stop()


def test_the_wal_is_folded_into_the_file_once_ingest_goes_quiet(tmp_path):
    """No checkpoint inside the commit that crosses DuckDB's 16 MB default; one after a quiet moment."""
    from gpuledger.analytics.store.ingest_writer import IngestWriter
    sim = cluster_of(64)
    frames = [sim.frame([NOW.timestamp() - 3000 + 10 * k], 10.0) for k in range(120)]
    body = backlog_body(frames, 0)
    with Store(tmp_path / "c.duckdb") as store:
        writer = IngestWriter(store, idle_checkpoint_s=2.0)
        try:
            results = writer.submit("big", "s1", 0, 120, 10.0, body)
            assert sum(r.rows for r in results) == body.num_rows == 61_440
            assert store.wal_bytes() > 16 * 1024 * 1024
            wait_until(lambda: store.wal_bytes() == 0, 30, "the idle checkpoint")
        finally:
            writer.stop()
        assert store.sample_count() == 61_440


def test_a_big_backlog_body_is_checked_like_small_ones(central):
    """Bodies of 256+ rows are screened on arrival rather than by the writer; the answers must not differ."""
    url, store = central
    sim = cluster_of(1)
    tables = [sim.frame([NOW.timestamp() - 3000 + 10 * k], 10.0) for k in range(40)]
    rows = tables[3].to_pylist()
    rows[0]["ts"] = NOW + timedelta(days=1)
    rows[1]["util_pct"] = math.nan
    tables[3] = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    tables[5] = pa.concat_tables([tables[5], tables[5].slice(0, 2)])  # two samples sent twice
    body = backlog_body(tables, 100)
    assert body.num_rows >= 256
    headers = request_headers("node-0000", "big", 100, 10.0, batches=40, token=TOKEN)
    answer = per_batch(requests.post(url + INGEST_PATH, data=encode(body), headers=headers, timeout=30).json())
    assert [b["seq"] for b in answer] == list(range(100, 140))
    assert answer[3]["rows"] == 7 and answer[3]["rejected"] == {"future_ts": 1} and answer[3]["nulled_values"] == 1
    assert answer[5]["rows"] == 8 and answer[5]["rejected"] == {"duplicate_sample": 2}
    assert all(b["rows"] == 8 and not b["rejected"] for k, b in enumerate(answer) if k not in (3, 5))
    assert store.sample_count() == 319


def test_two_requests_of_one_node_in_a_group_keep_the_earlier_copy_of_a_sample():
    from gpuledger.analytics.store.ingest_screen import IngestRequest, prepare, screen_group
    sim = cluster_of(1)
    tables = [sim.frame([NOW.timestamp() - 3000 + 10 * k], 10.0) for k in range(40)]
    first = prepare(backlog_body(tables[:35], 0), "node-0000", 0, 35)
    again = prepare(backlog_body(tables[30:], 0), "node-0000", 0, 10)  # its batches 0..4 repeat 30..34
    other = prepare(tables[0], "node-0001", 0, 1)
    requests_ = [IngestRequest(node, "s", 0, count, 10.0, table) for node, table, count in (
        ("node-0000", first, 35), ("node-0000", again, 10), ("node-0001", other, 1))]
    group = screen_group(requests_, NOW, timedelta(minutes=5), timedelta(days=30))
    assert group.count == 46 and group.base == [0, 35, 45]
    kept = {v["values"]: v["counts"] for v in pa.compute.value_counts(group.rows["_batch"]).to_pylist()}
    assert all(kept[b] == 8 for b in range(35)) and all(b not in kept for b in range(35, 40))
    assert all(kept[b] == 8 for b in range(40, 46))
    assert group.received.tolist() == [8] * 46


def test_a_burst_is_gathered_into_row_groups_that_skip_the_wal(tmp_path):
    """Two 70k-row backlog bodies arriving together are committed as one group of over a row group,
    which DuckDB writes straight to the file: the WAL stays small, so there is no checkpoint to pay later."""
    from gpuledger.analytics.store.ingest_writer import IngestWriter
    sim = cluster_of(64)
    frames = [sim.frame([NOW.timestamp() - 5000 + 10 * k], 10.0) for k in range(280)]
    bodies = [backlog_body(frames[:140], 0), backlog_body(frames[140:], 140)]
    with Store(tmp_path / "c.duckdb") as store:
        writer = IngestWriter(store, idle_checkpoint_s=600)
        try:
            pending = [writer.enqueue("big", "s1", 140 * k, 140, 10.0, body) for k, body in enumerate(bodies)]
            stored = sum(r.rows for future in pending for r in future.result(timeout=120))
        finally:
            writer.stop()
        assert stored == 2 * 71_680 == store.sample_count()
        assert store.wal_bytes() < 16 * 1024 * 1024


def test_single_batches_that_queue_while_the_writer_commits_are_committed_together(tmp_path):
    """Steady state: the screener must not split what queues during a commit into a trickle of tiny groups."""
    from gpuledger.analytics.store.ingest_writer import IngestWriter
    sim = cluster_of(21)
    frame = sim.frame([NOW.timestamp() - 60], 10.0)
    with Store(tmp_path / "c.duckdb") as store:
        writer = IngestWriter(store, idle_checkpoint_s=600)
        try:
            with store.transaction():  # the writer is busy: it cannot commit the first request yet
                pending = [writer.enqueue("node-0000", "s1", 0, 1, 10.0, frame.slice(0, 8))]
                wait_until(lambda: writer._queue.empty(), 10, "the first request to be taken")
                pending += [writer.enqueue(f"node-{i:04d}", "s1", 0, 1, 10.0, frame.slice(8 * i, 8))
                            for i in range(1, 21)]
                wait_until(lambda: writer._queue.qsize() >= 19, 10, "the rest to queue")
            stored = sum(r.rows for future in pending for r in future.result(timeout=60))
        finally:
            writer.stop()
        assert stored == 168 == store.sample_count()
        assert store.scalar("SELECT count(DISTINCT received_ts) FROM ingest_runs") == 2  # two commits in all


def test_a_failed_commit_stores_nothing_and_the_agents_retry_is_stored_once(tmp_path, monkeypatch):
    """A DuckDB error mid-transaction (here: injected after the samples are inserted) rolls the whole group
    back, and the batch id is not remembered, so the retry is stored, once; the threads keep serving."""
    import duckdb
    from gpuledger.analytics.store import ingest_writer as ingest
    frame = cluster_of(1).frame([NOW.timestamp() - 60], 10.0)
    record, screen, failures = ingest.IngestWriter._record_batches, ingest.screen_group, []

    def record_fails_once(*args):
        if len(failures) == 0:
            failures.append("commit")
            raise duckdb.IOException("No space left on device (injected)")
        return record(*args)

    def screen_fails_once(*args):
        if len(failures) == 1:
            failures.append("screen")
            raise MemoryError("injected")
        return screen(*args)

    monkeypatch.setattr(ingest.IngestWriter, "_record_batches", staticmethod(record_fails_once))
    monkeypatch.setattr(ingest, "screen_group", screen_fails_once)
    with Store(tmp_path / "c.duckdb") as store:
        writer = ingest.IngestWriter(store, idle_checkpoint_s=600)
        try:
            with pytest.raises(duckdb.IOException):
                writer.submit("n1", "s1", 0, 1, 10.0, frame)
            assert store.sample_count() == 0 and store.scalar("SELECT count(*) FROM ingest_runs") == 0
            with pytest.raises(MemoryError):
                writer.submit("n1", "s1", 0, 1, 10.0, frame)
            assert [r.status for r in writer.submit("n1", "s1", 0, 1, 10.0, frame)] == ["stored"]
            assert [r.status for r in writer.submit("n1", "s1", 0, 1, 10.0, frame)] == ["duplicate"]
        finally:
            writer.stop()
        assert failures == ["commit", "screen"] and store.sample_count() == 8
