"""Real gpuledger server and agent processes on 127.0.0.1 for fault tests, each bounded in time."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import duckdb
import pytest
import requests

GPULEDGER = str(Path(sys.executable).with_name("gpuledger"))
TOKEN = "test-token-123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout_s: float, what: str, step_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@dataclass
class Proc:
    popen: subprocess.Popen
    log: Path

    def kill9(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=30)

    def stop(self, timeout_s: float = 60) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout=timeout_s)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def stop_all(*procs: Proc) -> list[int | None]:
    """Stop every process whatever the others do: an assert on one agent's exit code inside a `finally` used to skip
    the server's stop, leaving a server running after a failed test. Their exit codes in order (None: it did not
    stop within its timeout and was killed); the caller asserts on them after the `finally`."""
    codes: list[int | None] = []
    for proc in procs:
        try:
            codes.append(proc.stop())
        except subprocess.TimeoutExpired:
            proc.kill9()
            codes.append(None)
    return codes


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    handle = open(log, "a")
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return Proc(subprocess.Popen([GPULEDGER, *args], stdout=handle, stderr=subprocess.STDOUT, env=env), log)


class Server:
    def __init__(self, tmp: Path, port: int | None = None, db: Path | None = None) -> None:
        self.db = db or tmp / "central.duckdb"
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmp = tmp
        self.proc: Proc | None = None

    def start(self, env: dict[str, str] | None = None) -> "Server":
        """Start (again); `env`: extra environment, e.g. a failpoint."""
        self.proc = _spawn(["serve", "--create", "--source", "none", "--token", TOKEN, "--open-reads", "--port", str(self.port),
                            "--db", str(self.db), "--reports", str(self.tmp / "reports")], self.tmp / "server.log",
                           env)

        def healthy() -> bool:
            if self.proc.popen.poll() is not None:
                raise AssertionError(f"server exited: {self.proc.text()[-3000:]}")
            try:
                return requests.get(self.url + "/healthz", timeout=2).ok
            except requests.RequestException:
                return False
        wait_until(healthy, 60, "server health")
        return self

    def nodes(self) -> dict[str, dict]:
        return {n["node"]: n for n in requests.get(self.url + "/v1/nodes", timeout=10).json()}

    def query(self, sql: str) -> list[tuple]:
        """Read the store after the server has stopped (DuckDB admits one process)."""
        con = duckdb.connect(str(self.db), read_only=True)
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()


class AgentProc:
    def __init__(self, tmp: Path, node: str, server_url: str, interval_s: float = 0.2,
                 replay_start: float | None = None, spool_max_mb: float = 64.0,
                 source: list[str] | None = None, spool: Path | None = None) -> None:
        self.node = node
        self.spool = spool or tmp / f"spool-{node}"
        self.metrics_port = free_port()
        self.args = ["agent", "--node", node, "--server", server_url, "--token", TOKEN, "--interval", str(interval_s),
                     "--spool", str(self.spool), "--spool-max-mb", str(spool_max_mb),
                     "--metrics-port", str(self.metrics_port)]
        self.args += source or ["--source", "simulator"]
        if replay_start is not None:
            self.args += ["--sim-replay-start", str(replay_start)]
        self.log = tmp / f"agent-{node}.log"
        self.proc: Proc | None = None

    def start(self) -> "AgentProc":
        self.proc = _spawn(self.args, self.log)
        return self

    def state(self) -> dict:
        return json.loads((self.spool / "state.json").read_text())

    def spooled(self) -> int:
        return len(list(self.spool.glob("*.arrow")))

    def metrics(self) -> str:
        return requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text


@contextmanager
def small_filesystem(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (e.g. '2m') mounted at `where`, to run a disk out of space for real; skips the test where
    mounting is not allowed (CI runs as root, where it is)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_up(folder: Path) -> Path:
    """Write a file into `folder` until its filesystem is full; the file, to delete to free the space again."""
    filler = folder / "filler"
    try:
        with open(filler, "wb", buffering=0) as handle:
            while True:
                handle.write(b"\0" * 4096)
    except OSError:
        pass
    return filler
