"""The Prometheus source against a real Prometheus (Debian's) scraping a real dcgm-exporter page whose values
change on every scrape: backfill, then a restarted source following on, store exactly the rows a direct scrape of
each page would have, at Prometheus' scrape instants, with no gap and no duplicate across the switch."""
from __future__ import annotations

import os
import re
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpuledger.analytics.store import Store
from gpuledger.collector.dcgm_source import DcgmPageConverter
from gpuledger.collector.prometheus_source import SOURCE, PrometheusSource
from gpuledger.collector.source import SourceError
from tests.helpers import serve_pages
from tests.prometheus_server import BINARY, PrometheusServer
from tests.test_dcgm_pages import SHARED_PAGES

PAGE = (SHARED_PAGES / "nvidia-aicr-conformance-h100x8-pods.txt").read_text()
LABELLED_POD = "vllm-agg-0-vllmdecodeworker-s65j5"
KSM = f'kube_pod_labels{{namespace="dynamo-workload",pod="{LABELLED_POD}",label_team="serving"}} 1\n'
COMPARED = ["node", "gpu_uuid", "gpu_index", "gpu_model", "pod", "namespace", "job_id", "allocated", "gpu_fraction",
            "util_pct", "temp_c", "power_w"]

pytestmark = pytest.mark.skipif(not Path(BINARY).exists() and not os.environ.get("CI"),
                                reason="needs Debian's prometheus (.ci/run installs it)")


class ChangingPages:
    """Serves the real page with GPU utilisation and temperature set from a per-scrape counter, remembering what
    it served when; and a kube-state-metrics page naming one pod's team."""

    def __init__(self) -> None:
        self.served: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.server, self.target = serve_pages(
            lambda path: (200, self.next_page() if path == "/metrics" else KSM))

    def next_page(self) -> str:
        with self.lock:
            n = len(self.served)

            def vary(match: re.Match) -> str:
                gpu = int(re.search(r'gpu="(\d+)"', match.group(1)).group(1))
                base = 100 if match.group(0).startswith("DCGM_FI_DEV_GPU_UTIL") else 90
                return f"{match.group(1)} {(n * 7 + gpu * 3) % base}"
            page = re.sub(r"^((?:DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_GPU_TEMP)\{.*\}) \S+$", vary, PAGE, flags=re.M)
            self.served.append((time.time(), page))
            return page

    def close(self) -> None:
        self.server.shutdown()


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def scraped():
    pages = ChangingPages()
    prometheus = PrometheusServer({"dcgm": (pages.target, "/metrics"), "ksm": (pages.target, "/ksm")}).start()
    yield pages, prometheus
    prometheus.stop()
    pages.close()


def source(url: str) -> PrometheusSource:
    return PrometheusSource(url, interval_s=1.0, since=timedelta(minutes=5), chunk=timedelta(seconds=2), settle_s=1.5)


def test_backfill_then_follow_store_the_rows_a_direct_scrape_stores(scraped, tmp_path):
    pages, prometheus = scraped
    wait_for(lambda: len(pages.served) >= 6, 60, "six scrapes")
    with Store(tmp_path / "p.duckdb") as store:
        history = source(prometheus.url)
        reads = 0
        while history.catching_up and reads < 200:  # backfill: chunks of 2 s until caught up
            store.append_samples(history.collect())
            reads += 1
        assert 1 < reads < 200 and not history.catching_up
        # the node's topology as its newest page says, the same as a direct scrape of the page gives
        direct_page = DcgmPageConverter(source=SOURCE)
        direct_page.convert(PAGE, datetime.now(timezone.utc), 1.0)
        (topology,) = history.topology()
        assert topology.node == "gpu-node-1" and {g.island for g in topology.gpus} == {0} and len(topology.gpus) == 8
        assert topology.digest() == direct_page.topology.topologies()[0].digest() and topology.source == SOURCE
        backfilled = len(pages.served)
        wait_for(lambda: len(pages.served) >= backfilled + 4, 60, "four more scrapes")
        follow = source(prometheus.url)  # a restarted server: resumes after what it stored, not `since` ago
        follow.resume_after(store.latest_ts_of(SOURCE))
        time.sleep(1.6)
        reads = 0
        while (reads == 0 or follow.catching_up) and reads < 50:
            store.append_samples(follow.collect())
            reads += 1
        until = follow.cursor.timestamp()
        got = store.query("SELECT * FROM samples ORDER BY ts, gpu_uuid, pod")
    instants = sorted(got["ts"].unique())
    assert got.groupby(["ts", "gpu_uuid", "pod"], dropna=False).size().max() == 1  # no duplicate row
    # every page Prometheus scraped up to the cursor is there, once, at its scrape's instant (a few ms before the
    # request reached the page server)
    served = [(t, page) for t, page in pages.served if t <= until - 0.3]
    assert len(served) >= 9
    matched = []
    for t, page in served:
        near = [i for i in instants if abs(i.timestamp() - t) < 0.3]
        assert len(near) == 1, f"scrape at {t} stored {len(near)} times"
        matched.append((near[0], page))
    assert len(instants) - len(matched) <= 1  # at most the scrape at the very edge of the cursor
    direct = DcgmPageConverter(source=SOURCE)
    for instant, page in matched:
        want = direct.convert(page, instant.to_pydatetime(), 1.0).to_pandas()
        have = got[got["ts"] == instant]
        key = ["gpu_uuid", "pod"]
        assert (have[COMPARED].sort_values(key).reset_index(drop=True)
                .equals(want[COMPARED].sort_values(key).reset_index(drop=True))), instant
    labelled = got[got["pod"] == LABELLED_POD]
    assert len(labelled) and set(labelled["team"]) == {"serving"}  # kube_pod_labels' team label
    assert set(got[got["pod"].notna() & (got["pod"] != LABELLED_POD)]["team"]) <= {"dynamo-workload"}
    assert set(got["source"]) == {SOURCE} and set(got["node"]) == {"gpu-node-1"}


def test_an_unreachable_or_refusing_prometheus_is_a_clear_error(scraped):
    _, prometheus = scraped
    bad = PrometheusSource("http://127.0.0.1:9", since=timedelta(minutes=1), settle_s=0)
    with pytest.raises(SourceError, match="cannot query Prometheus"):
        bad.collect()
    wrong = PrometheusSource(prometheus.url + "/nothing-here", since=timedelta(minutes=1), settle_s=0)
    with pytest.raises(SourceError):
        wrong.collect()
    assert wrong.cursor < datetime.now(timezone.utc) - timedelta(seconds=30)  # nothing read: the cursor stays


def test_serve_backfills_follows_and_resumes_after_a_kill(scraped, tmp_path):
    """`gpuledger serve --source prometheus` as a user runs it; killed with -9 and started again, it carries on
    after the newest sample it stored: no duplicate, no gap between scrapes."""
    import requests

    from tests.procs import _spawn, free_port, wait_until
    pages, prometheus = scraped
    wait_for(lambda: len(pages.served) >= 4, 60, "four scrapes")
    db, port = tmp_path / "prom.duckdb", free_port()
    args = ["serve", "--create", "--source", "prometheus", "--prometheus-url", prometheus.url, "--interval", "1", "--since", "5m",
            "--db", str(db), "--port", str(port), "--reports", str(tmp_path / "reports")]

    def samples() -> int:
        try:
            return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()["samples"]
        except requests.RequestException:
            return 0
    first = _spawn(args, tmp_path / "serve1.log")
    try:
        stored = wait_until(samples, 60, "a backfill")
        wait_until(lambda: samples() > stored, 30, "following")
    finally:
        first.kill9()
    second = _spawn(args, tmp_path / "serve2.log")
    try:
        before = wait_until(samples, 60, "the restarted server")
        wait_until(lambda: samples() > before + 8 * 4, 60, "four more scrapes after the restart")
    finally:
        assert second.stop() == 0, second.text()[-2000:]
    resumed = re.search(r"resuming after (\S+),", second.text())
    assert resumed, second.text()[-2000:]
    with Store(db, read_only=True) as store:
        got = store.query("SELECT ts, gpu_uuid, pod FROM samples ORDER BY ts")
    assert got.groupby(["ts", "gpu_uuid", "pod"], dropna=False).size().max() == 1
    instants = sorted(got["ts"].unique())
    gaps = [(b - a).total_seconds() for a, b in zip(instants, instants[1:])]
    assert max(gaps) < 1.6, gaps  # one instant per 1 s scrape, across the kill
    after = [i for i in instants if i > datetime.fromisoformat(resumed.group(1))]
    assert len(after) >= 4 and len(instants) > len(after)  # stored by both runs


def test_sharers_of_a_gpu_carry_the_use_hami_measured_read_through_a_real_prometheus(tmp_path):
    """Two pods time-slice GPU 0 (dcgm-exporter repeats its series per pod, the device at 90%); HAMi's vGPU monitor
    (both metric generations) says what each container used and kube-state-metrics what each requested. Read back
    from a real Prometheus, each pod is billed its requested part with its own utilisation and memory."""
    from tests.test_dcgm_pages import DECODE, GPU0, SLICED, hami_monitor_page, sliced_page
    ksm = "".join(f'kube_pod_container_resource_requests{{namespace="dynamo-workload",pod="{pod}",container="main",'
                  f'resource="nvidia_com_gpucores",unit="integer"}} {cores}\n'
                  for pod, cores in ((DECODE, 50), (SLICED, 50)))
    pages = {"/metrics": sliced_page(90.0), "/hami": hami_monitor_page({DECODE: (45.0, 10.0), SLICED: (15.0, 2.0)}),
             "/ksm": ksm}
    server, target = serve_pages(lambda path: (200, pages.get(path, "")))
    prometheus = PrometheusServer({name.strip("/"): (target, name) for name in pages}).start()
    try:
        wait_for(lambda: len(prometheus_series(prometheus.url, "hami_container_device_utilization_ratio")) == 2,
                 60, "HAMi's series in Prometheus")
        time.sleep(3)
        reader = source(prometheus.url)
        rows = []
        for _ in range(200):
            rows += reader.collect().to_pylist()
            if not reader.catching_up:
                break
    finally:
        prometheus.stop()
        server.shutdown()
    shared = [r for r in rows if r["gpu_uuid"] == GPU0]
    assert shared, "GPU 0's rows"
    by_pod: dict[str, list[dict]] = {}
    for row in shared:
        by_pod.setdefault(row["pod"], []).append(row)
    decode = [r for r in by_pod[DECODE] if r["util_pct"] is not None]
    sliced = [r for r in by_pod[SLICED] if r["util_pct"] is not None]
    assert decode and sliced, "instants with the monitor's figures"
    # requests 50 : 50 -> half the GPU each (not the 3 : 1 of what they used); 45% of the SMs over half the GPU is
    # 90% busy, 15% is 30%: each pod's own, never the device's 90% for both
    assert {round(r["gpu_fraction"], 6) for r in decode + sliced} == {0.5}
    assert {round(r["util_pct"], 6) for r in decode} == {90.0} and {round(r["util_pct"], 6) for r in sliced} == {30.0}
    assert {r["mem_used_mib"] for r in sliced} == {2048.0}
    for instant in {r["ts"] for r in shared}:  # each instant bills the GPU once
        assert sum(r["gpu_fraction"] for r in shared if r["ts"] == instant) == pytest.approx(1.0)


def prometheus_series(url: str, name: str) -> list:
    import requests
    return requests.get(f"{url}/api/v1/query", params={"query": name}, timeout=5).json()["data"]["result"]
