"""Backups: a consistent snapshot of the whole store into a new DuckDB file, taken while the server keeps writing,
and its restore.

The snapshot is one `COPY FROM DATABASE` statement, so it reads a single transaction's view of every table (DuckDB
is MVCC): samples, rollups, ingest runs and the audit log agree with each other even while agents push. Writers
are not blocked. A manifest beside it (JSON) names the schema version, each table's row count and the file's
SHA-256; restore checks all three before it puts the file in place.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import GpuledgerError

if TYPE_CHECKING:
    from gpuledger.analytics.store.database import Store

CHUNK = 1 << 20


class BackupError(GpuledgerError):
    """A backup that cannot be taken, or one that does not check out on restore."""


@dataclass(frozen=True)
class Manifest:
    """What a backup holds, to check it against before restoring."""

    taken_at: str
    schema_version: str | None
    tables: dict[str, int]
    sha256: str
    bytes: int

    def text(self, indent: int | None = None) -> str:
        """The manifest as JSON: the file beside a backup (indented), and the header a server sends one with."""
        return json.dumps(asdict(self), indent=indent)

    def write(self, path: Path) -> None:
        path.write_text(self.text(indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> "Manifest":
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise BackupError(f"{path} is not a gpuledger backup manifest: {exc}") from exc


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


def snapshot(store: "Store", target: Path) -> Manifest:
    """Copy the whole store into the new DuckDB file `target` (which must not exist) and describe it; the
    manifest goes beside it as `<target>.json`."""
    target = Path(target)
    if target.exists():
        raise BackupError(f"{target} exists: a backup never overwrites")
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
        finally:
            cur.execute(f"DETACH {alias}")
    except duckdb.Error as exc:
        partial.unlink(missing_ok=True)
        raise BackupError(f"backup into {target} failed: {exc}") from exc
    finally:
        cur.close()
    os.replace(partial, target)
    manifest = Manifest(taken_at=utc_now().isoformat(), schema_version=store.meta("schema_version"),
                        tables=counts, sha256=file_sha256(target), bytes=target.stat().st_size)
    manifest.write(manifest_path(target))
    return manifest


def manifest_path(backup: Path) -> Path:
    return backup.with_name(backup.name + ".json")


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


def verify(backup: Path) -> Manifest:
    """The backup's manifest, once the file's hash and every table's row count agree with it."""
    backup = Path(backup)
    if not backup.is_file():
        raise BackupError(f"no backup file at {backup}")
    manifest = Manifest.read(manifest_path(backup))
    if file_sha256(backup) != manifest.sha256:
        raise BackupError(f"{backup} does not match its manifest's SHA-256: damaged or changed since it was taken")
    con = duckdb.connect(str(backup), read_only=True)
    try:
        catalog = con.execute("SELECT current_database()").fetchone()[0]
        counts = table_counts(con, catalog)
    finally:
        con.close()
    if counts != manifest.tables:
        differ = sorted(k for k in set(counts) | set(manifest.tables) if counts.get(k) != manifest.tables.get(k))
        raise BackupError(f"{backup}: row counts differ from the manifest in {differ}")
    return manifest


def restore(backup: Path, db: Path, force: bool = False) -> Manifest:
    """Put a checked backup in place as the database file `db`. An existing `db` is kept as `<db>.before-restore`
    and replaced only with `force`; a `db` a running server holds is refused."""
    manifest = verify(backup)
    db = Path(db)
    if db.exists():
        if not force:
            raise BackupError(f"{db} exists: pass --force to replace it (it is kept as {db.name}.before-restore)")
        try:  # a server holding the file would go on writing to the file it has open
            duckdb.connect(str(db)).close()
        except duckdb.IOException as exc:
            raise BackupError(f"{db} is held by another process (a running server?): stop it first") from exc
    db.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=db.parent, prefix=db.name, suffix=".restoring", delete=False) as tmp:
        staged = Path(tmp.name)
    shutil.copyfile(backup, staged)
    if db.exists():
        kept = db.with_name(db.name + ".before-restore")
        os.replace(db, kept)
        wal = Path(str(db) + ".wal")
        if wal.exists():  # a WAL belongs to the file it came with
            os.replace(wal, Path(str(kept) + ".wal"))
    os.replace(staged, db)
    return manifest


def stamp(at: datetime | None = None) -> str:
    """The name part a backup taken at `at` gets: sortable, no colons."""
    return (at or utc_now()).strftime("%Y%m%dT%H%M%SZ")
