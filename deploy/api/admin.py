"""Administration: API tokens (made, listed, revoked), the audit log of every write, and backups. Admin tokens
only."""
from __future__ import annotations

import shutil
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from gpuledger.analytics.records import records
from gpuledger.analytics.store.access import (
    Role,
    audit_report,
    create_token,
    list_tokens,
    revoke_token,
    token_info,
)
from gpuledger.analytics.store.backup import BackupError, snapshot, stamp
from gpuledger.analytics.windows import utc_now
from gpuledger.deploy.api.access import AdminCaller, Caller, audit_of
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
    role = Role.parse(body.role)  # AccessError: 422, through the error family's handler
    request.state.audit = {"name": body.name, "role": str(role)}  # for the entry of a refusal
    expires = utc_now() + timedelta(days=body.expires_in_days) if body.expires_in_days else None
    identity, token = create_token(store, body.name, role, caller.actor, audit=audit_of(request, caller, 201),
                                   expires=expires)
    return {**token_info(store, identity.id), "token": token}


@router.get("/v1/tokens", response_model=list[TokenInfo])
def tokens(caller: AdminCaller, store: StoreDep, revoked: bool = Query(False, description="list revoked too")) -> list:
    """Every live token (and revoked ones when asked): id, name, role, who made it and when. Never the secret."""
    return records(list_tokens(store, revoked))


@router.delete("/v1/tokens/{token_id}", response_model=TokenInfo)
def revoke(token_id: str, request: Request, caller: AdminCaller, store: StoreDep) -> dict:
    """Revoke a token; it is refused from the next request on."""
    request.state.audit = {"token": token_id}
    if not revoke_token(store, token_id, caller.actor, audit=audit_of(request, caller, 200)):
        raise HTTPException(status_code=404, detail=f"no live token with id {token_id!r}; see GET /v1/tokens")
    request.app.state.gate.forget(token_id)
    return token_info(store, token_id)


@router.get("/v1/audit", response_model=AuditLog)
def audit(request: Request, caller: AdminCaller, store: StoreDep,
          since: datetime | None = Query(None, description="from this instant"),
          actor: str | None = Query(None, max_length=300, description="only this actor"),
          limit: int = Query(1000, ge=1, le=100_000)) -> dict:
    """The audit log: every write and decision (refused ones too, and refused reads coalesced per minute), who made
    it, when, from where and how it ended; and whether the log is intact (its HMAC chain, and its end against the
    head anchor kept outside the database), else the first broken entry and why. Pushes queued are written first."""
    if request.app.state.audit is not None:
        request.app.state.audit.flush()
    return audit_report(store, since, actor, limit)


@router.get("/v1/backup", response_class=FileResponse, responses={200: {
    "content": {"application/vnd.duckdb": {}},
    "description": "a DuckDB file holding every table; its manifest (JSON) in the X-Gpuledger-Manifest header"}})
def backup(request: Request, caller: AdminCaller, store: StoreDep) -> FileResponse:
    """A consistent snapshot of the whole store, taken while the server keeps collecting (one transaction's view
    of every table), as a DuckDB file. `gpuledger backup DIR --server URL` saves it with its manifest."""
    work = Path(tempfile.mkdtemp(prefix="gpuledger-backup-", dir=None if store.lake else Path(store.path).parent))
    name = f"gpuledger-{stamp()}.duckdb"
    log = request.app.state.audit
    try:
        manifest = snapshot(store, work / name, log.files if log is not None else None)
    except BackupError as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise HTTPException(status_code=507, detail=str(exc)) from exc
    request.state.audit = {"backup": name, "bytes": manifest.bytes, "sha256": manifest.sha256}
    return FileResponse(work / name, media_type="application/vnd.duckdb", filename=name,
                        headers={"X-Gpuledger-Manifest": manifest.text()},
                        background=BackgroundTask(shutil.rmtree, work, ignore_errors=True))
