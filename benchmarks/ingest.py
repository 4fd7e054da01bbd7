"""End-to-end ingest: simulated agents -> HTTP -> central server -> DuckDB, against DuckDB's own Arrow insert.

Usage: python benchmarks/ingest.py [--nodes 128] [--intervals 360] [--repeats 3]

1. Wire format: bytes and encode time per 8-GPU batch, Arrow IPC (lz4, ours; zstd) vs gzipped JSON lines.
2. DuckDB's own Arrow insert of the same rows into the same table, in this process: one INSERT per
   8-GPU batch, and one INSERT of everything (DuckDB's best case; twice each with DuckDB's default
   threads and with one thread, and the fastest of the four is the baseline).
3. Throughput into a real `gpuledger serve` process on 127.0.0.1 (exactly-once ingest, group commit),
   one sender per node (--nodes of them), each with its own keep-alive connection:
   - backlog drain: each node has --intervals batches spooled (a server outage) and sends them the
     way the agent does, up to 360 consecutive batches per request; after one warm-up drain, --repeats
     times, each on the hour after the last (as after successive outages: newer than what is stored),
     median reported, also counting the WAL checkpoint the server does once ingest goes quiet;
   - steady state: each node POSTs its batches one at a time (8 rows per request).
   The senders use http.client with bodies encoded beforehand: they share this machine's cores with
   the server, so they spend as little CPU as they can; the agent's own cost is measured in 4.
4. Agent CPU: the agent loop (sample one 8-GPU node, encode, spool with fsync, POST, delete) in this
   process, as CPU seconds per cycle and as % of one core at a 10 s interval.
"""
from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import requests

from gpuledger.analytics.store.database import IDLE_CHECKPOINT_BYTES, wal_bytes
from gpuledger.analytics.store.schema import DDL
from gpuledger.collector.agent.agent import MAX_BATCHES_PER_REQUEST, Agent
from gpuledger.collector.agent.spool import Spool
from gpuledger.collector.simulator import SimulatorSource, cluster_of
from gpuledger.collector.wire import CONTENT_TYPE, encode, stack

TOKEN = "bench-token"
STEADY_INTERVALS = 30  # the steady-state run sends the first 30 intervals: 8 rows a request is slow to time
GPULEDGER = str(Path(sys.executable).with_name("gpuledger"))


def per_node_batches(nodes: int, intervals: int, interval_s: float, end: float) -> list[tuple[str, int, pa.Table]]:
    """Each node's 8-GPU batches for `intervals` intervals up to `end` (epoch seconds)."""
    sim = cluster_of(nodes)
    out = []
    for k in range(intervals):
        frame = sim.frame([end - (intervals - k) * interval_s], interval_s)
        for i in range(nodes):
            name = f"node-{i:04d}"
            out.append((name, k, frame.slice(i * 8, 8)))
    assert all(t["node"][0].as_py() == n for n, _, t in out[:nodes])
    return out


def wire_formats(table: pa.Table, repeat: int = 300) -> None:
    start = time.perf_counter()
    for _ in range(repeat):
        arrow = encode(table)
    arrow_s = (time.perf_counter() - start) / repeat
    start = time.perf_counter()
    for _ in range(repeat):
        zstd = encode(table, "zstd")
    zstd_s = (time.perf_counter() - start) / repeat
    start = time.perf_counter()
    for _ in range(repeat):
        lines = "\n".join(json.dumps(r, default=str) for r in table.to_pylist()).encode()
        jsonl = gzip.compress(lines)
    json_s = (time.perf_counter() - start) / repeat
    print(f"wire, one 8-GPU batch, bytes and encode time: Arrow IPC+lz4 (ours) {len(arrow):,} B "
          f"{arrow_s * 1e6:,.0f} us; Arrow IPC+zstd {len(zstd):,} B {zstd_s * 1e6:,.0f} us; "
          f"JSON lines+gzip {len(jsonl):,} B {json_s * 1e6:,.0f} us")


def duckdb_baseline(batches: list[tuple[str, int, pa.Table]], workdir: Path) -> tuple[float, dict[str, float]]:
    """Rows/s for one INSERT per batch, and for one INSERT of everything by DuckDB thread setting."""
    rows = sum(t.num_rows for _, _, t in batches)
    everything = pa.concat_tables([t for _, _, t in batches]).combine_chunks()  # DuckDB's best case
    bulk = {}
    for label, config in (("default threads", {}), ("1 thread", {"threads": 1})):
        for attempt in range(2):  # the faster of two, each into a fresh file: the stricter baseline
            path = workdir / f"baseline-{len(bulk)}-{attempt}.duckdb"
            with duckdb.connect(str(path), config=config) as con:
                con.execute(DDL[0])
                con.register("b", everything)
                start = time.perf_counter()
                con.execute("INSERT INTO samples BY NAME SELECT * FROM b")
                bulk[label] = max(bulk.get(label, 0.0), rows / (time.perf_counter() - start))
    with duckdb.connect(str(workdir / "baseline-per-batch.duckdb")) as con:
        con.execute(DDL[0])
        sample = batches[:2000]  # one commit per batch is slow; its rate settles long before this
        start = time.perf_counter()
        for _, _, table in sample:
            con.register("b", table)
            con.execute("INSERT INTO samples BY NAME SELECT * FROM b")
            con.unregister("b")
        per_batch = sum(t.num_rows for _, _, t in sample) / (time.perf_counter() - start)
    return per_batch, bulk


def start_server(workdir: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([GPULEDGER, "serve", "--create", "--source", "none", "--token", TOKEN, "--port", str(port),
                             "--db", str(workdir / "central.duckdb"), "--reports", str(workdir / "reports")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok:
                return proc
        except requests.RequestException:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not start")


def push_all(url: str, batches: list[tuple[str, int, pa.Table]], interval_s: float, stream: str,
             per_request: int) -> tuple[float, float]:
    """One sender per node, sending its batches in order, `per_request` consecutive batches per POST."""
    by_node: dict[str, list[tuple[int, pa.Table]]] = {}
    for node, seq, table in batches:
        by_node.setdefault(node, []).append((seq, table))
    requests_by_node = {}
    for node, items in by_node.items():  # encoded up front: encoding is the agents' CPU, measured below
        chunks = [items[i:i + per_request] for i in range(0, len(items), per_request)]
        requests_by_node[node] = [
            (chunk[0][0], len(chunk), encode(chunk[0][1] if len(chunk) == 1 else stack(chunk))) for chunk in chunks]

    host, port = url.removeprefix("http://").split(":")

    def sender(node: str) -> int:
        # http.client, not requests: the load generator shares this machine's cores with the server,
        # so it should spend as little of them as it can (the real agent's CPU is measured below)
        connection, stored = http.client.HTTPConnection(host, int(port), timeout=120), 0
        for first, count, body in requests_by_node[node]:
            connection.request("POST", "/v1/ingest", body=body, headers={
                "Authorization": f"Bearer {TOKEN}", "Content-Type": CONTENT_TYPE, "X-Gpuledger-Node": node,
                "X-Gpuledger-Stream": stream, "X-Gpuledger-Seq": str(first), "X-Gpuledger-Batches": str(count),
                "X-Gpuledger-Interval": str(interval_s)})
            response = connection.getresponse()
            data = response.read()
            if response.status != 200:
                raise SystemExit(f"server answered {response.status}: {data[:300]!r}")
            answer = json.loads(data)
            stored += sum(answer["rows"]) if "batches" in answer else answer["rows"]
        connection.close()
        return stored

    start, cpu = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(len(requests_by_node)) as pool:
        stored = sum(pool.map(sender, requests_by_node))
    elapsed = time.perf_counter() - start
    expected = sum(t.num_rows for _, _, t in batches)
    if stored != expected:
        raise SystemExit(f"stored {stored} rows, expected {expected}")
    return elapsed, time.process_time() - cpu


def checkpoint_seconds(url: str) -> float:
    """Seconds the server has spent in its idle checkpoints so far (its own histogram, all kinds)."""
    text = requests.get(url + "/metrics", timeout=10).text
    return sum(float(t) for t in re.findall(r"^gpuledger_store_checkpoint_seconds_sum\{[^}]*\} (\S+)$", text, re.M))


def later(batches: list[tuple[str, int, pa.Table]], seconds: float) -> list[tuple[str, int, pa.Table]]:
    """The same batches, `seconds` later."""
    shift = pa.scalar(round(seconds * 1e6), pa.duration("us"))
    return [(n, k, t.set_column(0, "ts", pc.add(t["ts"], shift))) for n, k, t in batches]


def drain_once(url: str, db: Path, batches: list[tuple[str, int, pa.Table]], interval_s: float, run: str
               ) -> tuple[float, float, float, int]:
    """One backlog drain: (seconds, load generator CPU s, checkpoint s, WAL bytes left).

    The server folds its WAL into the file once ingest is quiet and the WAL has passed 16 MB (what it
    does not fold stays for the next quiet moment); rows a drain commits in full DuckDB row groups go
    straight to the file and never reach the WAL.
    """
    before = checkpoint_seconds(url)
    seconds, load_cpu = push_all(url, batches, interval_s, f"drain-{run}", per_request=MAX_BATCHES_PER_REQUEST)
    deadline = time.monotonic() + 30
    while wal_bytes(db) >= IDLE_CHECKPOINT_BYTES and time.monotonic() < deadline:
        time.sleep(0.2)
    return seconds, load_cpu, checkpoint_seconds(url) - before, wal_bytes(db)

def agent_cpu(url: str, workdir: Path, cycles: int, interval_s: float) -> tuple[float, float]:
    source = SimulatorSource(cluster_of(1), interval_s, node="node-0000", replay_start=time.time() - 200_000)
    agent = Agent(source, Spool(workdir / "agent-spool"), url, TOKEN, "node-0000", interval_s)  # its own GPUs
    agent.sample_once()
    agent.drain()  # warm: imports, connection
    cpu = time.process_time()
    for _ in range(cycles):
        agent.sample_once()
        agent.drain()
    total = (time.process_time() - cpu) / cycles
    tables = [source.collect_step(10_000 + k) for k in range(cycles)]  # instants the loop above never used
    cpu = time.process_time()
    for table in tables:
        agent.spool.put(encode(table), table.num_rows)
        agent.drain()
    shipping = (time.process_time() - cpu) / cycles
    return total, shipping


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--intervals", type=int, default=360, help="backlog per node (default: an hour at 10 s)")
    parser.add_argument("--repeats", type=int, default=3, help="backlog drains to take the median of")
    parser.add_argument("--agent-cycles", type=int, default=200)
    args = parser.parse_args()
    interval_s = 10.0
    workdir = Path(tempfile.mkdtemp(prefix="gpuledger-bench-"))
    try:
        # each drain (a warm-up, then --repeats) and then the steady run gets the hour after the one
        # before, as after successive outages: agents send in time order, newer than what is stored
        span = args.intervals * interval_s
        start = time.time() - 120 - (args.repeats + 1) * span
        batches = per_node_batches(args.nodes, args.intervals, interval_s, start)
        rows = sum(t.num_rows for _, _, t in batches)
        print(f"{args.nodes} nodes x 8 GPUs, {args.intervals} intervals: {len(batches):,} batches, {rows:,} rows")
        wire_formats(batches[0][2])
        per_batch, bulk = duckdb_baseline(batches, workdir)
        best = max(bulk.values())
        port = 18000 + os.getpid() % 1000
        server = start_server(workdir, port)
        try:
            url = f"http://127.0.0.1:{port}"
            db = workdir / "central.duckdb"
            drain_once(url, db, batches, interval_s, "warm-up")  # not counted: first-use costs in the server
            drains = [drain_once(url, db, later(batches, (run + 1) * span), interval_s, str(run))
                      for run in range(args.repeats)]
            steady_batches = [b for b in later(batches, (args.repeats + 1) * span) if b[1] < STEADY_INTERVALS]
            steady, _ = push_all(url, steady_batches, interval_s, "steady", per_request=1)
            cycle, shipping = agent_cpu(url, workdir, args.agent_cycles, interval_s)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
        print(f"DuckDB Arrow insert, one INSERT per batch          : {per_batch:10,.0f} rows/s")
        for label, rate in bulk.items():
            print(f"DuckDB Arrow insert, one INSERT for all, {label:15}: {rate:10,.0f} rows/s")
        drain_s = statistics.median(d[0] for d in drains)
        with_checkpoint_s = drain_s + statistics.mean(d[2] for d in drains)  # checkpoints are rare: spread them
        results = [(f"backlog drain, <={MAX_BATCHES_PER_REQUEST} batches/request", rows / drain_s),
                   ("  the same, checkpoints spread over drains", rows / with_checkpoint_s),
                   ("steady, 1 batch/request", sum(t.num_rows for _, _, t in steady_batches) / steady)]
        for label, rate in results:
            print(f"gpuledger agents -> HTTP -> DuckDB, {label:36}: {rate:10,.0f} rows/s "
                  f"({rate / per_batch:5.1f}x per-batch insert, {rate / best:.2f}x DuckDB's best single insert)")
        print("  drains (s, load generator CPU s, checkpoint s, WAL MB left for later): "
              + "; ".join(f"{d:.2f}, {c:.2f}, {k:.2f}, {w / 1e6:.1f}" for d, c, k, w in drains))
        print(f"agent CPU per 10 s cycle (sample+encode+spool+send): {cycle * 1e3:.2f} ms = "
              f"{cycle / interval_s * 100:.3f}% of a core; shipping alone {shipping * 1e3:.2f} ms = "
              f"{shipping / interval_s * 100:.3f}%")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
