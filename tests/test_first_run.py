"""First-run clarity (issue 41 item 7): `serve` with the default NVML source on a machine without an NVIDIA driver
logged "NVML Shared Library Not Found" and then claimed to be "collecting from nvml every 30s"; with --open-reads
it said both "reads open to all" and "nobody can push or read"."""
from __future__ import annotations

import subprocess

import pytest

from tests.procs import GPULEDGER


def _nvml_works() -> bool:
    try:
        import pynvml
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:  # no library, no driver, no GPU: what this test is about
        return False


def test_serve_without_a_gpu_says_it_does_not_collect_and_what_to_pass(tmp_path):
    if _nvml_works():
        pytest.skip("this machine has a working NVIDIA driver: the NVML source collects here")
    served = subprocess.Popen([GPULEDGER, "serve", "--create", "--db", str(tmp_path / "s.duckdb"), "--port", "0",
                               "--open-reads"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=tmp_path)
    lines = []
    try:
        for line in iter(served.stdout.readline, ""):
            lines.append(line)
            if line.startswith("no API tokens yet") or len(lines) > 40:
                break
    finally:
        served.terminate()
        served.wait(timeout=30)
    text = "".join(lines)
    assert "collecting nothing itself" in text and "collecting from nvml" not in text, text
    assert "not collecting: NVML init failed" in text and "--source dcgm --dcgm-url URL" in text, text
    assert "reads open to all" in text and "nobody can push or read" not in text, text
    assert "nobody can push (agents) or use the admin routes" in text, text
