"""`gpuledger token create|list|revoke` and `gpuledger audit`: on the database file when no server holds it, else
through a running server's API with an admin token (DuckDB lets one process open the file, so a server that is
up is asked, never bypassed)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import requests

from gpuledger.analytics.records import records
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import (
    AccessError,
    Role,
    audit_report,
    create_token,
    list_tokens,
    revoke_token,
    token_info,
)
from gpuledger.collector.errors import GpuledgerError, InputError

LOCAL_ACTOR = "cli"  # who made a token on the file: the person at the server's console


def refusal(response: requests.Response) -> str:
    """Why the server refused: its `detail`, else the start of the body."""
    try:
        return str(response.json().get("detail"))
    except (ValueError, AttributeError):
        return response.text[:300]


class TokenAdmin(Protocol):
    """Where tokens and the audit log are kept: the file itself or a server's API."""

    def create(self, name: str, role: str) -> dict[str, Any]: ...

    def list(self, revoked: bool) -> list[dict[str, Any]]: ...

    def revoke(self, token_id: str) -> dict[str, Any]: ...

    def audit(self, since: datetime | None, limit: int) -> dict[str, Any]: ...


@dataclass
class LocalAdmin:
    """Tokens in a database file no server holds."""

    store: Store

    def create(self, name: str, role: str) -> dict[str, Any]:
        try:
            identity, token = create_token(self.store, name, Role.parse(role), LOCAL_ACTOR)
        except AccessError as exc:
            raise InputError(str(exc)) from exc
        return {**token_info(self.store, identity.id), "token": token}

    def list(self, revoked: bool) -> list[dict[str, Any]]:
        return records(list_tokens(self.store, revoked))

    def revoke(self, token_id: str) -> dict[str, Any]:
        if not revoke_token(self.store, token_id, LOCAL_ACTOR):
            raise InputError(f"no live token with id {token_id!r}; see `gpuledger token list`")
        return token_info(self.store, token_id)

    def audit(self, since: datetime | None, limit: int) -> dict[str, Any]:
        return audit_report(self.store, since, None, limit)


@dataclass
class RemoteAdmin:
    """Tokens on a running server, through its API."""

    server: str
    token: str
    ca: str | None = None

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = requests.request(method, self.server.rstrip("/") + path, timeout=30, verify=self.ca or True,
                                        headers={"Authorization": f"Bearer {self.token}"}, **kwargs)
        except requests.RequestException as exc:
            raise GpuledgerError(f"cannot reach {self.server}: {exc}") from exc
        if not response.ok:
            raise GpuledgerError(f"{self.server} refused ({response.status_code}): {refusal(response)}")
        return response.json()

    def create(self, name: str, role: str) -> dict[str, Any]:
        return self._call("POST", "/v1/tokens", json={"name": name, "role": role})

    def list(self, revoked: bool) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/tokens", params={"revoked": revoked})

    def revoke(self, token_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/tokens/{token_id}")

    def audit(self, since: datetime | None, limit: int) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if since:
            params["since"] = since.isoformat()
        return self._call("GET", "/v1/audit", params=params)


def run_token(admin: TokenAdmin, action: str, name: str | None, role: str | None, token_id: str | None,
              revoked: bool, as_json: bool, echo: Any = print, note: Any = print) -> int:
    """One `gpuledger token` action; `echo` gets what a script reads (the token, the table), `note` the rest."""
    if action == "create":
        made = admin.create(name or role.replace(":", "-"), role)
        note(f"token {made['id']} ({made['name']}, role {made['role']}); shown once, stored as a hash:")
        echo(made["token"])
    elif action == "list":
        rows = admin.list(revoked)
        if as_json:
            echo(json.dumps(rows, indent=2, default=str))
        elif not rows:
            note("no tokens yet: `gpuledger token create --role admin --name you`")
        for r in [] if as_json else rows:
            state = f"revoked {r['revoked']}" if r.get("revoked") else "live"
            echo(f"{r['id']}  {r['role']:<24} {r['name']:<24} made {r['created']} by {r['created_by']}  {state}")
    else:
        gone = admin.revoke(token_id)
        note(f"revoked {gone['id']} ({gone['name']}, role {gone['role']})")
    return 0


def run_audit(admin: TokenAdmin, since: datetime | None, limit: int, as_json: bool, echo: Any = print) -> int:
    """Print the audit log, newest first; exit 1 when its hash chain is broken."""
    log = admin.audit(since, limit)
    if as_json:
        echo(json.dumps(log, indent=2, default=str))
    else:
        for e in log["entries"]:
            echo(f"{e['seq']:>6} {e['ts']} {e['status']} {e['actor']} [{e['role']}] {e['action']} "
                 f"from {e['remote'] or '-'} {e['detail'] or ''}")
        echo("chain intact" if log["intact"] else f"chain BROKEN at entry {log['first_broken']}: edited or removed")
    return 0 if log["intact"] else 1
