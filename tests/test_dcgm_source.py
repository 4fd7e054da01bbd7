"""dcgm-exporter pages -> one row per GPU / MIG instance, over real HTTP on 127.0.0.1."""
from __future__ import annotations

import socket
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gpuledger.analytics.store import Store
from gpuledger.collector.attribution import Attributor
from gpuledger.collector.dcgm_render import render_page
from gpuledger.collector.dcgm_source import DcgmExporterSource, DcgmPageConverter
from gpuledger.collector.metrics import REGISTRY, sample_value
from gpuledger.collector.samples import UNATTRIBUTED
from gpuledger.collector.simulator import cluster_of
from gpuledger.collector.source import SourceError
from gpuledger.deploy.collect_loop import CollectLoop

PAGE = (Path(__file__).parent / "data" / "dcgm_h100_a100mig_pods.txt").read_text()
NOW = datetime(2026, 11, 30, 12, tzinfo=timezone.utc)


def by_key(table):
    return {(r["gpu_uuid"], r["mig_instance"]): r for r in table.to_pylist()}


def test_realistic_page_becomes_one_row_per_gpu_and_mig_instance():
    rows = by_key(DcgmPageConverter().convert(PAGE, NOW, 30.0))
    assert len(rows) == 6  # 3 GPUs, 2 MIG instances and the 3/7 of their card no instance holds
    unheld = rows[("GPU-5fa1b3c2-7d1e-4f7a-9a51-0c2b7f6e0a04", None)]
    assert unheld["gpu_fraction"] == pytest.approx(3 / 7) and not unheld["allocated"] and unheld["util_pct"] is None
    busy = rows[("GPU-5fa1b3c2-7d1e-4f7a-9a51-0c2b7f6e0a01", None)]
    assert busy["gpu_model"] == "H100" and busy["node"] == "gpu-node-7" and busy["gpu_index"] == 0
    assert busy["util_pct"] == 97 and busy["mem_used_mib"] == 71234 and busy["nvlink_tx_bps"] == 1.2e11
    assert busy["mem_total_mib"] == 71234 + 9913 + 412
    assert (busy["allocated"], busy["team"], busy["job_id"]) == (True, "nlp", "nlp/llama-ft-7f9c-0")
    free = rows[("GPU-5fa1b3c2-7d1e-4f7a-9a51-0c2b7f6e0a03", None)]
    assert (free["allocated"], free["team"], free["pod"]) == (False, None, None)
    mig = rows[("GPU-5fa1b3c2-7d1e-4f7a-9a51-0c2b7f6e0a04", 1)]
    assert mig["mig_profile"] == "3g.40gb" and mig["gpu_fraction"] == pytest.approx(3 / 7)
    assert mig["gpu_model"] == "A100-80GB" and mig["team"] == "recsys"
    assert mig["util_pct"] == pytest.approx(42.0)  # from GR_ENGINE_ACTIVE: MIG has no GPU_UTIL
    small = rows[("GPU-5fa1b3c2-7d1e-4f7a-9a51-0c2b7f6e0a04", 9)]
    assert small["team"] == UNATTRIBUTED and small["allocated"] and small["pod"] == 'debug-shell "bob"'


def test_namespace_mapping_overrides_namespace_as_team():
    rows = by_key(DcgmPageConverter(Attributor(namespace_to_team={"nlp": "language"})).convert(PAGE, NOW, 30))
    assert rows[("GPU-5fa1b3c2-7d1e-4f7a-9a51-0c2b7f6e0a01", None)]["team"] == "language"


def test_nan_unknown_and_garbage_lines_are_counted_in_collector_metrics_not_fatal():
    before = {k: sample_value(REGISTRY, "gpuledger_collector_parse_errors_total", kind=k) for k in ("nan_value", "unknown_metric", "malformed_line")}
    page = PAGE + "\n".join([
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-x",modelName="NVIDIA L4",Hostname="n"} NaN',
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-x",modelName="NVIDIA L4",Hostname="n"} 100',
        'SOME_OTHER_EXPORTER_METRIC{gpu="0"} 1',
        "}}}garbage{{{",
    ]) + "\n"
    rows = by_key(DcgmPageConverter().convert(page, NOW, 30.0))
    assert len(rows) == 7  # the six rows of the page plus GPU-x, whose good line survived
    assert rows[("GPU-x", None)]["temp_c"] is None and rows[("GPU-x", None)]["mem_used_mib"] == 100
    assert sample_value(REGISTRY, "gpuledger_collector_parse_errors_total", kind="nan_value") == before["nan_value"] + 1
    assert sample_value(REGISTRY, "gpuledger_collector_parse_errors_total", kind="unknown_metric") == before["unknown_metric"] + 1
    assert sample_value(REGISTRY, "gpuledger_collector_parse_errors_total", kind="malformed_line") == before["malformed_line"] + 1
    exposed = generate_latest(REGISTRY).decode()
    assert 'gpuledger_collector_parse_errors_total{kind="nan_value"}' in exposed


def test_scrape_over_http_round_trips_the_simulated_cluster(page_server, simulator):
    truth = simulator.frame([NOW.timestamp()], 30.0)
    page_server.body = render_page(truth)
    got = DcgmExporterSource(page_server.url, interval_s=30.0).collect()
    assert got.num_rows == truth.num_rows == simulator.gpu_count
    want, have = by_key(truth), by_key(got)
    for key, row in want.items():
        assert have[key]["util_pct"] == pytest.approx(row["util_pct"], rel=1e-5, abs=1e-6)
        assert have[key]["mem_used_mib"] == pytest.approx(row["mem_used_mib"], rel=1e-5)
        assert have[key]["team"] == row["team"] and have[key]["allocated"] == row["allocated"]


def test_http_errors_raise_clear_source_errors_and_are_counted(page_server):
    source = DcgmExporterSource(page_server.url, timeout_s=2)
    page_server.status, page_server.body = 503, "busy"
    before = sample_value(REGISTRY, "gpuledger_collector_scrape_errors_total", source="dcgm", reason="HTTPError")
    with pytest.raises(SourceError, match="503"):
        source.collect()
    assert sample_value(REGISTRY, "gpuledger_collector_scrape_errors_total", source="dcgm", reason="HTTPError") == before + 1
    page_server.status, page_server.body = 200, "<html>not metrics</html>\n"
    with pytest.raises(SourceError, match="no GPU samples"):
        source.collect()


def test_unreachable_exporter_is_a_source_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(SourceError, match="cannot scrape"):
        DcgmExporterSource(f"http://127.0.0.1:{port}/metrics", timeout_s=2).collect()


def test_collect_loop_survives_a_failed_scrape_and_loses_no_batch(page_server, simulator, tmp_path):
    page_server.body = render_page(simulator.frame([NOW.timestamp()], 30.0))
    with Store(tmp_path / "loop.duckdb") as store:
        loop = CollectLoop(DcgmExporterSource(page_server.url, interval_s=0.05), store, interval_s=0.05)
        page_server.status = 500
        loop.start()
        deadline = datetime.now().timestamp() + 20
        while loop.failures < 2 and datetime.now().timestamp() < deadline:
            loop.stop_event.wait(0.02)
        page_server.status = 200
        while loop.batches < 3 and datetime.now().timestamp() < deadline:
            loop.stop_event.wait(0.02)
        loop.stop()
        loop.join(5)
        assert loop.failures >= 2 and loop.batches >= 3
        assert store.sample_count() == loop.batches * simulator.gpu_count
        per_batch = store.query("SELECT ts, count(*) AS n FROM samples GROUP BY ts")
        assert set(per_batch["n"]) == {simulator.gpu_count}


def test_health_turns_degraded_while_collection_keeps_failing(tmp_path, page_server):
    page_server.status = 500
    with Store(tmp_path / "h.duckdb") as store:
        loop = CollectLoop(DcgmExporterSource(page_server.url, interval_s=0.05), store, 0.05)
        assert loop.health() == (True, None)
        loop.start()
        try:
            deadline = time.monotonic() + 10
            while loop.health()[0] and time.monotonic() < deadline:
                time.sleep(0.05)
            healthy, reason = loop.health()
            assert not healthy and "cannot scrape dcgm-exporter" in reason
            page_server.status = 200
            page_server.body = render_page(cluster_of(1).frame([time.time()], 0.05))
            deadline = time.monotonic() + 10
            while not loop.health()[0] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert loop.health() == (True, None)
        finally:
            loop.stop()
            loop.join(timeout=5)


def test_the_agent_reads_hamis_monitor_beside_the_page_and_goes_on_without_it(tmp_path):
    """`--hami-url`: the vGPU monitor on the node, served on 127.0.0.1 beside the exporter's page; each pod sharing
    GPU 0 gets its own figures. A monitor that does not answer leaves them unknown, and the page is still stored."""
    from gpuledger.collector.dcgm_source import DcgmExporterSource
    from tests.helpers import serve_pages
    from tests.test_dcgm_pages import DECODE, GPU0, SLICED, hami_monitor_page, sliced_page
    monitor = {"status": 200}
    pages = {"/metrics": sliced_page(90.0), "/hami": hami_monitor_page({DECODE: (45.0, 10.0), SLICED: (15.0, 2.0)})}
    server, target = serve_pages(lambda path: (monitor["status"] if path == "/hami" else 200, pages.get(path, "")))
    try:
        source = DcgmExporterSource(f"http://{target}/metrics", hami_url=f"http://{target}/hami", timeout_s=2)
        rows = {r["pod"]: r for r in source.collect().to_pylist() if r["gpu_uuid"] == GPU0}
        assert rows[DECODE]["gpu_fraction"] == pytest.approx(0.75) and rows[DECODE]["util_pct"] == pytest.approx(60)
        assert rows[SLICED]["mem_used_mib"] == pytest.approx(2048)
        monitor["status"] = 503
        rows = {r["pod"]: r for r in source.collect().to_pylist() if r["gpu_uuid"] == GPU0}
        assert rows[DECODE]["gpu_fraction"] == pytest.approx(0.5) and rows[DECODE]["util_pct"] is None
    finally:
        server.shutdown()
