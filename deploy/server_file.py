"""A running server's note beside the DuckDB file it holds (`<db>.server`: its URL, process and start), so a command
run on the same machine against that file asks the server instead of failing on DuckDB's lock.

Why: a DuckDB file has one writer, and in production the server always runs. `gpuledger statement --db FILE` while
`serve` holds FILE used to stop at "Could not set lock"; with the note it goes through the server's API, the way
`--server URL` does, and says so. The note is written once the API answers and removed when the server stops; a
note left by a server that was killed is recognised as stale (its process is gone, or the process id now belongs
to a process started at another time) and ignored. DuckLake stores (several processes by design) get no note.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger(__name__)
SUFFIX = ".server"
# what a server bound to every address is reached at from the same machine
LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "[::]": "[::1]"}


def note_path(db: str | Path) -> Path:
    return Path(f"{db}{SUFFIX}")


def _started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22), or None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def reachable(url: str) -> str:
    """`url` as a client on this machine reaches it: a server bound to all addresses is asked on the loopback."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    local = LOOPBACK.get(shown, shown)
    return urlunsplit(parts._replace(netloc=f"{local}:{parts.port}" if parts.port else local))


def announce(db: str | Path, url: str) -> Path | None:
    """Write the note for the server at `url` holding `db`; None (logged) when the folder is not writable."""
    path = note_path(db)
    note = {"url": reachable(url), "pid": os.getpid(), "started": _started(os.getpid())}
    try:
        path.write_text(json.dumps(note) + "\n")
    except OSError as exc:
        log.warning("cannot write %s (commands on this machine will not find the server by its file): %s", path, exc)
        return None
    return path


def withdraw(db: str | Path) -> None:
    """Remove this process's note (another process's is left alone)."""
    path = note_path(db)
    found = _read(path)
    if found is not None and found.get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def _read(path: Path) -> dict | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("url"), str) \
        and isinstance(found.get("pid"), int) else None


def announced(db: str | Path) -> dict | None:
    """The note of a live server holding `db` ({url, pid}), or None: no note, or one its server left behind."""
    found = _read(note_path(db))
    if found is None or not _alive(found["pid"]):
        return None
    started = _started(found["pid"])
    if found.get("started") and started and started != found["started"]:  # the pid was reused
        return None
    return found


__all__ = ["announce", "announced", "note_path", "reachable", "withdraw"]
