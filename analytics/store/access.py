"""Who may use the API, and what they did: API tokens (stored as hashes) and the append-only audit log.

A token is shown once, when it is made: `glt_<id>_<secret>`. The store keeps the id, the role and a SHA-256 of
the secret, never the secret; the secret carries 256 random bits, so a plain hash is enough (a slow password
hash protects guessable secrets, which these are not).

The audit log is append-only by construction: nothing in gpuledger updates or deletes its rows, and each row
carries the MAC of the row before it and its own, HMAC-SHA256 with a key kept outside the database
(`<db>.audit-key`, or $GPULEDGER_AUDIT_KEY_FILE): whoever can rewrite the database file cannot rehash the chain
without the key. The last entry is anchored outside the database too (`<db>.audit-head`, rewritten after each
write, and logged), so a truncated or emptied log shows although what is left chains (`check_audit`). Rows
written before keying keep their plain SHA-256 chain, which the first keyed row seals.

A write and its audit entry commit in one transaction (`audited_write`), so no write is stored without its
entry, whatever happens to the request afterwards.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import duckdb
import pandas as pd

from gpuledger.analytics.records import records
from gpuledger.analytics.store import lake
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import GpuledgerError, InputError, NotFoundError

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
    # access reviews: when a token stops working (null: never) and when it was last used (null: never)
    "ALTER TABLE api_tokens ADD COLUMN IF NOT EXISTS expires TIMESTAMPTZ",
    "ALTER TABLE api_tokens ADD COLUMN IF NOT EXISTS last_used TIMESTAMPTZ",
]

log = logging.getLogger(__name__)
PREFIX = "glt"
_TOKEN = re.compile(rf"^{PREFIX}_([0-9a-f]{{12}})_([A-Za-z0-9_-]{{43}})$")
NAME = re.compile(r"^[A-Za-z0-9._:@-]{1,253}$")  # team, node and token names: what the API's headers admit
ROLES = ("admin", "reader", "team", "agent")
GENESIS = "0" * 64


class AccessError(InputError):
    """A role or token name that gpuledger does not accept (422 in the API, one line and exit code 2 in the CLI)."""


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
    expires: datetime | None = None  # after this the token is refused like a revoked one


class UnknownTeam(NotFoundError):
    """A team the store does not know (404 in the API, one line and exit code 2 in the CLI)."""


def require_team(store: "Store", team: str | None) -> str | None:
    """`team` when the store knows it (a share in the teams table, or any GPU usage recorded: `Store.teams`), None
    for None; else UnknownTeam naming it. The one rule for every route with a team parameter and for team tokens."""
    if team is not None and team not in store.teams():
        raise UnknownTeam(f"unknown team {team!r}: it has no share in the config's [teams] and no GPU usage "
                          "recorded; GET /v1/teams lists the known teams")
    return team


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def create_token(store: "Store", name: str, role: Role, created_by: str,
                 audit: "Audit | None" = None, expires: datetime | None = None) -> tuple[Identity, str]:
    """A new token: its identity and the token text, which exists only in this return value. With `audit`, its
    entry commits with it. `expires`: when it stops working (regulated sites review and rotate access)."""
    if expires is not None and expires <= utc_now():
        raise AccessError(f"a token's expiry must be in the future, got {expires.isoformat()}")
    if not NAME.match(name):
        raise AccessError(f"token name {name!r}: letters, digits, . _ : @ - and at most 253 characters")
    if role.kind == "team":
        require_team(store, role.scope)  # a token for a misspelt team would see nothing, silently
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    with audited_write(store, audit) as tx:
        tx.cursor.execute("INSERT INTO api_tokens (id, name, role, secret_sha256, created, created_by, expires) "
                          "VALUES (?, ?, ?, ?, ?, ?, ?)",
                          [token_id, name, str(role), _sha256(secret), utc_now(), created_by, expires])
        tx.record(token=token_id, name=name, role=str(role),
                  **({"expires": expires.isoformat()} if expires is not None else {}))
    return Identity(token_id, name, role, expires), f"{PREFIX}_{token_id}_{secret}"


def find_token(store: "Store", text: str) -> Identity | None:
    """The live token `text` is, or None (malformed, unknown, wrong secret, revoked or expired)."""
    match = _TOKEN.match(text)
    if not match:
        return None
    token_id, secret = match.groups()
    rows = store.query("SELECT name, role, secret_sha256, expires FROM api_tokens WHERE id = ? AND revoked IS NULL "
                       "AND (expires IS NULL OR expires > ?)", [token_id, utc_now()])
    if rows.empty or not secrets.compare_digest(rows["secret_sha256"].iloc[0], _sha256(secret)):
        return None
    expires = rows["expires"].iloc[0]
    return Identity(token_id, rows["name"].iloc[0], Role.parse(rows["role"].iloc[0]),
                    None if pd.isna(expires) else pd.Timestamp(expires).to_pydatetime())


def record_use(store: "Store", token_id: str, at: datetime) -> None:
    """Note that a token was used at `at` (the API does so at most once per token per cache period): an access
    review lists the tokens nobody uses."""
    with store.transaction() as cur:
        cur.execute("UPDATE api_tokens SET last_used = ? WHERE id = ? AND (last_used IS NULL OR last_used < ?)",
                    [at, token_id, at])


def list_tokens(store: "Store", revoked: bool = False) -> pd.DataFrame:
    """Every token (without its hash), newest first; revoked ones only when asked."""
    return store.query("""SELECT id, name, role, created, created_by, revoked, revoked_by, expires, last_used
                          FROM api_tokens WHERE $revoked OR revoked IS NULL ORDER BY created DESC, id""",
                       {"revoked": revoked})


def token_info(store: "Store", token_id: str) -> dict[str, Any]:
    """One token as `list_tokens` shows it (revoked or not), for the answer to making or revoking it."""
    found = list_tokens(store, revoked=True)
    return records(found[found["id"] == token_id])[0]


def revoke_token(store: "Store", token_id: str, by: str, audit: "Audit | None" = None) -> bool:
    """Revoke a live token; False when no live token has that id (nothing written, no entry: the caller audits
    the refusal). With `audit`, its entry commits with the revocation."""
    with audited_write(store, audit) as tx:
        tx.cursor.execute("UPDATE api_tokens SET revoked = ?, revoked_by = ? WHERE id = ? AND revoked IS NULL",
                          [utc_now(), by, token_id])
        done = int(tx.cursor.fetchone()[0]) > 0
        if done:
            tx.record(token=token_id)
        return done


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
KEY_ENV = "GPULEDGER_AUDIT_KEY_FILE"
KEYED_FROM = "audit_keyed_from"
MARKER = "audit_keyed"  # in the detail of the first entry chained by HMAC: the id of the key that chains it  # meta key: the first entry chained by HMAC (older ones keep their SHA-256 chain)
LAKE_FILES = Path("gpuledger-data/lake")  # a DuckLake catalog has no file to put the key and head beside
HEAD_LOG_EVERY_S = 60.0  # the head is logged at least this often while entries are written, and after each decision
MAX_INCIDENTS = 20


class AuditKeyError(GpuledgerError):
    """The audit key or head anchor cannot be read or made (a missing key for a keyed store, a malformed file)."""


@dataclass(frozen=True)
class AuditFiles:
    """Where a store's audit key and head anchor live: outside the database, so that whoever can rewrite the
    database file (and so rehash a plain SHA-256 chain) can neither forge a MAC nor hide a truncation."""

    key: Path
    head: Path

    @classmethod
    def of(cls, db: str | Path) -> "AuditFiles":
        """`<db>.audit-key` (or $GPULEDGER_AUDIT_KEY_FILE, to keep it elsewhere) and `<db>.audit-head`."""
        base = LAKE_FILES if lake.is_lake(str(db)) else Path(db)
        env = os.environ.get(KEY_ENV)
        return cls(Path(env) if env else base.with_name(base.name + ".audit-key"),
                   base.with_name(base.name + ".audit-head"))

    def discard(self) -> None:
        """Remove the head anchor, and the key where it lives beside the database (not a shared
        $GPULEDGER_AUDIT_KEY_FILE): for a database that is itself removed and made anew (the demo's), so its new
        chain starts with a head of its own rather than one that names entries the new log never had."""
        self.head.unlink(missing_ok=True)
        if not os.environ.get(KEY_ENV):
            self.key.unlink(missing_ok=True)

    def read_key(self) -> bytes | None:
        """The key, or None when its file does not exist."""
        try:
            lines = self.key.read_text().strip().splitlines()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise AuditKeyError(f"cannot read the audit key {self.key}: {exc}") from exc
        try:
            key = bytes.fromhex(lines[0] if lines else "")
        except ValueError:
            key = b""
        if len(key) < 16:
            raise AuditKeyError(f"{self.key} is not a gpuledger audit key (64 hex digits)")
        return key

    def key_or_create(self, level: int = logging.WARNING) -> bytes:
        """The key, made (256 random bits, mode 0600) when its file does not exist yet; its creation is logged at
        `level` (a warning where a store with history gets a key, news for a new store such as the demo's)."""
        key = self.read_key()
        if key is not None:
            return key
        self.key.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first
            return self.read_key() or b""
        except OSError as exc:
            raise AuditKeyError(f"cannot create the audit key {self.key}: {exc}") from exc
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        log.log(level, "audit key created at %s (mode 0600): keep it with the database and its backups; without "
                "it neither the audit log nor a backup's manifest can be checked", self.key)
        return self.read_key() or b""


    def keyed_from(self) -> int | None:
        """The first entry chained with this key, as recorded with the key itself (its file's second line); None
        for a key recorded before keys carried it. Why with the key: the meta row and the head file can both be
        deleted by whoever can write the database's folder, after which a log rehashed with plain SHA-256 looked
        intact; the key file is the one thing such a downgrade cannot do without."""
        keying = self.keying()
        return int(keying["keyed_from"]) if keying else None

    def keying(self) -> dict[str, Any] | None:
        """The key file's keying line: `keyed_from`, `key_id` and `marked` (the entry keyed_from carries the key's
        id in its detail, `audit_keyed`, so the chain itself says where keying began); None without one."""
        try:
            lines = self.key.read_text().strip().splitlines()
        except OSError:
            return None
        try:
            found = json.loads(lines[1]) if len(lines) > 1 else None
            if found is not None:
                int(found["keyed_from"])
            return found
        except (ValueError, KeyError, TypeError) as exc:
            raise AuditKeyError(f"{self.key}: its keying line is damaged ({exc})") from exc

    def record_keyed_from(self, key: bytes, keyed_from: int, marked: bool = False) -> None:
        """Write `keyed_from` (and the key's id, and whether that entry carries the marker) beside the key,
        atomically and with the key file's mode 0600."""
        tmp = self.key.with_name(self.key.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        line = {"keyed_from": keyed_from, "key_id": key_id(key), "marked": marked}
        with os.fdopen(fd, "w") as handle:
            handle.write(key.hex() + "\n" + json.dumps(line) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.key)


def key_id(key: bytes) -> str:
    """A short name for a key that reveals nothing of it, to say which key signed a backup."""
    return hashlib.sha256(b"gpuledger key id\0" + key).hexdigest()[:12]


def mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Head:
    """The last entry the log had written (its sequence number and MAC), where HMAC chaining started, and the
    breaks found when the log was opened; kept in a file outside the database and MACed, so a truncated, emptied
    or rewritten log shows even though its remaining rows chain."""

    seq: int
    mac: str
    keyed_from: int
    incidents: tuple[str, ...] = ()

    def _body(self) -> str:
        return json.dumps([self.seq, self.mac, self.keyed_from, list(self.incidents)])

    def write(self, path: Path, key: bytes) -> None:
        """Replace the head file atomically (temp file, fsync, rename)."""
        text = json.dumps({"seq": self.seq, "mac": self.mac, "keyed_from": self.keyed_from,
                           "incidents": list(self.incidents), "check": mac(key, self._body())}) + "\n"
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path, key: bytes) -> "Head | None":
        """The head in `path`, None when there is none; AuditKeyError when it was not written with `key`."""
        try:
            data = json.loads(path.read_text())
            head = cls(int(data["seq"]), str(data["mac"]), int(data["keyed_from"]),
                       tuple(str(i) for i in data.get("incidents", [])))
            check = str(data["check"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise AuditKeyError(f"the audit head anchor {path} is damaged: {exc}") from exc
        if not hmac.compare_digest(check, mac(key, head._body())):
            raise AuditKeyError(f"the audit head anchor {path} was not written with this audit key (forged, or "
                                "another site's)")
        return head


@dataclass
class AuditedWrite:
    """A store transaction (`cursor`) whose audit entries commit with it: a write and its entry land together or
    not at all."""

    cursor: duckdb.DuckDBPyConnection
    template: AuditEntry | None = None
    entries: list[AuditEntry] = field(default_factory=list)
    on_commit: Callable[[], None] | None = None

    def record(self, **detail: Any) -> None:
        """Add this write's entry (the caller's template, with `detail` merged into its detail)."""
        if self.template is not None:
            self.entries.append(replace(self.template, detail={**(self.template.detail or {}), **detail}))


@dataclass(frozen=True)
class Audit:
    """Who is writing, for the entry a write commits with: the log, the entry (its detail is completed by the
    write), and what to do once it is committed (the API marks the request as audited)."""

    log: "AuditLog"
    entry: AuditEntry
    on_commit: Callable[[], None] | None = None


@contextmanager
def audited_write(store: "Store", audit: Audit | None) -> Iterator[AuditedWrite]:
    """A transaction on `store`; with `audit`, the entries the write records commit in the same transaction."""
    if audit is None:
        with store.transaction() as cur:
            yield AuditedWrite(cur)
        return
    with audit.log.transaction() as tx:
        tx.template, tx.on_commit = audit.entry, audit.on_commit
        yield tx


Producer = Callable[[], list[AuditEntry]]


class AuditLog:
    """Appends entries to the audit_log table, chaining each to the one before by HMAC-SHA256 with a key kept
    outside the database, and anchoring the last one in a head file beside it (one lock, so the chain is a line
    even with many request threads).

    Writes and their entries commit together: `with log.transaction() as tx` gives a cursor inside a store
    transaction, and what `tx.record` holds is inserted in it (decisions, tokens, restores). `append(entry)` writes
    an entry by itself at once (refusals, backups); `append(entry, wait=False)` only queues it: a flush thread
    writes what queued once a second in one transaction, so a hundred agents pushing (and retrying) cost the store
    one small commit a second, not one per push (a kill -9 loses at most that second of push entries). An entry
    the store cannot take (a full disk) stays queued and goes in, in order, with the next write that succeeds.

    A store written before keying keeps its SHA-256 chain up to the entry before `keyed_from`; from there on
    entries are MACed. Opening the log checks the head against the store: a log that lost entries, or whose
    last entry changed, is recorded as an incident in the head (and logged), and stays reported as broken."""

    def __init__(self, store: "Store", flush_every_s: float | None = 1.0, files: AuditFiles | None = None) -> None:
        self.store = store
        self.files = files or AuditFiles.of(store.path)
        self._lock = threading.Lock()  # the chain: sequence, previous MAC, head file
        self._queue_lock = threading.Lock()  # only the list of waiting entries: queueing never waits on the store
        self._waiting: list[tuple[AuditEntry, datetime]] = []
        self.dropped = 0
        self.producers: list[Producer] = []  # called before each flush (refused reads, coalesced per minute)
        self._logged_at = 0.0
        self._head_level = logging.INFO if flush_every_s is not None else logging.DEBUG  # a server's log keeps it
        last = store.query("SELECT seq, sha256 FROM audit_log ORDER BY seq DESC LIMIT 1")
        self._seq = int(last["seq"].iloc[0]) if not last.empty else 0
        self._prev = last["sha256"].iloc[0] if not last.empty else GENESIS
        self._key, self._head = self._anchor()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if flush_every_s is not None:
            self._flusher = threading.Thread(target=self._flush_loop, args=(flush_every_s,), name="audit",
                                             daemon=True)
            self._flusher.start()

    def _anchor(self) -> tuple[bytes, Head]:
        """The key and the head, keying the store on first use; a head that disagrees with the store becomes an
        incident (kept in the head, so the break stays visible after the next entries are written)."""
        keyed = self.store.meta(KEYED_FROM)
        key = self.files.read_key()
        if key is None and keyed is not None:
            raise AuditKeyError(f"the audit log is keyed from entry {keyed} but its key {self.files.key} is missing: "
                                f"put the key file back (or point ${KEY_ENV} at it)")
        # a log without entries yet (a new store) is keyed from its first entry on: news, not a warning
        news = logging.INFO if self._seq == 0 else logging.WARNING
        key = key if key is not None else self.files.key_or_create(news)
        try:
            head = Head.read(self.files.head, key)
        except AuditKeyError as exc:
            head = Head(self._seq, self._prev, int(keyed or self._seq + 1), (f"at open: {exc}",))
            self._incident(str(exc))
        if head is None:
            if keyed is None:
                head = Head(self._seq, self._prev, self._seq + 1)
                self.store.set_meta(KEYED_FROM, str(head.keyed_from))
                log.log(news, "audit log keyed with HMAC-SHA256 from entry %d on (entries before it keep their "
                        "SHA-256 chain); head anchor %s", head.keyed_from, self.files.head)
            else:
                reason = f"at open: the head anchor {self.files.head} was missing (entries {keyed}..{self._seq})"
                head = Head(self._seq, self._prev, int(keyed), (reason,))
                self._incident(reason)
        else:
            reason = self._disagreement(head)
            if reason:
                head = replace(head, incidents=(head.incidents + (f"at open: {reason}",))[-MAX_INCIDENTS:])
                self._incident(reason)
            if keyed is None or int(keyed) != head.keyed_from:
                self.store.set_meta(KEYED_FROM, str(head.keyed_from))
            head = replace(head, seq=self._seq, mac=self._prev)
        head.write(self.files.head, key)
        if self.files.keyed_from() is None:  # a new key, or one written before keys carried it
            try:  # an entry not written yet will carry the marker (`_insert`); one written before cannot
                self.files.record_keyed_from(key, head.keyed_from, marked=head.keyed_from > self._seq)
            except OSError as exc:  # a key mounted read-only (a Kubernetes secret): the head and meta row guard it
                log.warning("audit key %s: cannot record the keyed-from entry beside it (%s); write its second "
                            "line by hand to guard against a downgrade: %s", self.files.key, exc,
                            json.dumps({"keyed_from": head.keyed_from, "key_id": key_id(key)}))
        return key, head

    def _disagreement(self, head: Head) -> str | None:
        """Why the store disagrees with the head: entries missing, or the head's entry changed."""
        if head.seq > self._seq:
            return f"the head anchor names entry {head.seq} but the log ends at {self._seq}: truncated or emptied"
        if head.seq > 0:
            stored = self.store.scalar("SELECT sha256 FROM audit_log WHERE seq = ?", [head.seq])
            if stored != head.mac:
                return f"entry {head.seq} is not the one the head anchor names: rewritten"
        return None

    def _incident(self, reason: str) -> None:
        log.error("audit log of %s: %s", self.store.path, reason)

    @property
    def key(self) -> bytes:
        return self._key

    def append(self, entry: AuditEntry, at: datetime | None = None, wait: bool = True) -> None:
        """Queue `entry` and, with `wait`, write everything queued now. Raises what the store raised when it cannot
        write; the entries stay queued."""
        with self._queue_lock:
            self._waiting.append((entry, at or utc_now()))
            if len(self._waiting) > MAX_WAITING:
                self.dropped += len(self._waiting) - MAX_WAITING
                del self._waiting[: len(self._waiting) - MAX_WAITING]
        if wait:
            self.flush(notable=True)

    def _take(self) -> list[tuple[AuditEntry, datetime]]:
        with self._queue_lock:
            taken, self._waiting = self._waiting, []
        return taken

    def _give_back(self, taken: list[tuple[AuditEntry, datetime]]) -> None:
        with self._queue_lock:
            self._waiting[:0] = taken

    def _insert(self, cur: duckdb.DuckDBPyConnection, entries: list[tuple[AuditEntry, datetime]]) -> tuple[int, str]:
        """Insert `entries` after the chain's end through `cur`; the new end (adopted only once committed)."""
        seq, prev, rows = self._seq, self._prev, []
        for entry, when in entries:
            seq += 1
            values = entry.detail
            if seq == self._head.keyed_from:  # the first keyed entry names its key, under the chain's MAC
                values = {**(values or {}), MARKER: key_id(self._key)}
            detail = json.dumps(values, sort_keys=True, default=str) if values is not None else None
            digest = mac(self._key, _chained(prev, seq, when, entry.actor, entry.role, entry.action, entry.target,
                                             entry.status, entry.remote, detail))
            rows.append([seq, when, entry.actor, entry.role, entry.action, entry.target, entry.status,
                         entry.remote, detail, prev, digest])
            prev = digest
        frame = pd.DataFrame(rows, columns=AUDIT_COLUMNS)
        cur.register("audit_rows", frame)
        cur.execute("INSERT INTO audit_log SELECT seq, ts, actor, role, action, target, status, remote, "
                    "detail::JSON, prev_sha256, sha256 FROM audit_rows")
        cur.unregister("audit_rows")
        return seq, prev

    def _adopt(self, seq: int, prev: str, notable: bool) -> None:
        """The committed end of the chain: remembered, written to the head file, and logged (each notable write,
        else at most once a minute), so a copy of the head also lives in the server's log (a one-off command's
        log says it only at debug level: its head is in the file, and its terminal is no record)."""
        self._seq, self._prev = seq, prev
        self._head = replace(self._head, seq=seq, mac=prev)
        try:
            self._head.write(self.files.head, self._key)
        except OSError as exc:  # the entries are committed; a stale head only under-states the log
            log.error("audit head anchor %s not rewritten: %s", self.files.head, exc)
        if notable or time.monotonic() - self._logged_at >= HEAD_LOG_EVERY_S:
            self._logged_at = time.monotonic()
            log.log(self._head_level, "audit head: entry %d mac %s", seq, prev)

    def flush(self, notable: bool = False) -> int:
        """Write every queued entry in one transaction; the last sequence number written."""
        for produce in self.producers:
            for entry in produce():
                self.append(entry, wait=False)
        with self._lock:
            taken = self._take()
            if not taken:
                return self._seq
            try:
                with self.store.transaction() as cur:
                    seq, prev = self._insert(cur, taken)
            except BaseException:
                self._give_back(taken)
                raise
            self._adopt(seq, prev, notable)
            return seq

    @contextmanager
    def transaction(self) -> Iterator[AuditedWrite]:
        """A store transaction for a write; the entries it records (and any queued before them) commit in it."""
        with self.joined(notable=True) as write:
            with self.store.transaction() as cur:
                tx = AuditedWrite(cur)
                yield tx
                if tx.entries:
                    now = utc_now()
                    write(cur, [(e, now) for e in tx.entries])
        if tx.entries and tx.on_commit is not None:
            tx.on_commit()

    @contextmanager
    def joined(self, notable: bool = False) -> Iterator[Callable[[duckdb.DuckDBPyConnection,
                                                                   list[tuple[AuditEntry, datetime]]], None]]:
        """Hold the chain while a transaction commits entries with its write: this log's own (`transaction`), or
        another writer's (the ingest writer: a push's entry lands with its batches, so a kill -9 cannot keep the
        batches and lose the entry). Yields `write(cur, entries)`, called inside that transaction, which writes the
        queued entries and then `entries`; the chain's new end is adopted once it committed, and the entries taken
        from the queue go back to it if it did not."""
        with self._lock:
            taken: list[tuple[AuditEntry, datetime]] = []
            end: list[tuple[int, str]] = []

            def write(cur: duckdb.DuckDBPyConnection, entries: list[tuple[AuditEntry, datetime]]) -> None:
                taken[:] = self._take()
                end[:] = [self._insert(cur, taken + entries)]
            try:
                yield write
            except BaseException:
                self._give_back(taken)
                raise
            if end:
                self._adopt(*end[0], notable=notable)

    def _flush_loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - kept queued; the next second tries again
                log.error("audit log: %d entr(ies) kept in memory, not yet written: %s", self.waiting, exc)

    def close(self) -> None:
        """Stop the flush thread and write what is queued (a failure is logged; the entries are then lost)."""
        self._stop.set()
        if self._flusher is not None:
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


@dataclass(frozen=True)
class AuditCheck:
    """Whether the log is intact; else the first entry that is not (edited, removed, reordered, or past the
    end of a truncated log) and why."""

    first_broken: int | None
    reason: str | None
    keyed_from: int | None

    @property
    def intact(self) -> bool:
        return self.reason is None


def audit_report(store: "Store", since: datetime | None = None, actor: str | None = None,
                 limit: int = 1000, files: AuditFiles | None = None) -> dict[str, Any]:
    """The audit log as the API and `gpuledger audit` show it: whether its chain is intact (else the first broken
    entry and why) and the entries, newest first, optionally since an instant or by one actor, detail parsed."""
    check = check_audit(store, files)
    entries = records(store.query(
        """SELECT seq, ts, actor, role, action, target, status, remote, detail FROM audit_log
           WHERE ($since IS NULL OR ts >= $since) AND ($actor IS NULL OR actor = $actor)
           ORDER BY seq DESC LIMIT $limit""", {"since": since, "actor": actor, "limit": limit}))
    for entry in entries:
        if isinstance(entry["detail"], str):
            entry["detail"] = json.loads(entry["detail"])
    return {"intact": check.intact, "first_broken": check.first_broken, "reason": check.reason,
            "keyed_from": check.keyed_from, "entries": entries}


def check_audit(store: "Store", files: AuditFiles | None = None) -> AuditCheck:
    """Check the whole log: each entry's chain (SHA-256 before `keyed_from`, HMAC-SHA256 with the key from there
    on), then the head anchor (a log that ends before the entry it names was truncated or emptied; a different
    MAC there, rewritten), then the incidents recorded when the log was opened."""
    files = files or AuditFiles.of(store.path)
    keyed = store.meta(KEYED_FROM)
    key = files.read_key()
    head: Head | None = None
    if key is None:
        if keyed is not None or files.head.exists():
            return AuditCheck(int(keyed or 1), f"the audit key {files.key} is missing: the log cannot be checked",
                              int(keyed) if keyed else None)
    else:
        try:
            sealed = files.keyed_from()  # recorded with the key: what a deleted head or meta row cannot take away
            head = Head.read(files.head, key)  # read before the rows: every entry it names is committed by then
        except AuditKeyError as exc:
            return AuditCheck(int(keyed or 1), str(exc), int(keyed) if keyed else None)
        start = sealed or (int(keyed) if keyed else None) or (head.keyed_from if head else 1)
        if head is None:  # a key exists, so the log was anchored: a head that went away is no fresh start
            return AuditCheck(start, f"the head anchor {files.head} is missing", start)
        if sealed is not None and (keyed is None or int(keyed) != sealed or head.keyed_from != sealed):
            return AuditCheck(sealed, f"the log is keyed from entry {sealed} (recorded with the key) but the store "
                                      f"says {keyed or 'nothing'} and the head {head.keyed_from}: the keying marker "
                                      "was changed or removed", sealed)
    keyed_from = head.keyed_from if head else (int(keyed) if keyed else None)
    rows = store.query("""SELECT seq, ts, actor, role, action, target, status, remote, CAST(detail AS VARCHAR)
                          AS detail, prev_sha256, sha256 FROM audit_log ORDER BY seq""")
    prev, expected_seq, at_head = GENESIS, 1, None
    marked = key is not None and bool((files.keying() or {}).get("marked"))
    for row in rows.itertuples(index=False):
        text = _chained(prev, int(row.seq), row.ts, row.actor, row.role, row.action, row.target, int(row.status),
                        None if pd.isna(row.remote) else row.remote, None if pd.isna(row.detail) else row.detail)
        keyed_row = keyed_from is not None and key is not None and row.seq >= keyed_from
        if marked and row.seq == keyed_from and (pd.isna(row.detail) or json.loads(row.detail).get(MARKER)
                                                 != key_id(key)):
            return AuditCheck(int(row.seq), f"entry {row.seq}, the first chained with the key, lacks its marker: "
                                            "the keying was rewritten", keyed_from)
        digest = mac(key, text) if keyed_row else _sha256(text)
        if row.seq != expected_seq or row.prev_sha256 != prev or row.sha256 != digest:
            return AuditCheck(int(row.seq), f"entry {row.seq} was edited, removed or reordered"
                              + (" (its MAC does not match)" if keyed_row else ""), keyed_from)
        if head is not None and row.seq == head.seq:
            at_head = digest
        prev, expected_seq = digest, expected_seq + 1
    last = expected_seq - 1
    if head is not None:
        if head.seq > last:
            return AuditCheck(last + 1, f"the head anchor names entry {head.seq} but the log ends at {last}: "
                                        "truncated or emptied", keyed_from)
        if head.seq > 0 and at_head != head.mac:
            return AuditCheck(head.seq, f"entry {head.seq} is not the one the head anchor names: rewritten",
                              keyed_from)
        if head.incidents:
            return AuditCheck(None, "; ".join(head.incidents), keyed_from)
    return AuditCheck(None, None, keyed_from)


def verify_audit(store: "Store", files: AuditFiles | None = None) -> int | None:
    """The sequence number of the first entry whose chain is broken, or None when the whole log is intact (see
    `check_audit` for the reason)."""
    check = check_audit(store, files)
    if check.intact:
        return None
    return check.first_broken if check.first_broken is not None else 0


def audited_actions(path: str | Path) -> dict[str, int]:
    """Entries of a database file's audit log per action (decide, token create, ...), read without opening it for
    writing: what people did to it, for a caller about to discard it (the demo's re-run) to say so. Empty where the
    file has no audit log."""
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return {}
    try:
        rows = con.execute("SELECT action, count(*) FROM audit_log GROUP BY action ORDER BY action").fetchall()
    except duckdb.Error:
        rows = []
    finally:
        con.close()
    return {str(action): int(n) for action, n in rows}
