"""Request limits applied before any route reads a byte of the body: a pure ASGI middleware (not Starlette's
BaseHTTPMiddleware, which would run the app in a task group and buffer nothing we want to bound).

Why: a 400 MiB body to POST /v1/placement without a token was read whole before the 401, a 191 MiB JSON to
/v1/tokens was parsed before the 401, and /v1/ingest read its whole body before its own 64 MiB check. Here:

- a declared Content-Length over the route's limit is answered 413 at once, the body never read;
- a streamed (chunked) body is counted as it arrives and answered 413 as soon as it passes the limit;
- a request that carries a body to a route that needs a token, without an `Authorization: Bearer <token>` that
  could be one, or with one the Gate (deploy/api/access.py) does not know, is answered 401 before its body is
  read, and the refusal is written to the audit log as the Gate's own are (bodiless requests go on to the Gate).
  A made-up bearer with a 6 MiB topology body was parsed and validated for 14.6 s on the event loop before the
  route looked at the token.

Every refusal closes the connection (`Connection: close`) so the rest of an oversized body is not read either,
and is counted in `gpuledger_http_refused_total{reason}`.
"""
from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Mapping, MutableMapping

import anyio
from fastapi import HTTPException
from starlette.requests import Request

from gpuledger.analytics.store.metrics import HTTP_REFUSED
from gpuledger.collector.jobs.slurm_commands import SLURM_READ_PATH  # one read as JSON (api/slurm_reads.py)
from gpuledger.collector.topology import TOPOLOGY_PATH
from gpuledger.collector.wire import INGEST_PATH
from gpuledger.deploy.api.access import QUESTIONS, Caller, entry_of

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

INGEST_BODY_BYTES = 64 * 1024 * 1024  # an agent's backlog of 360 batches is ~0.5 MiB; room for MIG-dense nodes
DEFAULT_BODY_BYTES = 1024 * 1024  # every other route takes a small JSON body (a placement question, a decision)
# a node's topology: 256 GPUs' places and their 32,640 pairs as JSON are about 4 MiB
TOPOLOGY_BODY_BYTES = 6 * 1024 * 1024
# job records and queue pages pushed as the commands print them (deploy/api/job_records.py: JOBS_BODY_BYTES)
JOBS_PATH, JOBS_BODY_BYTES = "/v1/jobs", 32 * 1024 * 1024
ROUTE_BODY_BYTES: Mapping[str, int] = {INGEST_PATH: INGEST_BODY_BYTES, TOPOLOGY_PATH: TOPOLOGY_BODY_BYTES,
                                       JOBS_PATH: JOBS_BODY_BYTES, SLURM_READ_PATH: JOBS_BODY_BYTES}
PUBLIC = frozenset({"/", "/healthz", "/livez", "/readyz", "/docs", "/openapi.json"})  # answered without a token
MAX_TOKEN_CHARS = 1024
READS = frozenset({"GET", "HEAD"})


def body_limit(path: str) -> int:
    """The most body bytes a request to `path` may send."""
    return ROUTE_BODY_BYTES.get(path, DEFAULT_BODY_BYTES)


def needs_token(method: str, path: str, open_reads: bool) -> bool:
    """Whether the route always refuses a request without a token: every write, and every read unless the server
    runs with --open-reads (a placement question is a read)."""
    if path in PUBLIC or path.startswith("/static/"):
        return False
    if open_reads and (method in READS or path in QUESTIONS):
        return False
    return True


def could_be_bearer(value: str | None) -> bool:
    """`Bearer <token>` with a token of visible ASCII and sane length: whether the Gate may find it is its own
    business; this only keeps requests that could never pass from having their bodies read."""
    if not value:
        return False
    scheme, _, token = value.partition(" ")
    return (scheme.lower() == "bearer" and 0 < len(token) <= MAX_TOKEN_CHARS
            and all(33 <= ord(c) <= 126 for c in token))


class RequestLimits:
    """The ASGI middleware; `open_reads` as the server's --open-reads."""

    def __init__(self, app: ASGIApp, open_reads: bool = False) -> None:
        self.app = app
        self.open_reads = open_reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        limit = body_limit(path)
        length: int | None = None
        chunked = False
        authorization: str | None = None
        lengths = 0
        for name, value in scope["headers"]:
            if name == b"content-length":
                lengths += 1
                text = value.decode("latin-1").strip()
                if not text.isdigit() or lengths > 1:
                    await _answer(send, 400, "a Content-Length must be one decimal number", "bad_length")
                    return
                length = int(text)
            elif name == b"transfer-encoding":
                chunked = chunked or b"chunked" in value.lower()
            elif name == b"authorization":
                authorization = value.decode("latin-1")
        if length is not None and length > limit:
            await _answer(send, 413, f"request body of {length} bytes over {limit}, the limit of this route",
                          "body_too_large")
            return
        if (chunked or (length or 0) > 0) and needs_token(method, path, self.open_reads) \
                and not could_be_bearer(authorization):
            await _answer(send, 401, "this request needs a token: send 'Authorization: Bearer <token>'", "no_token",
                          {"WWW-Authenticate": "Bearer"})
            return
        if (chunked or (length or 0) > 0) and needs_token(method, path, self.open_reads) \
                and not await _known_token(scope, authorization):
            await _answer(send, 401, "unknown or revoked token", "unknown_token", {"WWW-Authenticate": "Bearer"})
            return
        received = 0
        started = refused = False
        body_done = not chunked and not length  # a request without a body has none to wait for

        async def counted() -> Message:
            """The app's receive: the body counted as it arrives. Past the limit, the 413 goes out at once and the
            app is told the client left (an exception raised here would reach the audit middleware's task group
            and come out as a 500)."""
            nonlocal received, refused, body_done
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > limit:
                    refused = True
                    if not started:
                        await _answer(send, 413, f"request body over {limit} bytes, the limit of this route",
                                      "body_too_large")
                    return {"type": "http.disconnect"}
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the app's answer to a body it never got whole: the 413 went out instead
            if message["type"] == "http.response.start":
                started = True
                if not body_done:  # answered without reading the body (a 404, a 401): do not read it after either
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except Exception:
            if not refused:
                raise
            # the app failed reading a body it was told was cut off: expected, answered, not worth a traceback


async def _known_token(scope: Scope, authorization: str | None) -> bool:
    """Whether the app's Gate knows the bearer token (looked up in a worker thread: an unknown one reads the store);
    a refusal is written to the audit log. True where the app has no Gate (a bare app in a test)."""
    app = scope.get("app")
    gate = getattr(getattr(app, "state", None), "gate", None)
    if gate is None:
        return True
    try:
        await anyio.to_thread.run_sync(gate.identify, authorization)
        return True
    except HTTPException:
        log = getattr(app.state, "audit", None)
        if log is not None:
            log.append(entry_of(Request(scope), Caller(None), 401), wait=False)
        return False


async def _answer(send: Send, status: int, detail: str, reason: str | None,
                  headers: Mapping[str, str] | None = None) -> None:
    """A JSON error answer that closes the connection, so an unread body is never read."""
    if reason:
        HTTP_REFUSED.labels(reason).inc()
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
           (b"connection", b"close")]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
