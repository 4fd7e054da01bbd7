"""`gpuledger agent`: sample this node, spool each batch to disk, push it to the central server.

Two threads: the sampler reads the Source on its interval and puts each batch in the spool;
the sender drains the spool oldest-first and removes a batch only when the server has
acknowledged it. A server that is down or slow therefore never delays sampling: the spool
grows (bounded) and drains when the server is back, in order.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import requests

from gpuledger.collector.agent.metrics import (
    AGENT_BATCHES_ACKED,
    AGENT_BATCHES_SENT,
    AGENT_LAST_ACK,
    AGENT_REJECTED,
    AGENT_RETRIES,
)
from gpuledger.collector.agent.spool import Spool, SpooledBatch
from gpuledger.collector.metrics import SCRAPE_ERRORS
from gpuledger.collector.source import TOPOLOGY_EVERY_S, Source, SourceError
from gpuledger.collector.topology import TOPOLOGY_PATH
from gpuledger.collector.wire import (INGEST_PATH, STORED, WireError, decode, encode, read_answer, request_headers,
                                     stack)

log = logging.getLogger(__name__)
# a backlog travels in requests of up to an hour of 10 s batches (~3k rows, ~0.5 MB for 8 GPUs): per-request
# costs are paid once per hour of backlog, and 128 such bodies in flight still fit easily in the server's memory
MAX_BATCHES_PER_REQUEST = 360


class Agent:
    def __init__(self, source: Source, spool: Spool, server_url: str, token: str, node: str,
                 interval_s: float, timeout_s: float = 30.0, max_backoff_s: float = 30.0,
                 max_batches_per_request: int = MAX_BATCHES_PER_REQUEST, ca: str | Path | None = None) -> None:
        """`ca`: the CA certificate an https:// server is verified against (else the system's CAs)."""
        self.max_batches_per_request = max_batches_per_request
        self.source = source
        self.spool = spool
        self.ingest_url = server_url.rstrip("/") + INGEST_PATH
        self.token = token
        self.node = node
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.session = requests.Session()
        # per request, not on the session: requests lets $REQUESTS_CA_BUNDLE override a session's `verify`
        self.verify: str | bool = str(ca) if ca else True
        self.topology_url = server_url.rstrip("/") + TOPOLOGY_PATH
        self.topology_due = 0.0  # monotonic time the node's topology is next read (at the first send)
        self._topology_sent: dict[str, str] = {}  # node -> digest the server acknowledged
        self.stop_event = threading.Event()
        self._wake = threading.Event()
        self.produced = 0
        self.acked = 0
        self._threads = [threading.Thread(target=self._sample_loop, name="agent-sampler", daemon=True),
                         threading.Thread(target=self._send_loop, name="agent-sender", daemon=True)]

    # --- sampling ------------------------------------------------------------------------
    def sample_once(self) -> int | None:
        step = self.spool.next_seq
        try:
            table = self.source.collect_step(step)
        except SourceError as exc:
            log.warning("%s", exc)
            return None
        if table.num_rows == 0:
            return None  # the server stamps the node from the request's node header, so the batch goes as read
        seq = self.spool.put(encode(table), table.num_rows)
        self.produced += 1
        self._wake.set()
        return seq

    def _sample_loop(self) -> None:
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            try:
                self.sample_once()
            except Exception:
                SCRAPE_ERRORS.labels(source="agent", reason="unexpected").inc()
                log.exception("sampling failed")
            next_at += self.interval_s
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))

    # --- sending -------------------------------------------------------------------------
    def _post(self, first_seq: int, count: int, data: bytes) -> requests.Response | None:
        AGENT_BATCHES_SENT.inc(count)
        headers = request_headers(self.node, self.spool.stream_id, first_seq, self.interval_s, count, self.token)
        try:
            return self.session.post(self.ingest_url, data=data, headers=headers, timeout=self.timeout_s,
                                     verify=self.verify)
        except requests.exceptions.SSLError as exc:
            AGENT_RETRIES.labels(reason="tls").inc()
            log.warning("server's certificate not accepted (%s; --ca names the CA to trust); %d batch(es) spooled",
                        _reason(exc), len(self.spool.pending()))
            return None
        except requests.RequestException as exc:
            AGENT_RETRIES.labels(reason="unreachable").inc()
            log.warning("server unreachable (%s); %d batch(es) spooled", type(exc).__name__,
                        len(self.spool.pending()))
            return None

    def _acknowledged(self, batch: SpooledBatch, answer: dict) -> None:
        self.spool.acknowledge(batch)
        self.acked += 1
        AGENT_BATCHES_ACKED.labels(outcome=answer.get("status", STORED)).inc()
        AGENT_LAST_ACK.set(time.time())
        if answer.get("rejected"):
            log.warning("server refused rows of batch %d: %s", batch.seq, answer["rejected"])

    def _delivered(self, batches: list[SpooledBatch], response: requests.Response) -> bool:
        """A 200's answer taken batch by batch; a 200 whose body is not the server's answer (a login proxy's page,
        a cut-off body) is a retry: nothing is acknowledged on it."""
        answers = read_answer(response.content, batches[0].seq, len(batches))
        if answers is None:
            AGENT_RETRIES.labels(reason="bad_answer").inc()
            log.warning("a 200 for batches %d..%d that is not the server's answer (%s: %r); kept, sent again",
                        batches[0].seq, batches[-1].seq, response.headers.get("content-type", "no type"),
                        response.content[:120])
            return False
        for batch, answer in zip(batches, answers):
            self._acknowledged(batch, answer)
        return True

    def _set_aside(self, batch: SpooledBatch, response: requests.Response) -> bool:
        """A batch the server refused as invalid, moved aside once that is written; kept (and sent again later)
        when it cannot be (a full disk): never dropped before it is kept somewhere."""
        try:
            self.spool.reject(batch, f"{response.status_code}: {response.text[:2000]}")
        except OSError as exc:
            AGENT_RETRIES.labels(reason="reject_unwritable").inc()
            log.error("server rejected batch %d (%d) and it cannot be set aside (%s); kept in the spool",
                      batch.seq, response.status_code, exc)
            return False
        AGENT_REJECTED.inc()
        log.error("server rejected batch %d as invalid (%d): %s; kept in %s/rejected", batch.seq,
                  response.status_code, response.text[:300], self.spool.dir)
        return True

    def _retry_later(self, response: requests.Response, what: str) -> bool:
        AGENT_RETRIES.labels(reason=f"http_{response.status_code}").inc()
        level = logging.ERROR if response.status_code in (401, 403) else logging.WARNING
        log.log(level, "server answered %d for %s: %s", response.status_code, what, response.text[:300])
        return False

    def send(self, batch: SpooledBatch) -> bool:
        """Push one spooled batch; True when the spool may move on to the next one."""
        data = self.spool.read(batch)
        if data is None:
            return True
        with self.spool.sending([batch]) as sent:
            response = self._post(batch.seq, 1, data)
            if response is None:
                return False
            if response.status_code == 200:
                sent.delivered = self._delivered([batch], response)
                return sent.delivered
            if response.status_code in (400, 413, 415, 422):
                sent.delivered = self._set_aside(batch, response)
                return sent.delivered
            return self._retry_later(response, f"batch {batch.seq}")

    def send_many(self, batches: list[SpooledBatch]) -> bool:
        """Push a run of consecutive spooled batches in one request (draining a backlog)."""
        tables, kept = [], []
        for batch in batches:
            data = self.spool.read(batch)
            if data is None:
                continue
            try:
                table = decode(data)
            except WireError:
                return all(self.send(b) for b in batches)  # let the server judge and reject it alone
            tables.append((batch.seq, table))
            kept.append(batch)
        if len(kept) != len(batches) or len(kept) < 2:
            return all(self.send(b) for b in kept)
        with self.spool.sending(kept) as sent:
            response = self._post(kept[0].seq, len(kept), encode(stack(tables)))
            if response is None:
                return False
            if response.status_code == 200:
                sent.delivered = self._delivered(kept, response)
                return sent.delivered
            if response.status_code not in (400, 413, 415, 422):
                return self._retry_later(response, f"batches {kept[0].seq}..{kept[-1].seq}")
        return all(self.send(b) for b in kept)  # isolate the bad batch

    def drain(self) -> bool:
        """Send every spooled batch in order, consecutive ones together; False at the first that must wait."""
        pending = self.spool.pending()
        while pending:
            if self.stop_event.is_set():
                return False
            run = [pending.pop(0)]
            while (pending and len(run) < self.max_batches_per_request
                   and pending[0].seq == run[-1].seq + 1):
                run.append(pending.pop(0))
            if not (self.send(run[0]) if len(run) == 1 else self.send_many(run)):
                return False
        return True

    def send_topology(self) -> int:
        """Every TOPOLOGY_EVERY_S, read the node's topology from the source and post what changed since the server
        last acknowledged it (POST /v1/topology). Runs in the sender thread: a slow server never delays sampling.
        A refused or failed post is logged and tried again at the next reading. Returns the topologies posted."""
        if time.monotonic() < self.topology_due:
            return 0
        self.topology_due = time.monotonic() + TOPOLOGY_EVERY_S
        posted = 0
        try:
            found = self.source.topology()
        except Exception:  # the samples matter more: never let topology stop the sender
            log.exception("topology not read")
            return 0
        for topology in found:
            digest = topology.digest()
            if self._topology_sent.get(topology.node) == digest:
                continue
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            try:
                response = self.session.post(self.topology_url, json=topology.to_json(), headers=headers,
                                             timeout=self.timeout_s, verify=self.verify)
            except requests.RequestException as exc:
                log.warning("topology not sent (%s); tried again in %.0f s", type(exc).__name__, TOPOLOGY_EVERY_S)
                continue
            if response.status_code == 200:
                self._topology_sent[topology.node] = digest
                posted += 1
            else:
                log.warning("server answered %d for the topology of %s: %s", response.status_code, topology.node,
                            response.text[:300])
        return posted

    def _send_loop(self) -> None:
        """Send until stopped, whatever happens: an unexpected error (a full disk, a broken answer, a bug) is
        logged, counted and backed off from, never the end of sending while the sampler goes on filling the spool."""
        backoff = 0.0
        while not self.stop_event.is_set():
            try:
                self.send_topology()
                drained = self.drain()
            except Exception:  # noqa: BLE001 - the loop must outlive any one failure
                AGENT_RETRIES.labels(reason="error").inc()
                log.exception("sending failed; the spool is kept and sent again")
                drained = False
            if drained:
                backoff = 0.0
                self._wake.wait(self.interval_s)
                self._wake.clear()
            else:
                backoff = min(self.max_backoff_s, max(0.2, backoff * 2))
                self.stop_event.wait(backoff)

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, drain_s: float = 5.0) -> None:
        """Stop sampling; give the sender a moment to flush, leaving the rest in the spool for next time."""
        self.stop_event.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 5)
        deadline = time.monotonic() + drain_s
        self.stop_event.clear()
        while self.spool.pending() and time.monotonic() < deadline:
            if not self.drain():
                break
        self.stop_event.set()


def _reason(exc: Exception) -> str:
    """The innermost words of a TLS failure (e.g. 'certificate verify failed: self-signed certificate')."""
    text = str(exc)
    start = text.find("certificate verify failed")
    return text[start:].split(" (_ssl")[0].split(")")[0] if start >= 0 else text[-200:]
