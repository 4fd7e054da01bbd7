"""The hostile agent of issue 40 against a real server on 127.0.0.1, with real agent tokens, through HTTP only:
rows microseconds apart, a day-long declared interval, invented GPUs, a squat across a 15-minute silence and a server
restart, then the admin's move. Each team's billed GPU-hours (the ledger's own query, after the fold) stay what
the real GPUs could have used."""
from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import requests

from gpuledger.analytics.config import Config, IngestConfig
from gpuledger.analytics.cost import cost_by_team
from gpuledger.analytics.store import Store
from gpuledger.collector.simulator import cluster_of
from gpuledger.collector.wire import encode, request_headers
from gpuledger.deploy.server import ApiServer
from tests.procs import GPULEDGER, TOKEN

NOW = datetime.now(timezone.utc).replace(microsecond=0)
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
# a node registers the GPUs of its first report only (the default window is its first quarter hour)
SITE = Config(ingest=IngestConfig(register_window_s=0.0))


def rows_at(node: int, stamps: list[float], team: str) -> pa.Table:
    frame = cluster_of(2).frame(stamps, 10.0)
    frame = frame.filter(pc.equal(frame["node"], f"node-{node:04d}"))
    n = frame.num_rows
    for name, value in (("team", team), ("allocated", True), ("job_id", f"{team}/job"), ("namespace", team)):
        frame = frame.set_column(frame.schema.get_field_index(name), name, pa.array([value] * n,
                                                                                    frame.schema.field(name).type))
    return frame


def push(url: str, token: str, node: str, stream: str, seq: int, table: pa.Table, interval: float = 10.0):
    return requests.post(f"{url}/v1/ingest", data=encode(table), timeout=60,
                         headers=request_headers(node, stream, seq, interval, 1, token))


def gpu_hours(store: Store) -> dict[str, float]:
    store.fold()
    lines = cost_by_team(store, NOW - timedelta(days=1), NOW + timedelta(hours=1))
    return {team: float(h) for team, h in zip(lines["team"], lines["gpu_hours"])}


def test_a_hostile_agent_cannot_bill_time_that_did_not_pass_nor_take_another_nodes_gpus(tmp_path):
    path = tmp_path / "h.duckdb"
    t0 = (NOW - timedelta(hours=2)).timestamp()
    with Store(path) as store:
        store.set_rates(Config().rates)
        server = ApiServer(store, SITE, port=0, token=TOKEN)
        url = server.start()
        try:
            tokens = {n: requests.post(f"{url}/v1/tokens", json={"name": n, "role": f"agent:{n}"}, headers=ADMIN,
                                       timeout=10).json()["token"] for n in ("node-0000", "node-0001")}
            honest = rows_at(0, [t0 + 10 * i for i in range(30)], "vision")  # 5 minutes of 8 GPUs
            assert push(url, tokens["node-0000"], "node-0000", "a", 0, honest).json()["rows"] == 240
            evil = tokens["node-0001"]
            assert push(url, evil, "node-0001", "e", 0, rows_at(1, [t0], "nlp")).json()["rows"] == 8
            base = gpu_hours(store)
            assert base == {"vision": pytest.approx(8 * 300 / 3600), "nlp": pytest.approx(8 * 10 / 3600)}
            # 1,000 rows of its own GPUs a microsecond apart: at most one interval past what it had
            one = rows_at(1, [t0 + 20], "nlp")
            burst = one.take(pa.array(np.repeat(np.arange(8), 125)))
            stamps = [datetime.fromtimestamp(t0 + 20, timezone.utc) + timedelta(microseconds=i % 125)
                      for i in range(1000)]
            burst = burst.set_column(0, "ts", pa.array(stamps, pa.timestamp("us", tz="UTC")))
            answer = push(url, evil, "node-0001", "e", 1, burst).json()
            assert answer["rows"] == 8 and answer["rejected"] == {"overlaps_stored": 992}
            # a declared day-long interval: refused whole, before anything is stored
            day = push(url, evil, "node-0001", "e", 2, rows_at(1, [t0 + 40], "nlp"), interval=86400.0)
            assert day.status_code == 422 and "max_interval_s" in day.text
            # invented GPUs, once the node's registration window is over: held, never billed
            invented = rows_at(1, [t0 + 60], "nlp")
            fake = [f"GPU-invented-{i:03d}" for i in range(64)]
            invented = invented.take(pa.array(np.arange(64) % 8)).set_column(
                invented.schema.get_field_index("gpu_uuid"), "gpu_uuid", pa.array(fake))
            held = push(url, evil, "node-0001", "e", 3, invented).json()
            assert held["rows"] == 0 and held["rejected"] == {"gpu_not_in_inventory": 64}
        finally:
            server.stop()
        hours_before_squat = gpu_hours(store)
        assert hours_before_squat["vision"] == pytest.approx(8 * 300 / 3600)
        # node-0000 silent for 15 minutes and the server restarted: node-0001 sends node-0000's GPUs
        server = ApiServer(store, SITE, port=0, token=TOKEN)
        url = server.start()
        try:
            squat = rows_at(0, [t0 + 300 + 900 + 10 * i for i in range(6)], "nlp")
            answer = push(url, evil, "node-0001", "e", 4, squat).json()
            assert answer["rows"] == 0 and answer["rejected"] == {"gpu_on_other_node": 48}
            assert gpu_hours(store)["vision"] == pytest.approx(8 * 300 / 3600)  # vision's bill as it was
            back = rows_at(0, [t0 + 300 + 900 + 10 * i for i in range(6)], "vision")
            assert push(url, tokens["node-0000"], "node-0000", "a", 1, back).json()["rows"] == 48
            listed = requests.get(f"{url}/v1/nodes/inventory", headers=ADMIN, timeout=10).json()
            assert sum(h["rows"] for h in listed["held"] if h["reason"] == "gpu_on_other_node") == 48
            # the admin's view and move, from the command line beside the running server
            gpu = squat["gpu_uuid"][0].as_py()
            shown = subprocess.run([GPULEDGER, "node", "list", "--server", url, "--token", TOKEN],
                                   capture_output=True, text=True, timeout=60)
            assert shown.returncode == 0 and f"HELD 6 row(s) of {gpu} sent by node-0001" in shown.stdout
            moved = subprocess.run([GPULEDGER, "node", "assign", gpu, "--to", "node-0001", "--server", url,
                                    "--token", TOKEN], capture_output=True, text=True, timeout=60)
            # node-0000 billed those six instants of the GPU already: nothing of node-0001's is billed twice
            assert moved.returncode == 0, moved.stderr
            assert "registered to node-0001 (was node-0000): 0 held row(s) billed" in moved.stdout
            assert gpu_hours(store)["vision"] == pytest.approx(8 * 360 / 3600)
        finally:
            server.stop()
