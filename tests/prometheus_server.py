"""A throwaway Prometheus for tests: Debian's `prometheus` binary with a temporary config and TSDB on a free port
of 127.0.0.1, scraping targets the test serves on 127.0.0.1, stopped and removed at the end."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import requests
import yaml

from tests.procs import free_port

BINARY = "/usr/bin/prometheus"


class PrometheusServer:
    def __init__(self, jobs: dict[str, tuple[str, str]], scrape_interval_s: int = 1) -> None:
        """`jobs`: job name -> (host:port, metrics path)."""
        self.root = Path(tempfile.mkdtemp(prefix="gpuledger-prom-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": f"{scrape_interval_s}s", "scrape_timeout": f"{scrape_interval_s}s"},
                  "scrape_configs": [{"job_name": name, "metrics_path": path, "honor_labels": True,
                                      "static_configs": [{"targets": [target]}]}
                                     for name, (target, path) in jobs.items()]}
        (self.root / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen | None = None

    def start(self) -> "PrometheusServer":
        log = open(self.root / "log", "w")
        self.proc = subprocess.Popen(
            [BINARY, f"--config.file={self.root / 'prometheus.yml'}", f"--storage.tsdb.path={self.root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"prometheus did not start: {(self.root / 'log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.root, ignore_errors=True)
