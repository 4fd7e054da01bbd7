"""Inference metrics read through a real Prometheus (Debian's binary on 127.0.0.1) give the figures the pages give.

A vLLM and a Triton server are served on 127.0.0.1 by pages whose counters grow on every scrape and reset once (a
restart); Prometheus scrapes them every second. gpuledger then reads the scrapes back from Prometheus
(collector/apps/prometheus_apps.py) into one store, and the very pages Prometheus was served straight into
another: tokens, requests, latency quantiles and means must be the same in both.
"""
from __future__ import annotations

import math
import shutil
import time
from datetime import datetime, timedelta, timezone

import pytest

from gpuledger.analytics.inference import service_table
from gpuledger.analytics.store import Store
from gpuledger.collector.apps.prometheus_apps import PrometheusApps
from gpuledger.collector.apps.targets import AppRead, PageRead
from gpuledger.collector.attribution import Attributor
from gpuledger.deploy.app_loop import store_read
from tests.helpers import serve_pages
from tests.prometheus_server import BINARY, PrometheusServer
from tests.test_inference import BOUNDS, vllm_page

pytestmark = pytest.mark.skipif(shutil.which(BINARY) is None, reason="needs Debian's prometheus (.ci/run installs it)")

STEPS = 9
RESET_AT = 5  # the servers restart before this page: every counter starts again


def triton_page(i: int) -> str:
    """Triton's families as its docs give them: cumulative counts and microsecond durations per model and version."""
    n = 40 * (i - RESET_AT + 1) if i >= RESET_AT else 50 * (i + 1)
    return "\n".join([
        "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
        "# TYPE nv_inference_request_success counter",
        f'nv_inference_request_success{{model="resnet50",version="1"}} {n}',
        "# TYPE nv_inference_count counter",
        f'nv_inference_count{{model="resnet50",version="1"}} {4 * n}',
        "# TYPE nv_inference_exec_count counter",
        f'nv_inference_exec_count{{model="resnet50",version="1"}} {n}',
        "# TYPE nv_inference_request_duration_us counter",
        f'nv_inference_request_duration_us{{model="resnet50",version="1"}} {n * (20000 + 1000 * i)}',
        "# TYPE nv_inference_queue_duration_us counter",
        f'nv_inference_queue_duration_us{{model="resnet50",version="1"}} {n * 1500}',
    ]) + "\n"


def vllm_step(i: int) -> str:
    k = (i - RESET_AT + 1) if i >= RESET_AT else (i + 1)
    scale = 70 if i >= RESET_AT else 100
    requests = scale * k
    return vllm_page(requests, 600 * requests, 180 * requests,
                     [int(requests * f) for f in (0.05, 0.3, 0.7, 0.9, 0.98)])


class SteppingPages:
    """Serves page i on the i-th GET (then the last one again), and keeps what it served, in order."""

    def __init__(self, make) -> None:
        self.make, self.served = make, []
        self.server, self.address = serve_pages(self._answer)

    def _answer(self, path: str) -> tuple[int, str]:
        body = self.make(min(len(self.served), STEPS - 1))
        self.served.append(body)
        return 200, body

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_prometheus_gives_the_figures_the_pages_give(tmp_path):
    vllm, triton = SteppingPages(vllm_step), SteppingPages(triton_page)
    prom = PrometheusServer({"vllm": (vllm.address, "/metrics"), "triton": (triton.address, "/metrics")}).start()
    try:
        deadline = time.monotonic() + 90
        while (len(vllm.served) < STEPS + 2 or len(triton.served) < STEPS + 2) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(vllm.served) >= STEPS + 2 and len(triton.served) >= STEPS + 2, "Prometheus did not scrape"
        time.sleep(2)  # the last scrapes are written
        served = {"vllm": list(vllm.served), "triton": list(triton.served)}
        through = Store(tmp_path / "through_prometheus.duckdb")
        source = PrometheusApps(prom.url, since=timedelta(minutes=10), settle_s=0)
        for _ in range(20):
            store_read(through, source.read(), Attributor())
            if not source.catching_up:
                break
    finally:
        prom.stop()
        vllm.close()
        triton.close()
    direct = Store(tmp_path / "direct.duckdb")
    start = datetime.now(timezone.utc) - timedelta(minutes=30)
    for name, pages in served.items():
        for i, text in enumerate(pages):
            store_read(direct, AppRead(at=start + timedelta(seconds=i), pages=[PageRead(text, name)]), Attributor())
    window = (start - timedelta(hours=1), datetime.now(timezone.utc) + timedelta(minutes=1))
    got = service_table(through, *window).set_index("kind")
    want = service_table(direct, *window).set_index("kind")
    assert set(got.index) == set(want.index) == {"vllm", "triton"}
    # the vLLM pages: 100 requests per page to the reset, then 70 per page
    assert want.loc["vllm", "requests"] == 100 * RESET_AT + 70 * (STEPS - RESET_AT) - 100
    compared = ["requests", "prompt_tokens", "generation_tokens", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
                "ttft_seconds_mean", "e2e_seconds_mean", "queue_seconds_mean", "inferences"]
    for kind in ("vllm", "triton"):
        for column in compared:
            a, b = got.loc[kind, column], want.loc[kind, column]
            if b is None or (isinstance(b, float) and math.isnan(b)):
                assert a is None or (isinstance(a, float) and math.isnan(a)), (kind, column, a)
            else:
                assert a == pytest.approx(b), (kind, column, a, b)
    assert want.loc["triton", "requests"] > 0 and want.loc["triton", "e2e_seconds_mean"] > 0
    assert [float(x) for x in BOUNDS]  # the histogram's bounds came from the shared vLLM page builder
