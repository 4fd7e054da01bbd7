"""Who is calling, and what they may see: bearer tokens resolved to roles, the dependencies each route declares
(read, cluster read, admin, push), a team caller's view narrowed to its own team, and every write audited.

Roles (analytics/store/access.py): `admin` everything; `reader` every read; `team:<name>` its own team's usage,
jobs, costs and recommendations plus cluster totals without other teams' names; `agent:<node>` pushes as that
node only. The server's `--token` (the bootstrap token) is an admin token that is never stored: use it to make
real tokens, then drop it. Reads need a token unless the server runs with `--open-reads`.
"""
from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Iterable

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from starlette.responses import Response

from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import AuditEntry, AuditLog, Identity, Role, find_token
from gpuledger.analytics.store.metrics import AUDIT_DEFERRED
from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED
from gpuledger.collector.wire import INGEST_PATH

logger = logging.getLogger(__name__)
BOOTSTRAP = Identity("bootstrap", "bootstrap", Role("admin"))
ANONYMOUS = "anonymous"
CACHE_S = 30.0  # a token found stays trusted this long; a revocation through the API takes effect at once
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
QUESTIONS = frozenset({"/v1/placement"})  # POSTs that change nothing (a scheduler asking where a pod fits)
EXPORTS = frozenset({"/v1/backup"})  # reads audited all the same: the whole store leaves the server
SHARED_LINES = frozenset({UNATTRIBUTED, IDLE_CAPACITY})  # bill lines that name no team: every caller may see them
OTHER_TEAM = "(another team)"  # what a team token sees in place of another team's name or job


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": "Bearer"})


@dataclass
class Gate:
    """The server's access settings and its cache of resolved tokens."""

    store: Store
    bootstrap: str | None = None
    open_reads: bool = False
    _cache: dict[str, tuple[Identity, float]] = field(default_factory=dict)

    def identify(self, authorization: str | None) -> Identity | None:
        """The identity a bearer header carries; None without one; 401 for a malformed, unknown or revoked token."""
        if not authorization:
            return None
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise _unauthorized("send 'Authorization: Bearer <token>'")
        if self.bootstrap and secrets.compare_digest(given.encode(), self.bootstrap.encode()):
            return BOOTSTRAP
        cached = self._cache.get(given)
        if cached and cached[1] > time.monotonic():
            return cached[0]
        found = find_token(self.store, given)
        if found is None:
            raise _unauthorized("unknown or revoked token")
        self._cache[given] = (found, time.monotonic() + CACHE_S)
        return found

    def forget(self, token_id: str) -> None:
        """Drop a revoked token from the cache."""
        self._cache = {k: v for k, v in self._cache.items() if v[0].id != token_id}


@dataclass(frozen=True)
class Caller:
    """The caller of one request: who (for the audit log) and, for a team token, the one team it may see."""

    identity: Identity | None

    @property
    def actor(self) -> str:
        if self.identity is None:
            return ANONYMOUS
        return self.identity.name if self.identity is BOOTSTRAP else f"{self.identity.name} ({self.identity.id})"

    @property
    def role(self) -> str:
        return str(self.identity.role) if self.identity else ANONYMOUS

    @property
    def team(self) -> str | None:
        """The team a team token is limited to; None for every other caller."""
        role = self.identity.role if self.identity else None
        return role.scope if role and role.kind == "team" else None

    def own(self, asked: str | None) -> str | None:
        """The team filter to apply: what was asked, or for a team token its team (403 when another was asked)."""
        if self.team is None:
            return asked
        if asked not in (None, self.team):
            raise HTTPException(status_code=403, detail=f"a token of team {self.team!r} sees only that team")
        return self.team

    def visible(self, rows: Iterable[dict[str, Any]], shared: bool = True) -> list[dict[str, Any]]:
        """The rows this caller may see: all, or for a team token its own team's, plus (`shared`: bill lines, not
        jobs) the lines that name no team."""
        rows = list(rows)
        if self.team is None:
            return rows
        return [r for r in rows if r.get("team") == self.team or (shared and r.get("team") in SHARED_LINES)]

    def redact(self, rows: Iterable[dict[str, Any]], fields: tuple[str, ...] = ("team", "job_id")) -> list[dict]:
        """Every row, but for a team token with another team's name and job replaced by OTHER_TEAM: cluster
        figures (which GPUs are taken) without saying by whom."""
        rows = list(rows)
        if self.team is None:
            return rows
        return [r if r.get("team") == self.team or r.get("job_id") is None
                else {**r, **{f: OTHER_TEAM for f in fields}} for r in rows]


def _caller(request: Request, identity: Identity | None) -> Caller:
    caller = Caller(identity)
    request.state.caller = caller  # for the audit log
    return caller


def read_access(request: Request, authorization: str | None = Header(None)) -> Caller:
    """Any read: a reader, admin or team token, or none on a server with --open-reads."""
    gate: Gate = request.app.state.gate
    identity = gate.identify(authorization)
    if identity is None and not gate.open_reads:
        raise _unauthorized("reads need a token (admin, reader or team); see `gpuledger token create`")
    if identity is not None and identity.role.kind == "agent":
        raise HTTPException(status_code=403, detail="an agent token may only push batches")
    return _caller(request, identity)


def cluster_access(caller: Annotated[Caller, Depends(read_access)]) -> Caller:
    """A read of every team's figures at once (exports, /metrics): not for a team token."""
    if caller.team is not None:
        raise HTTPException(status_code=403, detail=f"a token of team {caller.team!r} cannot read every team's "
                                                    "figures; use /v1/teams/{team}/usage and the team filters")
    return caller


def admin_access(request: Request, authorization: str | None = Header(None)) -> Caller:
    """Decisions, tokens, the audit log, backups: an admin token."""
    identity = request.app.state.gate.identify(authorization)
    caller = _caller(request, identity)
    if identity is None:
        raise _unauthorized("this needs an admin token")
    if identity.role.kind != "admin":
        raise HTTPException(status_code=403, detail=f"this needs an admin token (yours is {identity.role})")
    return caller


def push_access(request: Request, node: str, authorization: str | None) -> Caller:
    """A push as `node`: an admin token, or the agent token of that very node."""
    identity = request.app.state.gate.identify(authorization)
    caller = _caller(request, identity)
    if identity is None:
        raise _unauthorized("pushes need an agent or admin token")
    role = identity.role
    if role.kind == "agent" and role.scope != node:
        raise HTTPException(status_code=403, detail=f"this token pushes as node {role.scope!r}, not {node!r}")
    if role.kind not in ("agent", "admin"):
        raise HTTPException(status_code=403, detail=f"a {role} token cannot push batches")
    return caller


ReadCaller = Annotated[Caller, Depends(read_access)]
ClusterCaller = Annotated[Caller, Depends(cluster_access)]
AdminCaller = Annotated[Caller, Depends(admin_access)]


def audit_writes(app: FastAPI, log: AuditLog | None) -> None:
    """Record every write request and every backup (method, route, status, caller, client address and what the
    handler put in `request.state.audit`) in the audit log, refused ones included."""

    @app.middleware("http")
    async def audit(request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", request.url.path)
        if log is not None and ((request.method in WRITES and path not in QUESTIONS) or path in EXPORTS):
            caller: Caller = getattr(request.state, "caller", Caller(None))
            entry = AuditEntry(actor=caller.actor, role=caller.role,
                               action=f"{request.method} {path}",
                               target=request.url.path, status=response.status_code,
                               remote=request.client.host if request.client else None,
                               detail=getattr(request.state, "audit", None))
            if path == INGEST_PATH:  # many a second: written with the next flush, within a second
                log.append(entry, wait=False)
                return response
            try:
                await run_in_threadpool(log.append, entry)
            except Exception as exc:  # the answer stands (the write itself is done or refused); the entry waits
                AUDIT_DEFERRED.inc()
                logger.error("audit entry for %s %s by %s kept in memory (%d waiting): %s", request.method, path,
                             caller.actor, log.waiting, exc)
        return response
