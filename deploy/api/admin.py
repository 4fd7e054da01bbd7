"""Administration: API tokens (made, listed, revoked) and the audit log of every write. Admin tokens only."""
from __future__ import annotations

import json
from datetime import datetime

from fastapi import APIRouter, Header, HTTPException, Query, Request

from gpuledger.analytics.records import records
from gpuledger.analytics.store.access import (
    AccessError,
    Role,
    audit_entries,
    create_token,
    list_tokens,
    revoke_token,
    verify_audit,
)
from gpuledger.deploy.api.access import AdminCaller, Caller
from gpuledger.deploy.api.deps import StoreDep
from gpuledger.deploy.api.models import AuditLog, NewToken, TokenInfo, TokenRequest, WhoAmI

router = APIRouter(tags=["admin"])


@router.get("/v1/whoami", response_model=WhoAmI)
def whoami(request: Request, authorization: str | None = Header(None)) -> dict:
    """Who the bearer token is and what it may do (the dashboard shows its buttons by this)."""
    gate = request.app.state.gate
    caller = Caller(gate.identify(authorization))
    return {"actor": caller.actor, "role": caller.role, "team": caller.team, "open_reads": gate.open_reads,
            "may_decide": caller.identity is not None and caller.identity.role.kind == "admin"}


@router.post("/v1/tokens", response_model=NewToken, status_code=201)
def make_token(body: TokenRequest, request: Request, caller: AdminCaller, store: StoreDep) -> dict:
    """Make a token with a role: `admin`, `reader`, `team:<team>` or `agent:<node>`. The answer carries the token
    once; the server keeps only its hash."""
    try:
        role = Role.parse(body.role)
    except AccessError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from exc
    identity, token = create_token(store, body.name, role, caller.actor)
    request.state.audit = {"token": identity.id, "name": identity.name, "role": str(role)}
    made = list_tokens(store)
    return {**records(made[made["id"] == identity.id])[0], "token": token}


@router.get("/v1/tokens", response_model=list[TokenInfo])
def tokens(caller: AdminCaller, store: StoreDep, revoked: bool = Query(False, description="list revoked too")) -> list:
    """Every live token (and revoked ones when asked): id, name, role, who made it and when. Never the secret."""
    return records(list_tokens(store, revoked))


@router.delete("/v1/tokens/{token_id}", response_model=TokenInfo)
def revoke(token_id: str, request: Request, caller: AdminCaller, store: StoreDep) -> dict:
    """Revoke a token; it is refused from the next request on."""
    request.state.audit = {"token": token_id}
    if not revoke_token(store, token_id, caller.actor):
        raise HTTPException(status_code=404, detail=f"no live token with id {token_id!r}; see GET /v1/tokens")
    request.app.state.gate.forget(token_id)
    found = list_tokens(store, revoked=True)
    return records(found[found["id"] == token_id])[0]


@router.get("/v1/audit", response_model=AuditLog)
def audit(caller: AdminCaller, store: StoreDep, since: datetime | None = Query(None, description="from this instant"),
          actor: str | None = Query(None, max_length=300, description="only this actor"),
          limit: int = Query(1000, ge=1, le=100_000)) -> dict:
    """The audit log: every write and decision (refused ones too), who made it, when, from where and how it ended;
    and whether the log's hash chain is intact."""
    broken = verify_audit(store)
    rows = records(audit_entries(store, since, actor, limit))
    for row in rows:
        row["detail"] = json.loads(row["detail"]) if isinstance(row["detail"], str) else row["detail"]
    return {"intact": broken is None, "first_broken": broken, "entries": rows}
