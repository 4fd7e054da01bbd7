"""Who may use the API, and what they did: API tokens (stored as hashes) and the append-only audit log.

A token is shown once, when it is made: `glt_<id>_<secret>`. The store keeps the id, the role and a SHA-256 of
the secret, never the secret; the secret carries 256 random bits, so a plain hash is enough (a slow password
hash protects guessable secrets, which these are not).

The audit log is append-only by construction: nothing in gpuledger updates or deletes its rows, and each row
carries the SHA-256 of the row before it and of itself, so an edit or a removal made outside gpuledger breaks
the chain where it happened (`verify_audit`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pandas as pd

from gpuledger.analytics.records import records
from gpuledger.analytics.windows import utc_now

if TYPE_CHECKING:
    from gpuledger.analytics.store.database import Store

DDL = [
    # one row per token ever made; revoking sets `revoked`, so the log's actors stay resolvable
    """CREATE TABLE IF NOT EXISTS api_tokens (
    id VARCHAR NOT NULL, name VARCHAR NOT NULL, role VARCHAR NOT NULL, secret_sha256 VARCHAR NOT NULL,
    created TIMESTAMPTZ NOT NULL, created_by VARCHAR NOT NULL, revoked TIMESTAMPTZ, revoked_by VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS audit_log (
    seq BIGINT NOT NULL, ts TIMESTAMPTZ NOT NULL, actor VARCHAR NOT NULL, role VARCHAR NOT NULL,
    action VARCHAR NOT NULL, target VARCHAR NOT NULL, status INTEGER NOT NULL, remote VARCHAR,
    detail JSON, prev_sha256 VARCHAR NOT NULL, sha256 VARCHAR NOT NULL)""",
]

log = logging.getLogger(__name__)
PREFIX = "glt"
_TOKEN = re.compile(rf"^{PREFIX}_([0-9a-f]{{12}})_([A-Za-z0-9_-]{{43}})$")
NAME = re.compile(r"^[A-Za-z0-9._:@-]{1,253}$")  # team, node and token names: what the API's headers admit
ROLES = ("admin", "reader", "team", "agent")
GENESIS = "0" * 64


class AccessError(ValueError):
    """A role or token name that gpuledger does not accept."""


@dataclass(frozen=True)
class Role:
    """`admin` (everything), `reader` (every read), `team:<name>` (its own team's data and cluster totals) or
    `agent:<node>` (pushes as that node, nothing else)."""

    kind: str
    scope: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Role":
        kind, _, scope = text.partition(":")
        if kind not in ROLES:
            raise AccessError(f"unknown role {text!r}: use admin, reader, team:<team> or agent:<node>")
        if kind in ("team", "agent"):
            if not NAME.match(scope):
                raise AccessError(f"role {kind}: needs a {'team' if kind == 'team' else 'node'} name after "
                                  f"'{kind}:' (letters, digits, . _ : @ -)")
            return cls(kind, scope)
        if scope:
            raise AccessError(f"role {kind} takes no scope (got {text!r})")
        return cls(kind)

    def __str__(self) -> str:
        return f"{self.kind}:{self.scope}" if self.scope else self.kind


@dataclass(frozen=True)
class Identity:
    """A resolved token: its id (for the audit log), its name and its role."""

    id: str
    name: str
    role: Role


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def create_token(store: "Store", name: str, role: Role, created_by: str) -> tuple[Identity, str]:
    """A new token: its identity and the token text, which exists only in this return value."""
    if not NAME.match(name):
        raise AccessError(f"token name {name!r}: letters, digits, . _ : @ - and at most 253 characters")
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    with store.transaction() as cur:
        cur.execute("INSERT INTO api_tokens VALUES (?, ?, ?, ?, ?, ?, NULL, NULL)",
                    [token_id, name, str(role), _sha256(secret), utc_now(), created_by])
    return Identity(token_id, name, role), f"{PREFIX}_{token_id}_{secret}"


def find_token(store: "Store", text: str) -> Identity | None:
    """The live token `text` is, or None (malformed, unknown, wrong secret or revoked)."""
    match = _TOKEN.match(text)
    if not match:
        return None
    token_id, secret = match.groups()
    rows = store.query("SELECT name, role, secret_sha256 FROM api_tokens WHERE id = ? AND revoked IS NULL",
                       [token_id])
    if rows.empty or not secrets.compare_digest(rows["secret_sha256"].iloc[0], _sha256(secret)):
        return None
    return Identity(token_id, rows["name"].iloc[0], Role.parse(rows["role"].iloc[0]))


def list_tokens(store: "Store", revoked: bool = False) -> pd.DataFrame:
    """Every token (without its hash), newest first; revoked ones only when asked."""
    return store.query("""SELECT id, name, role, created, created_by, revoked, revoked_by FROM api_tokens
                          WHERE $revoked OR revoked IS NULL ORDER BY created DESC, id""", {"revoked": revoked})


def token_info(store: "Store", token_id: str) -> dict[str, Any]:
    """One token as `list_tokens` shows it (revoked or not), for the answer to making or revoking it."""
    found = list_tokens(store, revoked=True)
    return records(found[found["id"] == token_id])[0]


def revoke_token(store: "Store", token_id: str, by: str) -> bool:
    """Revoke a live token; False when no live token has that id."""
    with store.transaction() as cur:
        cur.execute("UPDATE api_tokens SET revoked = ?, revoked_by = ? WHERE id = ? AND revoked IS NULL",
                    [utc_now(), by, token_id])
        return int(cur.fetchone()[0]) > 0


@dataclass(frozen=True)
class AuditEntry:
    """One write or decision: who (actor and role), what (action on target, with detail), when, from where, and
    how it ended (the HTTP status)."""

    actor: str
    role: str
    action: str
    target: str
    status: int
    remote: str | None = None
    detail: dict[str, Any] | None = None


AUDIT_COLUMNS = ["seq", "ts", "actor", "role", "action", "target", "status", "remote", "detail", "prev_sha256",
                 "sha256"]
MAX_WAITING = 100_000  # entries held while the store cannot write; past it the oldest are dropped, counted


class AuditLog:
    """Appends entries to the audit_log table, chaining each to the one before (one lock, so the chain is a line
    even with many request threads).

    `append(entry)` writes at once (decisions, tokens, backups: durable before the answer). `append(entry,
    wait=False)` only queues it: a flush thread writes what queued once a second in one transaction, so a hundred
    agents pushing (and retrying) cost the store one small commit a second, not one per push. An entry the store
    cannot take (a full disk) stays queued and goes in, in order, with the next write that succeeds."""

    def __init__(self, store: "Store", flush_every_s: float = 1.0) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._waiting: list[tuple[AuditEntry, datetime]] = []
        self.dropped = 0
        last = store.query("SELECT seq, sha256 FROM audit_log ORDER BY seq DESC LIMIT 1")
        self._seq = int(last["seq"].iloc[0]) if not last.empty else 0
        self._prev = last["sha256"].iloc[0] if not last.empty else GENESIS
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, args=(flush_every_s,), name="audit", daemon=True)
        self._flusher.start()

    def append(self, entry: AuditEntry, at: datetime | None = None, wait: bool = True) -> None:
        """Queue `entry` and, with `wait`, write everything queued now. Raises what the store raised when it cannot
        write; the entries stay queued."""
        with self._lock:
            self._waiting.append((entry, at or utc_now()))
            if len(self._waiting) > MAX_WAITING:
                self.dropped += len(self._waiting) - MAX_WAITING
                del self._waiting[: len(self._waiting) - MAX_WAITING]
        if wait:
            self.flush()

    def flush(self) -> int:
        """Write every queued entry in one transaction; the last sequence number written."""
        with self._lock:
            if not self._waiting:
                return self._seq
            seq, prev, rows = self._seq, self._prev, []
            for entry, when in self._waiting:
                seq += 1
                detail = json.dumps(entry.detail, sort_keys=True, default=str) if entry.detail is not None else None
                digest = _sha256(_chained(prev, seq, when, entry.actor, entry.role, entry.action, entry.target,
                                          entry.status, entry.remote, detail))
                rows.append([seq, when, entry.actor, entry.role, entry.action, entry.target, entry.status,
                             entry.remote, detail, prev, digest])
                prev = digest
            frame = pd.DataFrame(rows, columns=AUDIT_COLUMNS)
            with self.store.transaction() as cur:
                cur.register("audit_rows", frame)
                cur.execute("INSERT INTO audit_log SELECT seq, ts, actor, role, action, target, status, remote, "
                            "detail::JSON, prev_sha256, sha256 FROM audit_rows")
                cur.unregister("audit_rows")
            self._seq, self._prev, self._waiting = seq, prev, []
            return seq

    def _flush_loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - kept queued; the next second tries again
                log.error("audit log: %d entr(ies) kept in memory, not yet written: %s", self.waiting, exc)

    def close(self) -> None:
        """Stop the flush thread and write what is queued (a failure is logged; the entries are then lost)."""
        self._stop.set()
        self._flusher.join(timeout=10)
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001
            log.error("audit log: %d entr(ies) not written at shutdown: %s", self.waiting, exc)

    @property
    def waiting(self) -> int:
        """Entries not yet written."""
        return len(self._waiting)


def _chained(prev: str, seq: int, at: datetime, *fields: object) -> str:
    """The text a row's hash covers: the previous hash, its sequence number, its instant (µs since the epoch, as
    stored) and its fields."""
    micros = round(pd.Timestamp(at).timestamp() * 1_000_000)
    return json.dumps([prev, seq, micros, *fields], default=str)


def audit_report(store: "Store", since: datetime | None = None, actor: str | None = None,
                 limit: int = 1000) -> dict[str, Any]:
    """The audit log as the API and `gpuledger audit` show it: whether its chain is intact (else the first broken
    entry) and the entries, newest first, optionally since an instant or by one actor, their detail parsed."""
    broken = verify_audit(store)
    entries = records(store.query(
        """SELECT seq, ts, actor, role, action, target, status, remote, detail FROM audit_log
           WHERE ($since IS NULL OR ts >= $since) AND ($actor IS NULL OR actor = $actor)
           ORDER BY seq DESC LIMIT $limit""", {"since": since, "actor": actor, "limit": limit}))
    for entry in entries:
        if isinstance(entry["detail"], str):
            entry["detail"] = json.loads(entry["detail"])
    return {"intact": broken is None, "first_broken": broken, "entries": entries}


def verify_audit(store: "Store") -> int | None:
    """The sequence number of the first row whose chain is broken (edited, removed or reordered), or None when the
    whole log is intact."""
    rows = store.query("""SELECT seq, ts, actor, role, action, target, status, remote, CAST(detail AS VARCHAR)
                          AS detail, prev_sha256, sha256 FROM audit_log ORDER BY seq""")
    prev, expected_seq = GENESIS, 1
    for row in rows.itertuples(index=False):
        digest = _sha256(_chained(prev, int(row.seq), row.ts, row.actor, row.role, row.action, row.target,
                                  int(row.status), None if pd.isna(row.remote) else row.remote,
                                  None if pd.isna(row.detail) else row.detail))
        if row.seq != expected_seq or row.prev_sha256 != prev or row.sha256 != digest:
            return int(row.seq)
        prev, expected_seq = digest, expected_seq + 1
    return None
