"""`gpuledger token create|list|revoke` and `gpuledger audit`: on the database file when no server holds it, else
through a running server's API with an admin token (DuckDB lets one process open the file, so a server that is
up is asked, never bypassed).

What these commands write on the file (tokens made and revoked, and `gpuledger decide`, `backup` and `restore`)
is audited as the server audits its API: the actor is the person at the console (`cli:<OS user>`), role admin,
from "local", each entry committed in the write's own transaction; a refused one gets an entry too."""
from __future__ import annotations

import getpass
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterator, Protocol

import requests

from gpuledger.analytics.windows import utc_now
from gpuledger.analytics.records import records
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import (
    Audit,
    AuditEntry,
    AuditLog,
    Role,
    audit_report,
    create_token,
    list_tokens,
    revoke_token,
    token_info,
)
from gpuledger.collector.errors import GpuledgerError, InputError


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container user with no name
        return f"uid{os.getuid()}"


LOCAL_ACTOR = f"cli:{_os_user()}"  # who wrote on the file: the person at the server's console
LOCAL_REMOTE = "local"


class UnknownToken(InputError):
    """No live token has the id given."""


def local_entry(action: str, target: str, detail: dict[str, Any] | None = None, status: int = 200) -> AuditEntry:
    """An audit entry for a command run on the database file."""
    return AuditEntry(actor=LOCAL_ACTOR, role="admin", action=action, target=target, status=status,
                      remote=LOCAL_REMOTE, detail=detail)


def _refused_status(exc: GpuledgerError) -> int:
    """The HTTP status the API would answer the same refusal with."""
    from gpuledger.policies.recommender import DecisionError, UnknownRecommendation
    if isinstance(exc, (UnknownRecommendation, UnknownToken)):
        return 404
    if isinstance(exc, DecisionError):
        return 409
    return getattr(exc, "http_status", 400)


@contextmanager
def local_audit(store: Store, action: str, target: str, detail: dict[str, Any] | None = None) -> Iterator[Audit]:
    """The audit of one write on the file: the `Audit` its transaction commits the entry with; a refusal
    (a GpuledgerError raised inside) gets an entry with the status the API would answer, then propagates."""
    log = AuditLog(store, flush_every_s=None)
    try:
        yield Audit(log, local_entry(action, target, detail))
    except GpuledgerError as exc:
        log.append(local_entry(action, target, {**(detail or {}), "refused": str(exc)}, _refused_status(exc)))
        raise
    finally:
        log.close()


def refusal(response: requests.Response) -> str:
    """Why the server refused: its `detail`, else the start of the body."""
    try:
        return str(response.json().get("detail"))
    except (ValueError, AttributeError):
        return response.text[:300]


class TokenAdmin(Protocol):
    """Where tokens and the audit log are kept: the file itself or a server's API."""

    def create(self, name: str, role: str, expires_in: timedelta | None = None) -> dict[str, Any]: ...

    def list(self, revoked: bool) -> list[dict[str, Any]]: ...

    def revoke(self, token_id: str) -> dict[str, Any]: ...

    def audit(self, since: datetime | None, limit: int) -> dict[str, Any]: ...


@dataclass
class LocalAdmin:
    """Tokens in a database file no server holds."""

    store: Store

    def create(self, name: str, role: str, expires_in: timedelta | None = None) -> dict[str, Any]:
        with local_audit(self.store, "token create", name, {"name": name, "role": role}) as audit:
            identity, token = create_token(self.store, name, Role.parse(role), LOCAL_ACTOR, audit=audit,
                                           expires=utc_now() + expires_in if expires_in else None)
        return {**token_info(self.store, identity.id), "token": token}

    def list(self, revoked: bool) -> list[dict[str, Any]]:
        return records(list_tokens(self.store, revoked))

    def revoke(self, token_id: str) -> dict[str, Any]:
        with local_audit(self.store, "token revoke", token_id, {"token": token_id}) as audit:
            if not revoke_token(self.store, token_id, LOCAL_ACTOR, audit=audit):
                raise UnknownToken(f"no live token with id {token_id!r}; see `gpuledger token list`")
        return token_info(self.store, token_id)

    def audit(self, since: datetime | None, limit: int) -> dict[str, Any]:
        return audit_report(self.store, since, None, limit)


@dataclass
class RemoteAdmin:
    """Tokens on a running server, through its API."""

    server: str
    token: str
    ca: str | None = None

    def call(self, method: str, path: str, timeout: float = 30, headers: dict[str, str] | None = None,
             text: bool = False, binary: bool = False, **kwargs: Any) -> Any:
        """The server's answer to one request: its JSON (or its body as text, `text`, or as bytes, `binary`); a
        refusal raises with the server's reason."""
        try:
            response = requests.request(method, self.server.rstrip("/") + path, timeout=timeout,
                                        verify=self.ca or True,
                                        headers={**(headers or {}),
                                                 **({"Authorization": f"Bearer {self.token}"} if self.token else {})},
                                        **kwargs)
        except requests.RequestException as exc:
            raise GpuledgerError(f"cannot reach {self.server}: {exc}") from exc
        if not response.ok:
            raise GpuledgerError(f"{self.server} refused ({response.status_code}): {refusal(response)}")
        if binary:
            return response.content
        return response.text if text else response.json()

    def create(self, name: str, role: str, expires_in: timedelta | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "role": role}
        if expires_in:
            body["expires_in_days"] = expires_in.total_seconds() / 86400
        return self.call("POST", "/v1/tokens", json=body)

    def list(self, revoked: bool) -> list[dict[str, Any]]:
        return self.call("GET", "/v1/tokens", params={"revoked": revoked})

    def revoke(self, token_id: str) -> dict[str, Any]:
        return self.call("DELETE", f"/v1/tokens/{token_id}")

    def audit(self, since: datetime | None, limit: int) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if since:
            params["since"] = since.isoformat()
        return self.call("GET", "/v1/audit", params=params)


def run_token(admin: TokenAdmin, action: str, name: str | None, role: str | None, token_id: str | None,
              revoked: bool, as_json: bool, echo: Any = print, note: Any = print,
              expires_in: timedelta | None = None) -> int:
    """One `gpuledger token` action; `echo` gets what a script reads (the token, the table), `note` the rest."""
    if action == "create":
        made = admin.create(name or role.replace(":", "-"), role, expires_in)
        until = f", expires {made['expires']}" if made.get("expires") else ""
        note(f"token {made['id']} ({made['name']}, role {made['role']}{until}); shown once, stored as a hash:")
        echo(made["token"])
    elif action == "list":
        rows = admin.list(revoked)
        if as_json:
            echo(json.dumps(rows, indent=2, default=str))
        elif not rows:
            note("no tokens yet: `gpuledger token create --role admin --name you`")
        for r in [] if as_json else rows:
            state = f"revoked {r['revoked']}" if r.get("revoked") else "live"
            until = f", expires {r['expires']}" if r.get("expires") else ""
            used = f", last used {r['last_used']}" if r.get("last_used") else ", never used"
            echo(f"{r['id']}  {r['role']:<24} {r['name']:<24} made {r['created']} by {r['created_by']}  "
                 f"{state}{until}{used}")
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
        echo("chain intact" + (f" (HMAC-keyed from entry {log['keyed_from']})" if log.get("keyed_from") else "")
             if log["intact"] else "chain BROKEN"
             + (f" at entry {log['first_broken']}" if log["first_broken"] is not None else "")
             + f": {log.get('reason') or 'edited or removed'}")
    return 0 if log["intact"] else 1
