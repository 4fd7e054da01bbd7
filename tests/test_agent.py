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
from tests.procs import TOKEN, AgentProc, Server, stop_all, wait_until


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
        codes = stop_all(agent.proc, server.proc)
    assert codes[0] == 0, agent.proc.text()[-2000:]
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


def test_a_body_may_mix_batches_of_an_older_agent_and_new_ones():
    """A spool replayed after an upgrade, drained together with batches read since: the older batches lack the
    columns added since, and the body carries them as nulls (one request, not a crash of the sender)."""
    from gpuledger.collector.samples import ADDED_COLUMNS
    from gpuledger.collector.wire import SEQ, stack
    new = batch()
    old = new.drop_columns([c for c in new.column_names if c in ADDED_COLUMNS])
    body = stack([(0, old), (1, new)])
    assert body.num_rows == old.num_rows + new.num_rows and set(body.column_names) == set(new.column_names) | {SEQ}
    added = next(c for c in ADDED_COLUMNS if c in new.column_names)
    assert body.column(added).to_pylist()[:old.num_rows] == [None] * old.num_rows
