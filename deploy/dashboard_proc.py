"""Start the Streamlit dashboard as a child process pointed at an API URL."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import requests

from gpuledger import dashboard
from gpuledger.collector.errors import GpuledgerError

APP = Path(dashboard.__file__).with_name("app.py")


def start_dashboard(api_url: str, host: str = "127.0.0.1", port: int = 8501, timeout_s: float = 60.0,
                    token: str | None = None, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """The Streamlit app against `api_url`; with `token` (the server's), its decision buttons work. `env`: more
    of the dashboard's settings (GPULEDGER_TRUSTED_HEADER, GPULEDGER_USER_TOKENS)."""
    env = dict(os.environ, GPULEDGER_API=api_url, **(env or {}))
    if token:
        env["GPULEDGER_TOKEN"] = token
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
           "--server.address", host, "--server.port", str(port), "--browser.gatherUsageStats", "false",
           "--server.fileWatcherType", "none", "--client.toolbarMode", "viewer"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise GpuledgerError(f"dashboard exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if requests.get(f"{url}/_stcore/health", timeout=1).ok:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.3)
    proc.kill()
    raise GpuledgerError(f"dashboard did not answer on {url} within {timeout_s:.0f}s")
