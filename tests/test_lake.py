"""The DuckLake backend with a real PostgreSQL catalog, as a site runs it: one server writing what agents push, a
read-only API replica and a report job reading the same catalog at the same time, from other processes; and the
same batches giving the same totals as a DuckDB file. (The store, ingest and rollup tests also run on both
backends through the `open_store` fixture.)"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path

import pyarrow.compute as pc
import pytest
import requests

from gpuledger.analytics.config import Config
from gpuledger.analytics.cost import cost_by_team
from gpuledger.analytics.store import Store
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.simulator import default_simulator
from gpuledger.deploy.server import ApiServer
from tests.ingest_helpers import post
from tests.procs import TOKEN, free_port, wait_until
from tests.test_cli import GPULEDGER

NOW = utc_now().replace(second=0, microsecond=0)


def per_node_batches(hours: float = 3.0) -> dict[str, list]:
    sim = default_simulator(days=1, seed=5, now=NOW)
    out: dict[str, list] = {}
    for table in sim.history(NOW - timedelta(hours=hours), NOW - timedelta(minutes=3), step_s=60.0, chunk_s=1800.0):
        for node in sorted(set(table["node"].to_pylist())):
            out.setdefault(node, []).append(table.filter(pc.equal(table["node"], node)))
    return out


def totals(store: Store) -> list:
    bill = cost_by_team(store, NOW - timedelta(days=1), NOW)
    return sorted((r.team, round(r.gpu_hours, 6), round(r.cost_usd, 2)) for r in bill.itertuples())


def test_one_writer_a_read_only_replica_and_a_report_share_one_catalog(postgres, tmp_path):
    spec = "ducklake:postgres:" + postgres.create_database(f"site_{uuid.uuid4().hex[:8]}")
    writer = Store(spec, lake_data=tmp_path / "lake")
    writer.set_rates(Config().rates)
    server = ApiServer(writer, Config(), port=0, token=TOKEN, open_reads=True)
    url = server.start()
    port = free_port()
    replica = subprocess.Popen([GPULEDGER, "serve", "--read-only", "--open-reads", "--db", spec, "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        batches = per_node_batches()
        nodes = sorted(batches)
        for seq, part in enumerate(batches[nodes[0]]):  # one node's history before the replica looks
            post(url, part, node=nodes[0], seq=seq)
        replica_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(replica_url), 60, "the read-only replica")
        first = requests.get(replica_url + "/v1/costs", params={"days": 1}, timeout=60).json()
        for node in nodes[1:]:  # the rest arrives while the replica serves
            for seq, part in enumerate(batches[node]):
                post(url, part, node=node, seq=seq)
        again = post(url, batches[nodes[1]][0], node=nodes[1], seq=0).json()  # a resent batch
        assert again["status"] == "duplicate"
        writer.fold()
        mine = requests.get(url + "/v1/costs", params={"days": 1}, timeout=60).json()
        theirs = requests.get(replica_url + "/v1/costs", params={"days": 1}, timeout=60).json()
        assert rounded(theirs) == rounded(mine)  # the replica sees every commit of the writer
        assert sum(t["gpu_hours"] for t in theirs["teams"]) > sum(t["gpu_hours"] for t in first["teams"]) > 0
        assert sum(t["cost_usd"] for t in theirs["teams"]) > 0
        # a second reader in another process while the writer still holds the catalog: the weekly report
        report = subprocess.run([GPULEDGER, "report", "--week", "current", "--db", spec, "--out",
                                 str(tmp_path / "reports")], capture_output=True, text=True, timeout=180)
        assert report.returncode == 0, report.stderr
        html = re.search(r"report \S+: (\S+)", report.stdout).group(1)
        assert "idle capacity" in Path(html).read_text()
        # refused: a replica that would take pushes, and a file that cannot be shared
        refused = subprocess.run([GPULEDGER, "serve", "--read-only", "--db", spec, "--token", "x"],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "accepts no pushes" in refused.stderr
        file_only = subprocess.run([GPULEDGER, "serve", "--read-only", "--db", str(tmp_path / "f.duckdb")],
                                   capture_output=True, text=True, timeout=60)
        assert file_only.returncode == 2 and "DuckLake catalog" in file_only.stderr
    finally:
        replica.send_signal(signal.SIGINT)
        try:
            replica.wait(timeout=30)
        except subprocess.TimeoutExpired:
            replica.kill()
        server.stop()
        writer.close()


def rounded(costs: dict) -> list:
    """The bill to the cent and the micro-GPU-hour (sums may add up in another order in another process)."""
    return [(t["team"], round(t["gpu_hours"], 6), round(t["cost_usd"], 2)) for t in costs["teams"]]


def _answers(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def test_the_same_batches_give_the_same_totals_on_a_file_and_on_the_lake(postgres, tmp_path):
    spec = "ducklake:postgres:" + postgres.create_database(f"same_{uuid.uuid4().hex[:8]}")
    got = []
    for store in (Store(tmp_path / "file.duckdb"), Store(spec, lake_data=tmp_path / "lake")):
        store.set_rates(Config().rates)
        server = ApiServer(store, Config(), port=0, token=TOKEN, open_reads=True)
        url = server.start()
        try:
            for node, parts in per_node_batches(hours=2).items():
                for seq, part in enumerate(parts):
                    post(url, part, node=node, seq=seq)
            store.fold()
            got.append((totals(store), store.scalar("SELECT count(*) FROM samples"),
                        json.dumps(store.rollup_params(), default=str)))
        finally:
            server.stop()
            store.close()
    assert got[0] == got[1] and got[0][1] > 0


def test_a_bad_lake_spec_is_one_clear_error(tmp_path):
    out = subprocess.run([GPULEDGER, "report", "--db", "ducklake:sqlite:x"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "ducklake:postgres:<conninfo>" in out.stderr
    demo = subprocess.run([GPULEDGER, "demo", "--db", "ducklake:postgres:dbname=x", "--no-dashboard"],
                          capture_output=True, text=True, timeout=60)
    assert demo.returncode == 2 and "give --db a path" in demo.stderr
    with pytest.raises(Exception, match="cannot attach the DuckLake catalog"):
        Store("ducklake:postgres:host=127.0.0.1 port=1 dbname=nothing connect_timeout=2",
              lake_data=tmp_path / "lake")
