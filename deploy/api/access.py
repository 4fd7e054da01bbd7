"""Who is calling, and what they may see: bearer tokens resolved to roles, the dependencies each route declares
(read, cluster read, admin, push), a team caller's view narrowed to its own team, and every write audited.

Roles (analytics/store/access.py): `admin` everything; `reader` every read; `team:<name>` its own team's usage,
jobs, costs and recommendations plus cluster totals without other teams' names; `agent:<node>` pushes as that
node only. The server's `--token` (the bootstrap token) is an admin token that is never stored: use it to make
real tokens, then drop it. Reads need a token unless the server runs with `--open-reads`.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Iterable, Sequence

import pandas as pd
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from starlette.responses import Response

from gpuledger.analytics.records import records
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import (Audit, AuditEntry, AuditLog, Identity, Role, find_token, record_use,
                                              require_team)
from gpuledger.analytics.store.metrics import AUDIT_DEFERRED
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import InputError
from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED
from gpuledger.collector.wire import INGEST_PATH

logger = logging.getLogger(__name__)
BOOTSTRAP = Identity("bootstrap", "bootstrap", Role("admin"))
ANONYMOUS = "anonymous"
log = logging.getLogger(__name__)
CACHE_S = 30.0  # a token found stays trusted this long; a revocation through the API takes effect at once
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
QUESTIONS = frozenset({"/v1/placement", "/v1/whatif", "/v1/whatif/placement"})  # POSTs that change nothing
EXPORTS = frozenset({"/v1/backup"})  # reads audited all the same: the whole store leaves the server
SHARED_LINES = frozenset({UNATTRIBUTED, IDLE_CAPACITY})  # bill lines that name no team: every caller may see them
OTHER_TEAM = "(another team)"  # what a team token sees in place of another team's name or job
PROXIES_ENV = "GPULEDGER_TRUSTED_PROXIES"  # comma-separated CIDRs whose X-Forwarded-For is believed
REFUSED_READS = frozenset({401, 403})  # a read refused to anyone; a team token's 404s count too (probing)
REFUSAL_WINDOW_S = 60.0  # refused reads are coalesced per actor per minute: a flood cannot grow the log
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_networks(given: Sequence[str] | None = None) -> tuple[Network, ...]:
    """The proxies whose X-Forwarded-For the audit log believes: `given` (serve --trusted-proxy), else
    $GPULEDGER_TRUSTED_PROXIES, else none (the address of whoever connected is what is logged)."""
    texts = list(given) if given else [t for t in os.environ.get(PROXIES_ENV, "").split(",") if t.strip()]
    try:
        return tuple(ipaddress.ip_network(t.strip(), strict=False) for t in texts)
    except ValueError as exc:
        raise InputError(f"trusted proxy: {exc} (give a CIDR such as 10.0.0.0/8 or an address)") from exc


def _within(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in n for n in networks)


def client_address(request: Request) -> str | None:
    """Who to name in the audit log: the connecting address; when that is a trusted proxy, the first address
    of X-Forwarded-For (read from the right) that is not itself a trusted proxy, `<client> via <proxy>`. Anyone
    else's X-Forwarded-For is ignored: a client cannot put another address in the log."""
    peer = request.client.host if request.client else None
    trusted = getattr(request.app.state, "trusted_proxies", ())
    forwarded = ",".join(request.headers.getlist("x-forwarded-for"))
    if peer is None or not trusted or not forwarded or not _within(peer, trusted):
        return peer
    hops = [h.strip() for h in forwarded.split(",") if h.strip()]
    client = next((h for h in reversed(hops) if not _within(h, trusted)), hops[0] if hops else peer)
    return f"{client[:64]} via {peer}"


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
        now = utc_now()
        if cached and cached[1] > time.monotonic() and (cached[0].expires is None or cached[0].expires > now):
            return cached[0]
        found = find_token(self.store, given)
        if found is None:
            raise _unauthorized("unknown, revoked or expired token")
        self._cache[given] = (found, time.monotonic() + CACHE_S)
        if not self.store.read_only:  # once per token per CACHE_S: the access review's "last used"
            try:
                record_use(self.store, found.id, now)
            except Exception as exc:  # noqa: BLE001 - a busy store must not refuse a valid token
                log.debug("could not note the use of token %s: %s", found.id, exc)
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

    def own(self, asked: str | None, store: Store | None = None) -> str | None:
        """The team filter to apply: what was asked, or for a team token its team (403 when another was asked).
        With `store`, a team asked that the store does not know is a 404 naming it (`require_team`), the same on
        every route with a team parameter."""
        if self.team is not None and asked not in (None, self.team):
            raise HTTPException(status_code=403, detail=f"a token of team {self.team!r} sees only that team")
        if store is not None:
            require_team(store, asked)
        return asked if self.team is None else self.team

    def visible(self, rows: Iterable[dict[str, Any]], shared: bool = True) -> list[dict[str, Any]]:
        """The rows this caller may see: all, or for a team token its own team's, plus (`shared`: bill lines, not
        jobs) the lines that name no team."""
        rows = list(rows)
        if self.team is None:
            return rows
        return [r for r in rows if self._sees(r.get("team"), shared)]

    def page(self, frame: pd.DataFrame, limit: int, shared: bool = True) -> list[dict[str, Any]]:
        """visible() of a table's first `limit` rows this caller may see, as records: the rows are chosen before
        they are converted, since converting a few thousand rows to cut them to fifty cost more than the query."""
        if self.team is not None and len(frame):
            frame = frame[[self._sees(t, shared) for t in frame["team"]]]
        return records(frame.head(limit))

    def _sees(self, team: Any, shared: bool) -> bool:
        """Whether a team token sees a row of `team`: its own, and (`shared`) the lines that name no team."""
        return team == self.team or (shared and team in SHARED_LINES)

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


def entry_of(request: Request, caller: Caller, status: int) -> AuditEntry:
    """The audit entry of this request as answered with `status`."""
    route = request.scope.get("route")
    return AuditEntry(actor=caller.actor, role=caller.role,
                      action=f"{request.method} {getattr(route, 'path', request.url.path)}",
                      target=request.url.path, status=status, remote=client_address(request),
                      detail=getattr(request.state, "audit", None))


def audit_of(request: Request, caller: Caller, status: int) -> Audit | None:
    """The audit entry a write handler commits in the write's own transaction (the write and its entry land
    together), marking the request as audited so the middleware does not log it twice."""
    log: AuditLog | None = request.app.state.audit
    if log is None:
        return None
    return Audit(log, entry_of(request, caller, status), on_commit=lambda: setattr(request.state, "audited", True))


class RefusedReads:
    """Refused reads, coalesced per actor per minute: the first of each minute is an entry at once (with what was
    asked), the rest of that minute one entry with their count and up to ten of the paths asked, written when
    the minute is over. At most two entries per actor a minute, however many refusals."""

    def __init__(self, window_s: float = REFUSAL_WINDOW_S) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._open: dict[tuple[str, str], dict[str, Any]] = {}  # (actor, role) -> this window's tally

    def refused(self, entry: AuditEntry) -> AuditEntry | None:
        """The entry to write now for this refusal (the first of its actor's minute), else None (counted)."""
        now = time.monotonic()
        with self._lock:
            tally = self._open.get((entry.actor, entry.role))
            if tally is not None and now - tally["since"] < self.window_s:
                tally["count"] += 1
                tally["statuses"][str(entry.status)] = tally["statuses"].get(str(entry.status), 0) + 1
                if len(tally["paths"]) < 10 and entry.target not in tally["paths"]:
                    tally["paths"].append(entry.target)
                tally["remote"] = entry.remote
                return None
            self._open[(entry.actor, entry.role)] = {"since": now, "count": 0, "statuses": {}, "paths": [],
                                                    "remote": entry.remote, "first": utc_now().isoformat()}
            return entry

    def due(self, everything: bool = False) -> list[AuditEntry]:
        """The summaries of the minutes that are over (all, with `everything`: at shutdown)."""
        now, out = time.monotonic(), []
        with self._lock:
            for (actor, role), tally in list(self._open.items()):
                if not everything and now - tally["since"] < self.window_s:
                    continue
                del self._open[(actor, role)]
                if tally["count"]:
                    out.append(AuditEntry(actor=actor, role=role, action="GET (refused reads, coalesced)",
                                          target=tally["paths"][0], status=max(map(int, tally["statuses"])),
                                          remote=tally["remote"],
                                          detail={"count": tally["count"], "statuses": tally["statuses"],
                                                  "paths": tally["paths"], "since": tally["first"]}))
        return out


ReadCaller = Annotated[Caller, Depends(read_access)]
ClusterCaller = Annotated[Caller, Depends(cluster_access)]
AdminCaller = Annotated[Caller, Depends(admin_access)]


def _named(request: Request) -> Caller:
    """Who sent a request refused before its route named the caller (a header that failed validation): the
    bearer's identity where the Gate knows it (an entry names the agent, not `anonymous`), else anonymous."""
    try:
        return Caller(request.app.state.gate.identify(request.headers.get("authorization")))
    except HTTPException:
        return Caller(None)


def audit_writes(app: FastAPI, log: AuditLog | None) -> None:
    """Record every write request and every backup (method, route, status, caller, client address and what the
    handler put in `request.state.audit`) in the audit log, refused and failed ones included, and refused reads
    (coalesced per actor per minute). A write whose entry committed with it (`audit_of`) is not logged again."""
    refusals = RefusedReads()
    app.state.refused_reads = refusals
    if log is not None:
        log.producers.append(refusals.due)

    @app.middleware("http")
    async def audit(request: Request, call_next: Any) -> Response:
        failure: Exception | None = None
        try:
            response = await call_next(request)
            status = response.status_code
        except Exception as exc:  # the handler failed: a write it committed has its entry; else one is made here
            response, status, failure = None, 500, exc
        route = request.scope.get("route")
        path = getattr(route, "path", request.url.path)
        caller: Caller = getattr(request.state, "caller", None) or _named(request)
        if log is None or getattr(request.state, "audited", False):
            pass
        elif (request.method in WRITES and path not in QUESTIONS) or path in EXPORTS:
            entry = entry_of(request, caller, status)
            if path == INGEST_PATH:  # a refused push (a stored one committed its entry with its batches):
                # many a second, written with the next flush, within a second
                log.append(entry, wait=False)
            else:
                try:
                    await run_in_threadpool(log.append, entry)
                except Exception as exc:  # the answer stands (the write is done or refused); the entry waits
                    AUDIT_DEFERRED.inc()
                    logger.error("audit entry for %s %s by %s kept in memory (%d waiting): %s", request.method,
                                 path, caller.actor, log.waiting, exc)
        elif status in REFUSED_READS or (status == 404 and caller.team is not None):
            query = str(request.url.query)[:300]
            entry = refusals.refused(replace(entry_of(request, caller, status),
                                             detail={"query": query} if query else None))
            if entry is not None:
                log.append(entry, wait=False)
        if failure is not None:
            raise failure
        return response
