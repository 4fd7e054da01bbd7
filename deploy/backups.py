"""`gpuledger backup DIR` and `gpuledger restore FILE`: a snapshot from a running server (GET /v1/backup with an
admin token) or from a file no server holds, saved with its signed manifest and checked; and its restore. Both
on the file are audited in the store's own log, as the server audits its backups."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import requests

from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import AuditLog
from gpuledger.analytics.store.backup import BackupError, Manifest, manifest_path, snapshot, stamp, verify
from gpuledger.collector.errors import GpuledgerError
from gpuledger.deploy.token_admin import refusal

Echo = Callable[[str], None]


def backup_local(store: Store, folder: Path) -> tuple[Path, Manifest]:
    """A snapshot of a store this process holds, into `folder`, signed with the store's audit key and recorded in
    its audit log (as `GET /v1/backup` is on a server)."""
    from gpuledger.deploy.token_admin import local_entry  # the CLI's actor, defined with the token commands
    target = Path(folder) / f"gpuledger-{stamp()}.duckdb"
    log = AuditLog(store, flush_every_s=None)
    manifest = snapshot(store, target, log.files)
    log.append(local_entry("backup", str(target), {"backup": target.name, "bytes": manifest.bytes,
                                                   "sha256": manifest.sha256}))
    return target, manifest


def backup_remote(server: str, token: str, ca: str | None, folder: Path,
                  echo: Echo = print) -> tuple[Path, Manifest]:
    """Download a running server's snapshot into `folder`, with its manifest, and check it."""
    try:
        response = requests.get(server.rstrip("/") + "/v1/backup", headers={"Authorization": f"Bearer {token}"},
                                stream=True, timeout=600, verify=ca or True)
    except requests.RequestException as exc:
        raise GpuledgerError(f"cannot reach {server}: {exc}") from exc
    with response:
        if not response.ok:
            raise GpuledgerError(f"{server} refused the backup ({response.status_code}): {refusal(response)}")
        manifest = Manifest(**json.loads(response.headers["X-Gpuledger-Manifest"]))
        name = response.headers.get("content-disposition", "").split("filename=")[-1].strip('"') \
            or f"gpuledger-{stamp()}.duckdb"
        target = Path(folder) / Path(name).name
        if target.exists():
            raise BackupError(f"{target} exists: a backup never overwrites")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        done, step = 0, max(manifest.bytes // 10, 1)
        with open(partial, "wb") as handle:
            for chunk in response.iter_content(1 << 20):
                handle.write(chunk)
                if (done + len(chunk)) // step > done // step:
                    echo(f"  {min(100, 100 * (done + len(chunk)) // max(manifest.bytes, 1))}% "
                         f"of {manifest.bytes / 1e6:.1f} MB")
                done += len(chunk)
    os.replace(partial, target)
    manifest.write(manifest_path(target))
    verify(target, None)  # the signature is checked where the site's key is: on restore
    return target, manifest


def describe(target: Path, manifest: Manifest) -> str:
    rows = sum(manifest.tables.values())
    return (f"backup {target} ({manifest.bytes / 1e6:.1f} MB, {len(manifest.tables)} tables, {rows:,} rows, "
            f"schema {manifest.schema_version}, taken {manifest.taken_at}); manifest {manifest_path(target)}")
