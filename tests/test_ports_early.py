"""A busy port is found before any long work, and the message names its flag (issue 45 item 6): the demo's
--api-port and --dashboard-port before its minute of backfill, serve's --port before the store is opened."""
from __future__ import annotations

import socket
import subprocess

import pytest

from tests.procs import GPULEDGER


@pytest.fixture
def busy_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        yield held.getsockname()[1]


@pytest.mark.parametrize("command, flag, suggests_zero", [
    (["demo", "--no-dashboard", "--api-port"], "--api-port", True),
    (["demo", "--api-port", "0", "--dashboard-port"], "--dashboard-port", False),
    (["serve", "--create", "--port"], "--port", True),
    (["dashboard", "--port"], "--port", False),
])
def test_a_busy_port_is_refused_at_once_naming_its_flag(busy_port, tmp_path, command, flag, suggests_zero):
    out = subprocess.run([GPULEDGER, *command, str(busy_port), *(["--db", str(tmp_path / "x.duckdb")]
                                                                   if command[0] != "dashboard" else [])],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert f"port {busy_port} on 127.0.0.1 is not free" in out.stderr and f"{flag} N" in out.stderr, out.stderr
    assert (f"{flag} 0 for any free port" in out.stderr) == suggests_zero, out.stderr
    assert "simulating" not in out.stdout  # refused before the backfill began
    assert not (tmp_path / "x.duckdb").exists()  # and before any store was made
