"""Connection limits of the API server: per-client and total connection caps, and deadlines for a request's head
and body, applied in uvicorn's h11 protocol (deploy/server.py passes `guarded_protocol(...)` as its `http`).

Why: uvicorn bounds neither how many connections one address holds nor how long a request head may take to
arrive. 21,000 sockets that each sent half a head used up the server's file descriptors and /healthz stopped
answering. Refusals are counted in `gpuledger_http_refused_total{reason}` and logged at most once per client and
minute, so a flood does not flood the log too.
"""
from __future__ import annotations

import asyncio
import logging
import resource
import time
from dataclasses import dataclass, field
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from gpuledger.analytics.store.metrics import HTTP_REFUSED

log = logging.getLogger(__name__)
LOOPBACK = frozenset({"127.0.0.1", "::1"})  # the host itself: probes, a local reverse proxy, local benchmarks
WARN_EVERY_S = 60.0  # a refused client is logged at most this often; every refusal is counted in the metric
HEAD_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
BUSY_503 = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection and one client address may hold of the server.

    `per_client`: connections one client address may hold open at once (0: no cap). The host's own loopback
    addresses (LOOPBACK) are not capped: behind a reverse proxy on the same host every client shares them (the
    proxy has its own limits). Behind a remote proxy, raise it. `total`: connections in all (default 3/4 of the
    files the process may open, at most 8192), refused beyond, so that /healthz and new clients still find a file
    descriptor. `head_timeout_s`: a request head (request line and headers) must be complete this long after the
    connection opens, or after its first byte on a kept-alive connection (a total deadline, not an idle one: a
    client dripping a byte a second is closed all the same). `body_timeout_s`: the body must be complete this
    long after the head (64 MiB, the largest, at 1 MiB/s). `keep_alive_s`: an idle kept-alive connection is
    closed after this (uvicorn's own timer)."""

    per_client: int = 64
    total: int | None = None
    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 5.0
    backlog: int = 2048

    def total_connections(self) -> int:
        return self.total if self.total is not None else min(8192, max(64, _open_files() * 3 // 4))


def _open_files() -> int:
    """The soft limit of open files, raised to the hard limit first (the server holds one per connection)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return 65536 if soft == resource.RLIM_INFINITY else soft


@dataclass
class Connections:
    """The open connections per client address, and when each refused client was last logged. Only the event
    loop's thread touches it, so it needs no lock."""

    limits: ConnectionLimits
    total_cap: int
    open: dict[str, int] = field(default_factory=dict)
    total: int = 0
    warned: dict[str, float] = field(default_factory=dict)

    def admit(self, host: str) -> str | None:
        """Count a new connection from `host`; or the reason it is refused (and not counted)."""
        if self.total >= self.total_cap:
            return "total_connections"
        held = self.open.get(host, 0)
        if self.limits.per_client and held >= self.limits.per_client and host not in LOOPBACK:
            return "client_connections"
        self.open[host] = held + 1
        self.total += 1
        return None

    def release(self, host: str) -> None:
        held = self.open.get(host, 0) - 1
        if held > 0:
            self.open[host] = held
        else:
            self.open.pop(host, None)
        self.total -= 1

    def refused(self, host: str, reason: str, what: str) -> None:
        """Count a refusal, and log it once per client and minute whatever the flood."""
        HTTP_REFUSED.labels(reason).inc()
        now = time.monotonic()
        if now - self.warned.get(host, -WARN_EVERY_S) < WARN_EVERY_S:
            return
        if len(self.warned) > 10_000:  # many addresses: forget those logged over a minute ago
            self.warned = {h: t for h, t in self.warned.items() if now - t < WARN_EVERY_S}
        self.warned[host] = now
        log.warning("%s from %s (%s); further refusals of this client are counted in gpuledger_http_refused_total "
                    "and logged again in %.0f s", what, host, reason, WARN_EVERY_S)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with ConnectionLimits: the caps when a connection is made, and the head and body
    deadlines while a request arrives."""

    book: ClassVar[Connections]  # not `connections`: H11Protocol has that (the server's set of protocols)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for = ""
        self._host = self.client[0] if self.client else "unknown"
        reason = self.book.admit(self._host)
        self._admitted = reason is None
        if reason is not None:
            cap = self.book.limits.per_client if reason == "client_connections" else self.book.total_cap
            self.book.refused(self._host, reason, f"connection refused, {cap} already open")
            transport.write(BUSY_503)
            transport.close()
            return
        self._arm("head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if getattr(self, "_admitted", False):
            self._admitted = False
            self.book.release(self._host)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return  # refused: being closed, nothing of it is parsed
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm("head")  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def _follow(self) -> None:
        """Move the deadline along with the request: the head's until the head is in, the body's until the body
        is; none while the app works or the connection idles (uvicorn's keep-alive timer)."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._waiting_for != "body":
                self._arm("body")
        elif state is not h11.IDLE:  # the request is in (DONE), or the connection is ending
            self._disarm()
        # IDLE: a head is awaited; its deadline stands, or starts with the next byte (data_received)

    def _arm(self, what: str) -> None:
        self._disarm()
        limits = self.book.limits
        self._waiting_for = what
        self._deadline = self.loop.call_later(limits.head_timeout_s if what == "head" else limits.body_timeout_s,
                                              self._expired)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
        self._deadline = None
        self._waiting_for = ""

    def _expired(self) -> None:
        what, self._deadline, self._waiting_for = self._waiting_for, None, ""
        if self.transport.is_closing():
            return
        limits = self.book.limits
        took = limits.head_timeout_s if what == "head" else limits.body_timeout_s
        self.book.refused(self._host, f"{what}_timeout",
                                 f"connection closed, request {what} incomplete after {took:g} s")
        if what == "head" and self.conn.our_state is h11.IDLE:
            self.transport.write(HEAD_408)
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A protocol class of its own for one server, holding that server's book of connections."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"book": Connections(limits, limits.total_connections())})
