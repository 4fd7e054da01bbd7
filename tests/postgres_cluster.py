"""A throwaway PostgreSQL for tests: Debian's initdb and pg_ctl, a cluster in a temporary folder on a free port
of 127.0.0.1, stopped and removed at the end. PostgreSQL refuses to run as root, so as root the cluster runs as
the `postgres` user the Debian package creates."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.procs import free_port


def bin_dir() -> Path | None:
    """Debian keeps the server programs out of PATH, under /usr/lib/postgresql/<version>/bin."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


class PostgresCluster:
    def __init__(self) -> None:
        self.bin = bin_dir()
        if self.bin is None:
            raise RuntimeError("no PostgreSQL server programs under /usr/lib/postgresql")
        self.root = Path(tempfile.mkdtemp(prefix="gpuledger-pg-"))
        self.port = free_port()
        self.user = "gpuledger"
        self.as_root = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(command)} failed: {done.stderr[-2000:]}")

    def start(self) -> "PostgresCluster":
        if self.as_root:
            shutil.chown(self.root, "postgres")
        self.root.chmod(0o700)
        self._run("initdb", "-D", str(self.root / "data"), "-A", "trust", "-U", self.user, "--no-sync")
        self._run("pg_ctl", "-D", str(self.root / "data"), "-l", str(self.root / "log"), "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        return self

    def create_database(self, name: str) -> str:
        """A new database; returns its libpq conninfo."""
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name)
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname={name}"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
