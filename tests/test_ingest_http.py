"""Central ingest over real HTTP: exactly-once, validation, tokens, node status and backlog requests."""
from __future__ import annotations

import logging
import math
import re
import time
from datetime import timedelta

import pyarrow as pa
import requests

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.collector.samples import SAMPLE_SCHEMA
from gpuledger.collector.simulator import cluster_of
from gpuledger.collector.wire import BATCHES_HEADER, INGEST_PATH, encode, per_batch, request_headers
from gpuledger.deploy.server import ApiServer
from tests.ingest_helpers import NOW, backlog_body, batch, post
from tests.procs import TOKEN


def test_a_resent_batch_is_acknowledged_but_stored_once(central):
    url, store = central
    first = post(url, batch(), seq=0)
    assert first.status_code == 200 and first.json() == {"status": "stored", "rows": 8, "rejected": {},
                                                          "nulled_values": 0}
    again = post(url, batch(), seq=0)
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    assert store.sample_count() == 8
    other_stream = post(url, batch(), seq=0, stream="s2")  # same samples under another id: samples deduplicated
    assert other_stream.json()["rows"] == 0 and other_stream.json()["rejected"] == {"duplicate_sample": 8}
    assert store.sample_count() == 8


def test_duplicate_rows_inside_a_batch_are_stored_once(central):
    url, store = central
    doubled = pa.concat_tables([batch(), batch()])
    body = post(url, doubled, seq=1).json()
    assert body["rows"] == 8 and body["rejected"] == {"duplicate_sample": 8}
    assert store.sample_count() == 8


def test_future_past_and_nan_rows_are_refused_or_nulled_with_a_log_line(central, caplog):
    url, store = central
    good = batch()
    rows = good.to_pylist()
    rows[0]["ts"] = NOW + timedelta(days=2)
    rows[1]["ts"] = NOW - timedelta(days=400)
    rows[2]["util_pct"] = math.nan
    rows[3]["power_w"] = math.inf
    rows[4]["gpu_uuid"] = None
    table = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    future = r'gpuledger_ingest_rows_rejected_total\{reason="future_ts"\} (\S+)'
    found = re.search(future, requests.get(url + "/metrics", timeout=10).text)
    before = float(found.group(1)) if found else 0.0  # the counter is the process's: earlier tests count too
    with caplog.at_level(logging.WARNING, logger="analytics.ingest"):
        body = post(url, table, seq=2).json()
    assert body["rows"] == 5 and body["nulled_values"] == 2
    assert body["rejected"] == {"future_ts": 1, "stale_ts": 1, "missing_key": 1}
    assert any("future_ts" in r.getMessage() and "NaN/Inf" in r.getMessage() for r in caplog.records)
    stored = store.query("SELECT count(*) FILTER (WHERE util_pct IS NULL) AS u, "
                         "count(*) FILTER (WHERE power_w IS NULL) AS p, count(*) AS n FROM samples")
    assert stored.values.tolist() == [[1, 1, 5]]
    metrics = requests.get(url + "/metrics", timeout=10).text
    assert float(re.search(future, metrics).group(1)) == before + 1


def test_writes_need_the_token_and_a_valid_body(central, tmp_path):
    url, store = central
    assert post(url, batch(), seq=3, token=None).status_code == 401
    assert post(url, batch(), seq=3, token="wrong").status_code == 401
    assert post(url, b"\x00garbage", seq=3).status_code == 422
    assert post(url, batch().drop_columns(["gpu_uuid"]), seq=3).status_code == 422
    assert post(url, batch(), seq=-1).status_code == 422
    assert post(url, batch(), seq=3, node="bad node/../x").status_code == 422
    assert store.sample_count() == 0
    with Store(tmp_path / "other.duckdb") as other:
        closed = ApiServer(other, Config(), port=0, open_reads=True)  # no bootstrap token, no tokens made
        other_url = closed.start()
        try:
            refused = post(other_url, batch(), seq=0)
            assert refused.status_code == 401 and "unknown or revoked token" in refused.json()["detail"]
        finally:
            closed.stop()


def test_concurrent_agents_are_group_committed_exactly_once(central, tmp_path):
    url, store = central
    from concurrent.futures import ThreadPoolExecutor
    sim = cluster_of(16)
    frame = sim.frame([NOW.timestamp() - 60], 10.0)
    per_node = [frame.filter(pa.compute.equal(frame["node"], f"node-{i:04d}")) for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: post(url, per_node[i], seq=0, node=f"node-{i:04d}").json(), range(16)))
        resent = list(pool.map(lambda i: post(url, per_node[i], seq=0, node=f"node-{i:04d}").json(), range(16)))
    assert all(r["status"] == "stored" and r["rows"] == 8 for r in results)
    assert all(r["status"] == "duplicate" for r in resent)
    assert store.sample_count() == 128
    nodes = requests.get(url + "/v1/nodes", timeout=10).json()
    assert len(nodes) == 16 and not any(n["stale"] for n in nodes)


def test_a_node_goes_stale_after_three_silent_intervals(central):
    url, _ = central
    table = batch()
    requests.post(url + INGEST_PATH, data=encode(table), timeout=30,
                  headers=request_headers("quiet", "s", 0, interval_s=1.0, token=TOKEN))
    assert requests.get(url + "/v1/nodes", timeout=10).json()[0]["stale"] is False
    time.sleep(3.5)  # three 1 s intervals without a batch
    node = requests.get(url + "/v1/nodes", timeout=10).json()[0]
    assert node["node"] == "quiet" and node["stale"] is True


def test_a_backlog_travels_in_one_request_with_a_result_per_batch(central):
    url, store = central
    sim = cluster_of(1)
    tables = [sim.frame([NOW.timestamp() - 60 + 10 * k], 10.0) for k in range(3)]
    body = backlog_body(tables, 5)
    post(url, tables[1], seq=6)  # batch 6 already arrived on its own earlier
    headers = request_headers("node-0000", "s1", 5, 10.0, batches=3, token=TOKEN)
    raw = requests.post(url + INGEST_PATH, data=encode(body), headers=headers, timeout=30).json()
    assert raw == {"first_seq": 5, "batches": 3, "rows": [8, 0, 8], "duplicates": [6], "rejected": {},
                   "nulled_values": {}}
    assert [(b["seq"], b["status"], b["rows"]) for b in per_batch(raw)] == [
        (5, "stored", 8), (6, "duplicate", 0), (7, "stored", 8)]
    assert store.sample_count() == 24
    headers[BATCHES_HEADER] = "2"  # body holds seq 7, outside 5..6
    assert requests.post(url + INGEST_PATH, data=encode(body), headers=headers, timeout=30).status_code == 422


def test_a_big_backlog_body_is_checked_like_small_ones(central):
    """Bodies of 256+ rows are screened on arrival rather than by the writer; the answers must not differ."""
    url, store = central
    sim = cluster_of(1)
    tables = [sim.frame([NOW.timestamp() - 3000 + 10 * k], 10.0) for k in range(40)]
    rows = tables[3].to_pylist()
    rows[0]["ts"] = NOW + timedelta(days=1)
    rows[1]["util_pct"] = math.nan
    tables[3] = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    tables[5] = pa.concat_tables([tables[5], tables[5].slice(0, 2)])  # two samples sent twice
    body = backlog_body(tables, 100)
    assert body.num_rows >= 256
    headers = request_headers("node-0000", "big", 100, 10.0, batches=40, token=TOKEN)
    answer = per_batch(requests.post(url + INGEST_PATH, data=encode(body), headers=headers, timeout=30).json())
    assert [b["seq"] for b in answer] == list(range(100, 140))
    assert answer[3]["rows"] == 7 and answer[3]["rejected"] == {"future_ts": 1} and answer[3]["nulled_values"] == 1
    assert answer[5]["rows"] == 8 and answer[5]["rejected"] == {"duplicate_sample": 2}
    assert all(b["rows"] == 8 and not b["rejected"] for k, b in enumerate(answer) if k not in (3, 5))
    assert store.sample_count() == 319


def test_an_agent_whose_clock_jumps_forward_and_back_is_stored_exactly(central):
    """Sequence numbers, not clocks, identify batches: a node whose clock jumps 2 h ahead has those samples refused
    as future (counted), and back 1 h has its earlier instants stored; instants it sends twice are stored once."""
    url, store = central
    t0 = NOW - timedelta(minutes=5)
    instants = ([t0 + timedelta(seconds=10 * k) for k in range(10)]  # a good clock
                + [t0 + timedelta(hours=2, seconds=10 * k) for k in range(5)]  # jumped forward
                + [t0 - timedelta(hours=1, seconds=-10 * k) for k in range(5)]  # jumped back, to new instants
                + [t0 + timedelta(seconds=10 * k) for k in range(5)])  # back onto instants already sent
    future = r'gpuledger_ingest_rows_rejected_total\{reason="future_ts"\} (\S+)'
    found = re.search(future, requests.get(url + "/metrics", timeout=10).text)
    before = float(found.group(1)) if found else 0.0
    answers = [post(url, batch(at), seq=seq, node="node-0000").json() for seq, at in enumerate(instants)]
    assert all(a["status"] == "stored" for a in answers)
    assert [a["rows"] for a in answers] == [8] * 10 + [0] * 5 + [8] * 5 + [0] * 5
    assert all(a["rejected"] == {"future_ts": 8} for a in answers[10:15])
    assert all(a["rejected"] == {"duplicate_sample": 8} for a in answers[20:])
    counts = store.query("SELECT count(*) AS n, count(DISTINCT (gpu_uuid, ts)) AS d FROM samples")
    assert counts.values.tolist() == [[120, 120]]
    assert float(re.search(future, requests.get(url + "/metrics", timeout=10).text).group(1)) == before + 40
