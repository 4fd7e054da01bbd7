"""Backups: a consistent snapshot of the whole store into a new DuckDB file, taken while the server keeps writing,
and its restore.

The snapshot is one `COPY FROM DATABASE` statement, so it reads a single transaction's view of every table (DuckDB
is MVCC): samples, rollups, ingest runs and the audit log agree with each other even while agents push. Writers
are not blocked. A manifest beside it (JSON) names the schema version, each table's row count and the file's
SHA-256, and is signed (HMAC-SHA256) with the site's audit key (analytics/store/access.py: `AuditFiles`): a
manifest rewritten to match a changed file (a planted admin token) does not restore, and a backup restores
where that key is (on another machine: copy the key file there first). Restore checks the signature, the hash,
every count and the schema version (an older store is brought up to date by the store's migrations, a newer one
refused), never overwrites the database it replaces (kept under a name of its own), and records itself in the
restored store's audit log.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from gpuledger.analytics.store.access import KEYED_FROM, KEY_ENV, AuditEntry, AuditFiles, AuditLog, Head, key_id
from gpuledger.analytics.store.schema import SCHEMA_VERSION
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import GpuledgerError

if TYPE_CHECKING:
    from gpuledger.analytics.store.database import Store

CHUNK = 1 << 20


class BackupError(GpuledgerError):
    """A backup that cannot be taken, or one that does not check out on restore."""


@dataclass(frozen=True)
class Manifest:
    """What a backup holds, to check it against before restoring; `signature` is an HMAC of the rest with the
    site's audit key (`key_id` names that key without revealing it)."""

    taken_at: str
    schema_version: str | None
    tables: dict[str, int]
    sha256: str
    bytes: int
    key_id: str | None = None
    signature: str | None = None

    def text(self, indent: int | None = None) -> str:
        """The manifest as JSON: the file beside a backup (indented), and the header a server sends one with."""
        return json.dumps(asdict(self), indent=indent)

    def _signed_text(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k != "signature"}, sort_keys=True)

    def signed(self, key: bytes) -> "Manifest":
        unsigned = replace(self, key_id=key_id(key), signature=None)
        return replace(unsigned, signature=hmac.new(key, unsigned._signed_text().encode(), hashlib.sha256).hexdigest())

    def check_signature(self, key: bytes | None, files: AuditFiles) -> None:
        """Raise BackupError unless this manifest was signed with `key`, saying what to do."""
        if not self.signature:
            raise BackupError("the backup's manifest is not signed (taken by a gpuledger before signing, or its "
                              "signature removed): it cannot be told from a forged one")
        if key is None:
            raise BackupError(f"no audit key at {files.key} to check the manifest's signature: a backup restores "
                              f"where the key of the site that took it is; copy that key file to {files.key} (or "
                              f"point ${KEY_ENV} at it)")
        if self.key_id != key_id(key):
            raise BackupError(f"the backup was signed with audit key {self.key_id}, this site's key {files.key} is "
                              f"{key_id(key)}: copy the key file of the site that took it (or point ${KEY_ENV} at it)")
        expected = hmac.new(key, self._signed_text().encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, self.signature):
            raise BackupError("the backup's manifest does not match its signature: rewritten since it was taken")

    def write(self, path: Path) -> None:
        path.write_text(self.text(indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> "Manifest":
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise BackupError(f"{path} is not a gpuledger backup manifest: {exc}") from exc


@dataclass(frozen=True)
class Restored:
    """What a restore did: the backup's manifest, where the database it replaced was kept, and the schema it was
    brought up from (None when it was current)."""

    manifest: Manifest
    kept: Path | None
    upgraded_from: str | None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def table_counts(con: duckdb.DuckDBPyConnection, catalog: str) -> dict[str, int]:
    """Rows per base table of one attached database."""
    names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables WHERE table_catalog = ? "
                                       "AND table_type = 'BASE TABLE' ORDER BY 1", [catalog]).fetchall()]
    return {n: con.execute(f'SELECT count(*) FROM "{catalog}"."{n}"').fetchone()[0] for n in names}


def snapshot(store: "Store", target: Path, files: AuditFiles | None = None) -> Manifest:
    """Copy the whole store into the new DuckDB file `target` (which must not exist) and describe it in a manifest
    signed with the store's audit key (`files`, default the store's own), written beside it as `<target>.json`."""
    target = Path(target)
    if target.exists():
        raise BackupError(f"{target} exists: a backup never overwrites")
    key = (files or AuditFiles.of(store.path)).key_or_create()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    cur = store._cursor()
    alias = "gpuledger_backup"
    try:
        source = cur.execute("SELECT current_database()").fetchone()[0]
        cur.execute(f"ATTACH '{_quoted(partial)}' AS {alias}")
        try:
            cur.execute(f'COPY FROM DATABASE "{source}" TO {alias}')
            counts = table_counts(cur, alias)
            version = cur.execute(f"SELECT value FROM {alias}.meta WHERE key = 'schema_version'").fetchone()
        finally:
            cur.execute(f"DETACH {alias}")
    except duckdb.Error as exc:
        partial.unlink(missing_ok=True)
        raise BackupError(f"backup into {target} failed: {exc}") from exc
    finally:
        cur.close()
    os.replace(partial, target)
    manifest = Manifest(taken_at=utc_now().isoformat(), schema_version=version[0] if version else None,
                        tables=counts, sha256=file_sha256(target), bytes=target.stat().st_size).signed(key)
    manifest.write(manifest_path(target))
    return manifest


def manifest_path(backup: Path) -> Path:
    return backup.with_name(backup.name + ".json")


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


def _version(text: str | None, what: str) -> int:
    try:
        return int(text or "")
    except ValueError:
        raise BackupError(f"{what} names no schema version gpuledger knows ({text!r})") from None


def verify(backup: Path, files: AuditFiles | None) -> Manifest:
    """The backup's manifest, once its signature (with the key of `files`: the site's, never one found beside the
    backup, which whoever forged the manifest could have put there), the file's hash, every table's row count and
    the schema version agree with it. `files` None: all but the signature (a download checked where the key is
    not; restore always checks it)."""
    backup = Path(backup)
    if not backup.is_file():
        raise BackupError(f"no backup file at {backup}")
    manifest = Manifest.read(manifest_path(backup))
    if files is not None:
        manifest.check_signature(files.read_key(), files)
    if file_sha256(backup) != manifest.sha256:
        raise BackupError(f"{backup} does not match its manifest's SHA-256: damaged or changed since it was taken")
    con = duckdb.connect(str(backup), read_only=True)
    try:
        catalog = con.execute("SELECT current_database()").fetchone()[0]
        counts = table_counts(con, catalog)
        found = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() \
            if "meta" in counts else None
    finally:
        con.close()
    if counts != manifest.tables:
        differ = sorted(k for k in set(counts) | set(manifest.tables) if counts.get(k) != manifest.tables.get(k))
        raise BackupError(f"{backup}: row counts differ from the manifest in {differ}")
    stated = _version(manifest.schema_version, "the manifest")
    if found is None or _version(found[0], backup.name) != stated:
        raise BackupError(f"{backup} holds schema {found[0] if found else None}, its manifest says "
                          f"{manifest.schema_version}")
    if stated > int(SCHEMA_VERSION):
        raise BackupError(f"{backup} has schema {stated}, newer than this gpuledger's {SCHEMA_VERSION}: restore it "
                          "with the gpuledger that took it (or a newer one)")
    return manifest


def _kept_name(db: Path) -> Path:
    """A name no file has yet for the database a restore replaces: `<db>.before-restore-<UTC time>[-n]`."""
    base = db.with_name(f"{db.name}.before-restore-{stamp()}")
    kept, n = base, 1
    while kept.exists() or Path(str(kept) + ".wal").exists():
        n += 1
        kept = base.with_name(f"{base.name}-{n}")
    return kept


def _anchor_restored(staged: Path, files: AuditFiles, key: bytes) -> None:
    """A head anchor for the staged copy, from the backup's own last audit entry (the signed file vouches for it):
    the restored log is checked from there on as any other."""
    con = duckdb.connect(str(staged), read_only=True)
    try:
        last = con.execute("SELECT seq, sha256 FROM audit_log ORDER BY seq DESC LIMIT 1").fetchone() \
            if con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'audit_log'"
                           ).fetchone()[0] else None
        keyed = con.execute("SELECT value FROM meta WHERE key = ?", [KEYED_FROM]).fetchone()
    finally:
        con.close()
    seq, digest = (int(last[0]), str(last[1])) if last else (0, "0" * 64)
    Head(seq, digest, int(keyed[0]) if keyed else seq + 1).write(files.head, key)


def restore(backup: Path, db: Path, force: bool = False, files: AuditFiles | None = None,
            entry: AuditEntry | None = None) -> Restored:
    """Put a checked backup in place as the database file `db`, brought up to this gpuledger's schema, with
    `entry` (who restored it) as the last entry of its audit log. `files`: the audit key and head of `db`
    (default `<db>.audit-key` or $GPULEDGER_AUDIT_KEY_FILE, and `<db>.audit-head`); the key must be the one that
    signed the backup. An existing `db` is replaced only with `force`, and kept under a name of its own
    (`<db>.before-restore-<time>`, never overwritten); a `db` a running server holds is refused."""
    db = Path(db)
    files = files or AuditFiles.of(db)
    manifest = verify(backup, files)
    key = files.read_key() or b""
    if db.exists():
        if not force:
            raise BackupError(f"{db} exists: pass --force to replace it (it is kept as "
                              f"{db.name}.before-restore-<time>)")
        try:  # a server holding the file would go on writing to the file it has open
            duckdb.connect(str(db)).close()
        except duckdb.IOException as exc:
            raise BackupError(f"{db} is held by another process (a running server?): stop it first") from exc
    db.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=db.parent, prefix=db.name, suffix=".restoring", delete=False) as tmp:
        staged = Path(tmp.name)
    staged_files = AuditFiles(files.key, staged.with_name(staged.name + ".audit-head"))
    try:
        shutil.copyfile(backup, staged)
        _anchor_restored(staged, staged_files, key)
        from gpuledger.analytics.store.database import Store  # the store imports this module's neighbours
        with Store(staged) as store:  # opening it runs the migrations: an older schema is brought up to date
            log = AuditLog(store, flush_every_s=None, files=staged_files)
            if entry is not None:
                log.append(replace(entry, detail={**(entry.detail or {}), "backup": Path(backup).name,
                                                  "sha256": manifest.sha256, "taken_at": manifest.taken_at,
                                                  "schema": manifest.schema_version}))
            log.close()
    except BaseException:
        staged.unlink(missing_ok=True)
        staged_files.head.unlink(missing_ok=True)
        Path(str(staged) + ".wal").unlink(missing_ok=True)
        raise
    kept = None
    if db.exists():
        kept = _kept_name(db)
        os.replace(db, kept)
        if Path(str(db) + ".wal").exists():  # a WAL and a head anchor belong to the file they came with
            os.replace(Path(str(db) + ".wal"), Path(str(kept) + ".wal"))
        if files.head.exists():
            os.replace(files.head, kept.with_name(kept.name + ".audit-head"))
    os.replace(staged, db)
    os.replace(staged_files.head, files.head)
    upgraded = manifest.schema_version if manifest.schema_version != SCHEMA_VERSION else None
    return Restored(manifest, kept, upgraded)


def stamp(at: datetime | None = None) -> str:
    """The name part a backup taken at `at` gets: sortable, no colons."""
    return (at or utc_now()).strftime("%Y%m%dT%H%M%SZ")
