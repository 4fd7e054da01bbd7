"""The agent against a real server: bad exporter pages are counted and skipped, refused batches kept aside."""
from __future__ import annotations

import re
import time

from gpuledger.collector.agent.agent import Agent
from gpuledger.collector.agent.spool import Spool
from gpuledger.collector.dcgm_render import render_page
from gpuledger.collector.simulator import cluster_of
from gpuledger.collector.source import Source
from tests.ingest_helpers import NOW, batch
from tests.procs import TOKEN, AgentProc, Server, wait_until


def test_agent_scraping_bad_dcgm_pages_keeps_going_and_counts(tmp_path, page_server):
    server = Server(tmp_path).start()
    good = render_page(cluster_of(1).frame([NOW.timestamp()], 10.0))
    page_server.body = good
    agent = AgentProc(tmp_path, "dcgm-node", server.url, 0.2,
                      source=["--source", "dcgm", "--dcgm-url", page_server.url]).start()
    try:
        wait_until(lambda: server.nodes().get("dcgm-node", {}).get("rows", 0) >= 16, 60, "good scrapes stored")
        page_server.body = good[: len(good) // 2] + "\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-q\"} NaN\n" \
            "MYSTERY_METRIC 1\n{{{ not prometheus\n"
        wait_until(lambda: 'kind="malformed_line"' in agent.metrics(), 30, "parse errors counted")
        page_server.body = "<html>502 Bad Gateway</html>"
        wait_until(lambda: "returned no GPU samples" in agent.log.read_text(), 30, "empty page logged")
        page_server.body = good
        time.sleep(0.5)
        metrics = agent.metrics()
        assert re.search(r'gpuledger_collector_parse_errors_total\{kind="nan_value"\} [1-9]', metrics)
        assert re.search(r'gpuledger_collector_parse_errors_total\{kind="unknown_metric"\} [1-9]', metrics)
        assert "gpuledger_agent_batches_acked_total" in metrics and "gpuledger_ingest_" not in metrics  # its own
        assert agent.proc.popen.poll() is None  # still running
    finally:
        assert agent.proc.stop() == 0
        server.proc.stop()
    assert agent.spooled() == 0
    (duplicates,) = server.query("SELECT count(*) - count(DISTINCT (gpu_uuid, ts)) FROM samples")[0]
    assert duplicates == 0


def test_agent_in_process_rejected_batch_is_kept_aside(tmp_path, central):
    url, _ = central
    spool = Spool(tmp_path / "sp")

    class Broken(Source):
        name = "broken"

        def collect(self):
            return batch().drop_columns(["gpu_uuid"])  # an agent of another version, say

    agent = Agent(Broken(), spool, url, TOKEN, "n1", 1.0)
    agent.sample_once()
    assert agent.drain()
    assert not spool.pending() and len(list((tmp_path / "sp" / "rejected").glob("*.arrow"))) == 1
    reason = next((tmp_path / "sp" / "rejected").glob("*.reason")).read_text()
    assert reason.startswith("422") and "missing column" in reason
