"""Fault tests with real processes: the store ends up holding exactly what the agents produced.

Agents run the simulator in replay mode, so batch k of a node is the simulator's sample at
replay_start + k * interval: the truth is recomputed here from the sequence numbers alone.
"""
from __future__ import annotations

import re
import time

import pyarrow.compute as pc
import pytest
import requests

from gpuledger.deploy.cli import simulator_source
from tests.procs import AgentProc, Server, wait_until

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
        for agent in agents:
            assert agent.proc.stop() == 0, agent.proc.text()[-2000:]
        server.proc.stop()
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
        assert agent.proc.stop() == 0, agent.proc.text()[-2000:]
        server.proc.stop()
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
        assert agent.proc.stop() == 0, agent.proc.text()[-2000:]
        server.proc.stop()
    dropped = {int(m) for m in re.findall(r"dropped batch seq (\d+)", agent.log.read_text())}
    assert dropped and min(dropped) == 0  # oldest first
    assert_store_matches(server, agent, start, dropped)
