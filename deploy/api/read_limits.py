"""Reads in flight, bounded per token and in total below the worker pool, so probes and other callers are answered.

Why: the API's synchronous routes run on one pool of worker threads (AnyIO's, 40). 48 slow analytic reads from one
team token filled it: /livez failed 48 times in a row (Kubernetes would have restarted the server, losing what it
was writing) and other readers timed out. Here, before a read reaches a route:

- one caller (one bearer token; without one, one client address) has at most `per_caller` reads in flight: past
  that, 429 with Retry-After;
- all callers together have at most `total` in flight, below the pool's size so that writes (an agent's push, a
  decision) and the probes' own threads always find room: past that, 503 with Retry-After;
- a read still running after `time_limit_s` has its queries interrupted (analytics/store/deadline.py) and is
  answered 503, saying so, instead of holding its thread for as long as it takes.

The probes (/livez, /readyz, /healthz) are not counted and do not use that pool at all (deploy/api/ops.py). A pure
ASGI middleware: a refused read costs a counter and a short answer, never a thread.
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from gpuledger.analytics.store.deadline import READ_DEADLINE
from gpuledger.analytics.store.metrics import HTTP_REFUSED
from gpuledger.deploy.api.access import QUESTIONS

READ_TIME_LIMIT_S = 120.0  # a read still running then is interrupted (analytics/store/deadline.py): 503
POOL_THREADS = 40  # AnyIO's default worker threads, which FastAPI runs synchronous routes on
PER_CALLER = 16
TOTAL = POOL_THREADS - 8  # room left for writes, pushes and the audit log's own work
RETRY_AFTER_S = 1
UNCOUNTED = frozenset({"/livez", "/readyz", "/healthz", "/", "/docs", "/openapi.json"})


class ReadLimits:
    """The ASGI middleware; `per_caller` and `total` as above."""

    def __init__(self, app: Any, per_caller: int = PER_CALLER, total: int = TOTAL,
                 time_limit_s: float | None = None) -> None:
        self.app = app
        self.time_limit_s = time_limit_s  # None: READ_TIME_LIMIT_S as it is when a read comes
        self.per_caller = per_caller
        self.total = total
        self.in_flight: dict[str, int] = {}
        self.running = 0

    @staticmethod
    def _is_read(scope: dict) -> bool:
        path = scope["path"]
        if path in UNCOUNTED or path.startswith("/static/"):
            return False
        return scope["method"] in ("GET", "HEAD") or path in QUESTIONS

    @staticmethod
    def _caller(scope: dict) -> str:
        for name, value in scope["headers"]:
            if name == b"authorization":
                return "t:" + hashlib.sha256(value).hexdigest()[:16]
        client = scope.get("client")
        return "a:" + (client[0] if client else "unknown")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self._is_read(scope):
            await self.app(scope, receive, send)
            return
        caller = self._caller(scope)
        mine = self.in_flight.get(caller, 0)
        if mine >= self.per_caller:
            await _refuse(send, 429, f"{mine} reads of this caller are being answered (at most {self.per_caller} "
                                     "at once): retry after a second", "reads_per_caller")
            return
        if self.running >= self.total:
            await _refuse(send, 503, f"the server is answering {self.running} reads (at most {self.total} at once): "
                                     "retry after a second", "reads_total")
            return
        self.in_flight[caller] = mine + 1  # one event loop: no lock needed between these lines
        self.running += 1
        seconds = self.time_limit_s if self.time_limit_s is not None else READ_TIME_LIMIT_S
        limit = READ_DEADLINE.set(time.monotonic() + seconds)  # follows the read into its worker thread
        try:
            await self.app(scope, receive, send)
        finally:
            READ_DEADLINE.reset(limit)
            self.running -= 1
            left = self.in_flight[caller] - 1
            if left:
                self.in_flight[caller] = left
            else:
                del self.in_flight[caller]


async def _refuse(send: Any, status: int, detail: str, reason: str) -> None:
    HTTP_REFUSED.labels(reason).inc()
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"retry-after", str(RETRY_AFTER_S).encode())]})
    await send({"type": "http.response.body", "body": body})


async def answer_interrupted(request: Request, exc: Exception) -> JSONResponse:
    """A read interrupted at its deadline: 503, with what to do about it."""
    HTTP_REFUSED.labels("read_time_limit").inc()
    return JSONResponse({"detail": f"this read ran past the server's {READ_TIME_LIMIT_S:g} s limit for one read and "
                                   "was stopped: ask for a shorter window or a coarser bucket"},
                        status_code=503, headers={"Retry-After": "60"})
