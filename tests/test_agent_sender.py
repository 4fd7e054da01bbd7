"""The agent's sender never stops sending and never loses a batch it did not set aside (issue 40, item 7): a 200 that
is not the server's answer is a retry, a refused batch that cannot be written aside stays in the spool, any error
is backed off from, and a batch removed for space while its request was under way counts as dropped only when
that request failed. Against the real server on 127.0.0.1."""
from __future__ import annotations

import errno
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpuledger.collector.agent.agent import Agent
from gpuledger.collector.agent.metrics import AGENT_DROPPED
from gpuledger.collector.agent.spool import Spool
from gpuledger.collector.source import Source
from gpuledger.collector.wire import encode
from tests.ingest_helpers import NOW, batch
from tests.procs import TOKEN, wait_until


class Steps(Source):
    """One 8-GPU node, a sample every 10 s from a minute ago (the step is the spool's sequence number)."""
    name = "steps"

    def collect_step(self, step: int):
        return batch(NOW - timedelta(minutes=5) + timedelta(seconds=10 * step))

    def collect(self):
        return self.collect_step(0)


def login_page_server() -> tuple[ThreadingHTTPServer, str]:
    """What a login proxy in front of the server answers every POST with: 200 and an HTML page."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server API
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            page = b"<html><body>Sign in to continue</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def dropped() -> float:
    return AGENT_DROPPED._value.get()


def test_a_200_that_is_not_the_servers_answer_is_sent_again(tmp_path, central):
    url, store = central
    proxy, proxy_url = login_page_server()
    try:
        spool = Spool(tmp_path / "sp")
        agent = Agent(Steps(), spool, proxy_url, TOKEN, "node-0000", 10.0, max_batches_per_request=2)
        for _ in range(3):
            agent.sample_once()
        assert not agent.drain()  # the proxy's page acknowledges nothing
        assert len(spool.pending()) == 3 and agent.acked == 0
        agent.ingest_url = url + "/v1/ingest"  # the proxy lets the agent through again
        assert agent.drain()
        assert not spool.pending() and agent.acked == 3
        assert store.scalar("SELECT count(*) FROM samples") == 24
    finally:
        proxy.shutdown()


def test_the_sender_outlives_a_full_disk_and_any_error(tmp_path, central, monkeypatch):
    """A batch the server refuses (422) while the disk is full cannot be set aside: it stays in the spool; an
    unexpected error inside the sender is backed off from. Once the disk has room, every batch is delivered or set
    aside, with the sender thread never restarted."""
    url, store = central
    spool = Spool(tmp_path / "sp")
    agent = Agent(Steps(), spool, url, TOKEN, "node-0000", 10.0, max_backoff_s=0.2)
    agent.sample_once()
    spool.put(encode(batch().drop_columns(["gpu_uuid"])), 8)  # a batch the server refuses as invalid
    agent.sample_once()
    full = {"reject": True, "error": True}
    real_reject, real_drain = spool.reject, agent.drain

    def reject(*args: Any) -> None:
        if full["reject"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_reject(*args)

    def drain() -> bool:
        if full["error"]:
            full["error"] = False
            raise RuntimeError("a bug in the sender")
        return real_drain()

    monkeypatch.setattr(spool, "reject", reject)
    monkeypatch.setattr(agent, "drain", drain)
    sender = threading.Thread(target=agent._send_loop, daemon=True)
    sender.start()
    try:
        wait_until(lambda: agent.acked >= 1, 30, "the first batch delivered after the error")
        assert len(spool.pending()) == 2 and sender.is_alive()  # the refused one kept, the one after it waits
        full["reject"] = False  # room again
        wait_until(lambda: not spool.pending(), 30, "the spool drained")
        assert sender.is_alive() and agent.acked == 2
        assert len(list((tmp_path / "sp" / "rejected").glob("*.arrow"))) == 1
        assert store.scalar("SELECT count(*) FROM samples") == 16
    finally:
        agent.stop_event.set()
        agent._wake.set()  # it waits an interval (10 s) after a drain: wake it to see it is stopped
        sender.join(timeout=10)


def test_a_batch_removed_for_space_while_sent_counts_as_dropped_only_if_not_delivered(tmp_path):
    one = encode(batch())
    spool = Spool(tmp_path / "sp", max_bytes=int(len(one) * 2.5))
    spool.put(one, 8)
    before = dropped()
    first = spool.pending()[0]
    with spool.sending([first]) as sent:
        spool.put(one, 8)
        spool.put(one, 8)  # over the bound: the oldest, in flight, is removed
        assert first.seq not in [b.seq for b in spool.pending()]
        sent.delivered = True
    assert dropped() == before  # the request delivered it: nothing was lost
    second = spool.pending()[0]
    with spool.sending([second]):
        spool.put(one, 8)  # removed while in flight, and this request fails
    assert dropped() == before + 1
