"""Fault tests with real processes: the store ends up holding exactly what the agents produced.

Agents run the simulator in replay mode, so batch k of a node is the simulator's sample at
replay_start + k * interval: the truth is recomputed here from the sequence numbers alone.
"""
from __future__ import annotations

import json
import re
import time

import pyarrow.compute as pc
import pytest
import requests

from gpuledger.collector.samples import ADDED_COLUMNS
from gpuledger.collector.wire import encode
from gpuledger.deploy.cli import simulator_source
from tests.procs import AgentProc, Server, fill_up, small_filesystem, stop_all, wait_until

INTERVAL = 0.2


def truth(node: str, replay_start: float, steps: list[int]) -> tuple[int, float]:
    """Rows and utilisation sum the agent produced for these steps."""
    source = simulator_source(INTERVAL, node, replay_start)
    rows, total = 0, 0.0
    for step in steps:
        table = source.collect_step(step)
        rows += table.num_rows
        total += pc.sum(table["util_pct"]).as_py() or 0.0
    return rows, total


def assert_store_matches(server: Server, agent: AgentProc, replay_start: float, dropped: set[int] = frozenset()):
    produced = agent.state()["next_seq"]
    assert produced > 0 and agent.spooled() == 0, f"{agent.spooled()} batch(es) still spooled"
    steps = [k for k in range(produced) if k not in dropped]
    rows, util = truth(agent.node, replay_start, steps)
    got_rows, got_util, distinct = server.query(
        f"SELECT count(*), sum(util_pct), count(DISTINCT (gpu_uuid, ts)) FROM samples WHERE node = '{agent.node}'")[0]
    assert got_rows == rows == len(steps) * 8
    assert distinct == got_rows, "duplicate samples stored"
    assert got_util == pytest.approx(util, rel=1e-9)
    (batches,) = server.query(
        f"SELECT sum(last_seq - first_seq + 1) FROM ingest_runs WHERE node = '{agent.node}'")[0]
    assert batches == len(steps)


def acked_rows(server: Server, node: str) -> int:
    try:
        return server.nodes().get(node, {}).get("rows", 0)
    except requests.RequestException:
        return 0


def test_server_killed_and_stopped_mid_stream_loses_and_duplicates_nothing(tmp_path):
    server = Server(tmp_path).start()
    start = time.time() - 30
    agents = [AgentProc(tmp_path, f"node-000{i}", server.url, INTERVAL, start).start() for i in range(2)]
    try:
        wait_until(lambda: all(acked_rows(server, a.node) >= 40 for a in agents), 60, "first batches stored")
        server.proc.kill9()  # mid-stream: some batch is in flight or half-committed
        wait_until(lambda: all(a.spooled() >= 3 for a in agents), 30, "spools to grow while the server is dead")
        server.start()
        wait_until(lambda: all(a.spooled() <= 2 for a in agents), 60, "spools to drain after restart")
        assert server.proc.stop() == 0  # a clean stop for a while, then back
        time.sleep(1.5)
        assert all(a.spooled() >= 3 for a in agents)
        server.start()
        wait_until(lambda: all(a.spooled() <= 2 for a in agents), 60, "spools to drain again")
        retried = agents[0].metrics()
        assert re.search(r'gpuledger_agent_batches_retried_total\{reason="unreachable"\} [1-9]', retried)
        assert "gpuledger_agent_spool_bytes" in retried
    finally:
        codes = stop_all(*(agent.proc for agent in agents), server.proc)
    for agent, code in zip(agents, codes):
        assert code == 0, agent.proc.text()[-2000:]
    for agent in agents:
        assert_store_matches(server, agent, start)


def test_agent_killed_mid_stream_replays_its_spool(tmp_path):
    server = Server(tmp_path).start()
    start = time.time() - 30
    agent = AgentProc(tmp_path, "node-0002", server.url, INTERVAL, start).start()
    try:
        wait_until(lambda: acked_rows(server, agent.node) >= 40, 60, "first batches stored")
        agent.proc.kill9()
        before = agent.state()["next_seq"]
        agent.start()  # same spool: same stream id, continues the sequence, replays what was unsent
        wait_until(lambda: agent.state()["next_seq"] >= before + 10, 60, "restarted agent to produce more")
        starts = [int(n) for n in re.findall(r"next seq (\d+), \d+ waiting", agent.proc.text())]
        assert len(starts) == 2 and starts[1] >= before  # the sequence continued, it did not restart
    finally:
        codes = stop_all(agent.proc, server.proc)
    assert codes[0] == 0, agent.proc.text()[-2000:]
    assert_store_matches(server, agent, start)


def test_full_spool_drops_oldest_counted_and_the_rest_arrives(tmp_path):
    server = Server(tmp_path)  # not started yet: the agent can only spool
    start = time.time() - 30
    agent = AgentProc(tmp_path, "node-0003", server.url, INTERVAL, start, spool_max_mb=0.01).start()
    try:
        wait_until(lambda: "dropped batch seq" in agent.log.read_text(), 60, "the spool to overflow")
        assert re.search(r"gpuledger_agent_batches_dropped_total [1-9]", agent.metrics())
        server.start()
        wait_until(lambda: agent.spooled() <= 2, 60, "spool to drain")
    finally:
        codes = stop_all(agent.proc, server.proc)
    assert codes[0] == 0, agent.proc.text()[-2000:]
    dropped = {int(m) for m in re.findall(r"dropped batch seq (\d+)", agent.log.read_text())}
    assert dropped and min(dropped) == 0  # oldest first
    assert_store_matches(server, agent, start, dropped)


def metric(text: str, name: str) -> float:
    """The sum of a Prometheus counter's samples in a /metrics page (0 when absent)."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_server_killed_inside_a_group_commit_loses_and_duplicates_nothing(tmp_path):
    """kill -9 while a group's rows are inserted but not committed (a failpoint holds the commit open): the
    group is rolled back by DuckDB's recovery, the agents resend it, and it is stored once."""
    server = Server(tmp_path).start(env={"GPULEDGER_FAILPOINTS": "group_commit=5"})
    start = time.time() - 30
    agents = [AgentProc(tmp_path, f"node-000{i}", server.url, INTERVAL, start).start() for i in range(2)]
    try:
        wait_until(lambda: "failpoint group_commit: pausing" in server.proc.text(), 60, "a commit held open")
        server.proc.kill9()
        server.start()  # no failpoint now
        wait_until(lambda: all(a.spooled() <= 2 and acked_rows(server, a.node) >= 40 for a in agents), 60,
                   "spools to drain after the restart")
    finally:
        codes = stop_all(*(agent.proc for agent in agents), server.proc)
    for agent, code in zip(agents, codes):
        assert code == 0, agent.proc.text()[-2000:]
    for agent in agents:
        assert_store_matches(server, agent, start)


def test_a_full_database_disk_defers_pushes_and_loses_nothing(tmp_path):
    """The database's filesystem runs out of space: commits fail, pushes are answered 503 and counted, nothing is
    half-stored; once space is back the agents' spools drain and every batch is stored once."""
    with small_filesystem(tmp_path / "dbfs", "8m") as fs:
        server = Server(tmp_path, db=fs / "central.duckdb").start()
        start = time.time() - 30
        agent = AgentProc(tmp_path, "node-0004", server.url, INTERVAL, start).start()
        try:
            wait_until(lambda: acked_rows(server, agent.node) >= 40, 60, "first batches stored")
            filler = fill_up(fs)
            wait_until(lambda: "server answered 503" in agent.log.read_text(), 60, "a push answered 503")
            wait_until(lambda: agent.spooled() >= 5, 60, "the agent to keep its batches")
            page = requests.get(server.url + "/metrics", timeout=10).text
            assert metric(page, "gpuledger_ingest_requests_deferred_total") >= 1
            assert 'reason="disk_full"' in page
            assert "No space left on device" in server.proc.text() and "agents will resend" in server.proc.text()
            assert requests.get(server.url + "/healthz", timeout=10).ok  # reads go on
            filler.unlink()
            wait_until(lambda: agent.spooled() <= 2, 90, "the spool to drain once space is back")
        finally:
            assert agent.proc.stop() == 0, agent.proc.text()[-2000:]
            server.proc.stop()
        assert_store_matches(server, agent, start)


def test_a_full_spool_disk_holds_batches_in_memory_and_loses_nothing(tmp_path):
    """The agent's spool filesystem is full: batches are held in memory, logged and counted, sent once the server
    is back, and spooled to disk again once space is; every batch is stored once."""
    with small_filesystem(tmp_path / "spoolfs", "1m") as fs:
        server = Server(tmp_path)  # down at first: the full disk and an outage together
        start = time.time() - 30
        agent = AgentProc(tmp_path, "node-0005", server.url, INTERVAL, start, spool=fs / "spool").start()
        try:
            wait_until(lambda: (fs / "spool" / "state.json").exists(), 30, "the spool to exist")
            filler = fill_up(fs)
            wait_until(lambda: "held in memory" in agent.log.read_text(), 60, "a batch held in memory")
            wait_until(lambda: metric(agent.metrics(), "gpuledger_agent_batches_held_in_memory_total") >= 5, 60,
                       "batches held while the server is down")
            server.start()
            held = metric(agent.metrics(), "gpuledger_agent_batches_held_in_memory_total")
            wait_until(lambda: acked_rows(server, agent.node) >= 8 * held, 60, "the held batches to arrive")
            filler.unlink()
            wait_until(lambda: agent.spooled() >= 1 or acked_rows(server, agent.node) >= 8 * (held + 20), 60,
                       "batches spooled to disk again")
        finally:
            assert agent.proc.stop() == 0, agent.proc.text()[-2000:]
            server.proc.stop()
        assert "Traceback" not in agent.log.read_text()
        assert_store_matches(server, agent, start)


def test_a_spool_written_by_an_older_agent_is_replayed(tmp_path):
    """An agent upgraded over a spool its older version wrote (batches without the columns added since, a state
    file without padding) sends them all; the server stores them with nulls there, once."""
    start = time.time() - 60
    node = "node-0006"
    spool = tmp_path / f"spool-{node}"
    spool.mkdir()
    source = simulator_source(INTERVAL, node, start)
    for seq in range(25):
        old = source.collect_step(seq)
        old = old.drop_columns([c for c in old.column_names if c in ADDED_COLUMNS])
        (spool / f"{seq:016d}-{old.num_rows}.arrow").write_bytes(encode(old))
    (spool / "state.json").write_text(json.dumps({"stream_id": "0ld5tream", "next_seq": 25}))
    server = Server(tmp_path).start()
    agent = AgentProc(tmp_path, node, server.url, INTERVAL, start).start()
    try:
        wait_until(lambda: acked_rows(server, node) >= 8 * 40, 60, "the old batches and new ones stored")
    finally:
        codes = stop_all(agent.proc, server.proc)
    assert codes[0] == 0, agent.proc.text()[-2000:]
    assert "replaying 25 unacknowledged batch(es) from seq 0" in agent.log.read_text()
    assert_store_matches(server, agent, start)
    (nulls,) = server.query(f"SELECT count(*) FROM samples WHERE node = '{node}' AND xid IS NULL "
                            f"AND nvlink_bps IS NULL AND ts < to_timestamp({start + 25 * INTERVAL})")[0]
    assert nulls == 25 * 8
