"""Soak: many agents pushing in compressed time while the dashboard's API calls run, then faults, with every row
accounted for.

Usage: python benchmarks/soak.py [--nodes 128] [--speedup 10] [--seconds 30] [--readers 4] [--json]

A real `gpuledger serve` process on 127.0.0.1 receives one sender per node. Each sender posts its node's next
10 s batch (8 GPUs) as an agent does: one request per batch, in order, resent until acknowledged (connection
refused and 503 are retried). Time is compressed: the cluster's clock moves 10 s every 10/--speedup wall seconds.

1. ingest alone for --seconds: rows stored per second (the baseline of 2);
2. the same ingest while --readers threads make the dashboard's calls (dashboard/client.py `calls`) in a loop:
   rows per second as a ratio of 1's, and read latency p50, p95 and max;
3. faults, each while the senders run:
   - kill -9 of the server inside a group commit (a failpoint holds one open), then a restart;
   - the database's disk full (the store sits on a tmpfs this script mounts; needs root) for a few seconds;
   - one node's clock jumping 2 h forward (its samples are refused as future) and 1 h back;
   - one node sending batches an older agent wrote (without the columns added since).
4. attacks (issue 21; --no-attacks skips them, --small shrinks them), each measured by the server's peak RSS
   (VmHWM, reset before each phase) and /healthz latency from 127.0.0.1 while it runs:
   - a decompression bomb: an LZ4 body of zeros that declares ~1 GiB unpacked (refused 422 from its headers);
   - oversized bodies without a token: 400 MiB declared to /v1/placement and /v1/tokens, and 8 MiB streamed;
   - a flood of half-sent request heads from 127.0.0.2 (the per-client cap and the head timeout);
   - /v1/gpus over 366 days at 1-minute buckets (answered at a coarser bucket).
After the run the store is read and compared with what was sent: per phase, rows sent, stored, refused (future
instants, counted by the server), lost (sent and acknowledged but absent, or never acknowledged) and duplicated.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pyarrow.compute as pc
import requests

from gpuledger.collector.samples import ADDED_COLUMNS
from gpuledger.collector.simulator import cluster_of
from gpuledger.collector.wire import CONTENT_TYPE, INGEST_PATH, encode, request_headers
from gpuledger.dashboard.client import calls

TOKEN = "soak-token"
INTERVAL_S = 10.0
FUTURE_LIMIT = timedelta(minutes=5)  # the server refuses samples further ahead of its clock (ingest max_future_s)
GPULEDGER = str(Path(sys.executable).with_name("gpuledger"))


@dataclass
class Sent:
    """One batch handed to a sender: its node, seq, instant, rows and the phase it belongs to."""

    node: str
    seq: int
    ts: datetime
    rows: int
    phase: str
    future: bool = False  # an instant past the server's future limit: refused by design
    acked: bool = False


@dataclass
class Sender:
    """One node's agent: a queue of encoded batches sent in order, each resent until acknowledged."""

    node: str
    port: int
    queue: "queue.Queue[tuple[Sent, bytes] | None]" = field(default_factory=queue.Queue)
    retries: int = 0

    def run(self) -> None:
        conn = None
        while (item := self.queue.get()) is not None:
            sent, body = item
            while True:
                try:
                    conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                    conn.request("POST", INGEST_PATH, body=body, headers=request_headers(
                        self.node, "soak", sent.seq, INTERVAL_S, token=TOKEN))
                    response = conn.getresponse()
                    response.read()
                    if response.status == 200:
                        sent.acked = True
                        break
                    if response.status != 503:
                        raise RuntimeError(f"{self.node} seq {sent.seq}: {response.status}")
                except (OSError, http.client.HTTPException):
                    if conn is not None:
                        conn.close()
                    conn = None
                self.retries += 1
                time.sleep(0.3)


class Server:
    """`gpuledger serve` as a child process, restartable with a failpoint."""

    def __init__(self, db: Path, port: int, log: Path) -> None:
        self.db, self.port, self.log = db, port, log
        self.proc: subprocess.Popen | None = None

    def start(self, failpoints: str = "") -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", GPULEDGER_FAILPOINTS=failpoints)
        self.proc = subprocess.Popen([GPULEDGER, "serve", "--create", "--source", "none", "--token", TOKEN,
                                      "--open-reads",
                                      "--port", str(self.port), "--db", str(self.db),
                                      "--reports", str(self.log.parent / "reports")],
                                     stdout=open(self.log, "a"), stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2).ok:
                    return
            except requests.RequestException:
                time.sleep(0.2)
        raise RuntimeError(f"server did not start: {self.log.read_text()[-2000:]}")

    def metric(self, name: str) -> float:
        page = requests.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(name))

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


class Cluster:
    """The simulated nodes' clock: every tick, each node's next batch goes to its sender."""

    def __init__(self, nodes: int, port: int, speedup: float) -> None:
        self.now = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=6)
        self.sim = cluster_of(nodes, now=self.now)
        self.senders = {f"node-{i:04d}": Sender(f"node-{i:04d}", port) for i in range(nodes)}
        self.seq = dict.fromkeys(self.senders, 0)
        self.period_s = INTERVAL_S / speedup
        self.sent: list[Sent] = []
        self.phase = "warm-up"
        self.skew: dict[str, timedelta] = {}  # a node whose clock is off
        self.old_format: set[str] = set()  # nodes sending batches as an older agent wrote them
        self.threads = [threading.Thread(target=s.run, daemon=True) for s in self.senders.values()]
        for thread in self.threads:
            thread.start()

    def tick(self) -> None:
        frame = self.sim.frame([self.now.timestamp()], INTERVAL_S)
        for node, sender in self.senders.items():
            table = frame.filter(pc.equal(frame["node"], node))
            skew = self.skew.get(node)
            if skew:
                table = table.set_column(table.schema.get_field_index("ts"), "ts",
                                         pc.add(table["ts"], pc.cast(skew, "duration[us]")))
            if node in self.old_format:
                table = table.drop_columns([c for c in table.column_names if c in ADDED_COLUMNS])
            ts = table["ts"][0].as_py()
            sent = Sent(node, self.seq[node], ts, table.num_rows, self.phase,
                        future=ts > datetime.now(timezone.utc) + FUTURE_LIMIT)
            self.seq[node] += 1
            self.sent.append(sent)
            sender.queue.put((sent, encode(table)))
        self.now += timedelta(seconds=INTERVAL_S)

    def run_for(self, seconds: float, phase: str) -> None:
        self.phase = phase
        deadline = time.monotonic() + seconds
        next_at = time.monotonic()
        while time.monotonic() < deadline:
            self.tick()
            next_at += self.period_s
            time.sleep(max(0.0, next_at - time.monotonic()))

    def backlog(self) -> int:
        return sum(s.queue.qsize() for s in self.senders.values())

    def drain(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while (self.backlog() or not all(s.acked for s in self.sent[-len(self.senders):])) \
                and time.monotonic() < deadline:
            time.sleep(0.2)

    def close(self) -> None:
        self.drain()
        for sender in self.senders.values():
            sender.queue.put(None)
        for thread in self.threads:
            thread.join(timeout=60)


def stored_rows(server: Server, cluster: Cluster, seconds: float) -> float:
    """Rows per second the server stored over `seconds` of steady ingest (from its own counter)."""
    before = server.metric("gpuledger_ingest_rows_total")
    started = time.monotonic()
    cluster.run_for(seconds, cluster.phase)
    return (server.metric("gpuledger_ingest_rows_total") - before) / (time.monotonic() - started)


def read_loop(port: int, stop_file: Path) -> None:
    """The dashboard's calls over and over (a fresh window end each round, as each redraw has) until `stop_file`
    exists; then prints {"latencies": {call: [s, ...]}, "failures": [...]} as JSON. Run as a process of its own
    (`--reader`), as a dashboard is: the senders' threads in this one would slow the reader, not the server."""
    session = requests.Session()
    latencies: dict[str, list[float]] = defaultdict(list)
    failures: list[str] = []
    while not stop_file.exists():
        end = datetime.now(timezone.utc).replace(second=0, microsecond=0).isoformat()
        for name, (path, params) in calls(7, 60, end).items():
            started = time.perf_counter()
            response = session.get(f"http://127.0.0.1:{port}{path}", params=params, timeout=60)
            latencies[name].append(time.perf_counter() - started)
            if not response.ok:
                failures.append(f"{path}: {response.status_code}")
            if stop_file.exists():
                break
    print(json.dumps({"latencies": latencies, "failures": failures}))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    try:
        with open(filler, "wb", buffering=0) as handle:
            while True:
                handle.write(b"\0" * 65536)
    except OSError:
        pass
    return filler


def account(cluster: Cluster, db: Path) -> dict[str, dict[str, int]]:
    """Per phase: batches and rows sent, stored, refused (future), lost and duplicated, against the store."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        held = con.execute("SELECT node, ts, count(*) AS n, count(DISTINCT gpu_uuid) AS d FROM samples "
                           "WHERE node LIKE 'node-%' GROUP BY node, ts").fetchall()
        nulls = con.execute("SELECT count(*) FROM samples WHERE xid IS NULL AND nvlink_bps IS NULL "
                            "AND ecc_dbe_total IS NULL").fetchone()[0]
    finally:
        con.close()
    found = {(node, ts.astimezone(timezone.utc)): (n, d) for node, ts, n, d in held}
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for s in cluster.sent:
        row = out[s.phase]
        row["batches"] += 1
        row["rows_sent"] += s.rows
        n, distinct = found.get((s.node, s.ts), (0, 0))
        row["stored"] += n
        row["duplicated"] += n - distinct
        if s.future:
            row["refused"] += s.rows
            row["lost"] += n  # a future row stored would be a bug too
        else:
            row["lost"] += s.rows - distinct
    out["_old_format_rows_with_nulls"] = {"rows": nulls}
    return {k: dict(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=128, help="simulated agents (8 GPUs each; default 128)")
    parser.add_argument("--speedup", type=float, default=10.0, help="cluster seconds per wall second (default 10)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each load phase (default 30)")
    parser.add_argument("--readers", type=int, default=4, help="threads making the dashboard's calls (default 4)")
    parser.add_argument("--fault-seconds", type=float, default=5.0, help="how long each fault lasts (default 5)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (server log, database)")
    parser.add_argument("--no-attacks", action="store_true", help="skip the attack phases")
    parser.add_argument("--small", action="store_true",
                        help="smaller attacks: a 256 MiB bomb, 500 half-sent heads (what tests/test_soak.py runs)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpuledger-soak-"))
    dbfs = work / "dbfs"
    on_tmpfs = os.geteuid() == 0 and mount_tmpfs(dbfs, "2g")
    dbfs.mkdir(exist_ok=True)
    port = _free_port()
    server = Server(dbfs / "soak.duckdb", port, work / "server.log")
    server.start()
    cluster = Cluster(args.nodes, port, args.speedup)
    report: dict = {"nodes": args.nodes, "gpus": 8 * args.nodes, "speedup": args.speedup,
                    "offered_rows_per_s": 8 * args.nodes / cluster.period_s}
    try:
        cluster.run_for(min(5.0, args.seconds), "warm-up")
        cluster.phase = "ingest alone"
        alone = stored_rows(server, cluster, args.seconds)
        stop_file = work / "stop-reading"
        readers = [subprocess.Popen([sys.executable, __file__, "--reader", str(port), str(stop_file)],
                                    stdout=subprocess.PIPE, text=True) for _ in range(args.readers)]
        cluster.phase = "ingest + readers"
        with_readers = stored_rows(server, cluster, args.seconds)
        stop_file.touch()
        latencies: dict[str, list[float]] = defaultdict(list)
        failures: list[str] = []
        for reader in readers:
            out, _ = reader.communicate(timeout=120)
            took = json.loads(out)
            for name, values in took["latencies"].items():
                latencies[name] += values
            failures += took["failures"]
        every = [v for values in latencies.values() for v in values]
        report["ingest"] = {"rows_per_s_alone": alone, "rows_per_s_with_readers": with_readers,
                            "ratio": with_readers / alone if alone else float("nan")}
        report["reads"] = {"count": len(every), "failed": len(failures), "p50_s": percentile(every, 0.5),
                           "p95_s": percentile(every, 0.95), "max_s": max(every, default=float("nan")),
                           "slowest": max(latencies, key=lambda k: max(latencies[k])) if latencies else None}
        faults = report["faults"] = {}

        # kill -9 inside a group commit
        cluster.drain()
        server.stop()
        server.start(failpoints="group_commit=3")
        cluster.phase = "kill -9 in a group commit"
        deadline = time.monotonic() + 60
        while "failpoint group_commit" not in server.log.read_text() and time.monotonic() < deadline:
            cluster.run_for(cluster.period_s, cluster.phase)
        server.kill9()
        cluster.run_for(args.fault_seconds, cluster.phase)
        server.start()
        cluster.run_for(args.fault_seconds, cluster.phase)
        faults["kill -9 in a group commit"] = "server killed while a commit was held open, restarted"

        if on_tmpfs:
            cluster.phase = "database disk full"
            deferred = server.metric("gpuledger_ingest_requests_deferred_total")
            filler = fill(dbfs)
            cluster.run_for(args.fault_seconds, cluster.phase)
            deferred = server.metric("gpuledger_ingest_requests_deferred_total") - deferred
            faults["database disk full"] = f"{deferred:.0f} pushes answered 503 while full"
            filler.unlink()
            cluster.run_for(args.fault_seconds, cluster.phase)
        else:
            faults["database disk full"] = "skipped: mounting a tmpfs needs root"

        cluster.phase = "clock jumps"
        skewed = next(iter(cluster.senders))
        cluster.skew[skewed] = datetime.now(timezone.utc) - cluster.now + timedelta(hours=2)  # ahead of the wall
        cluster.run_for(args.fault_seconds / 2, cluster.phase)
        cluster.skew[skewed] = -timedelta(hours=1)
        cluster.run_for(args.fault_seconds / 2, cluster.phase)
        del cluster.skew[skewed]
        faults["clock jumps"] = f"{skewed}: +2 h, then -1 h"

        cluster.phase = "older agent's batches"
        older = list(cluster.senders)[-1]
        cluster.old_format.add(older)
        cluster.run_for(args.fault_seconds, cluster.phase)
        cluster.old_format.clear()
        old_rows = sum(s.rows for s in cluster.sent if s.phase == cluster.phase and s.node == older)
        faults["older agent's batches"] = f"{old_rows} rows without the columns added since"

        cluster.phase = "after"
        cluster.run_for(2 * cluster.period_s, cluster.phase)
        cluster.close()
        report["retries"] = sum(s.retries for s in cluster.senders.values())
        if not args.no_attacks:
            report["attacks"] = attacks(server, small=args.small)
    finally:
        if server.proc and server.proc.poll() is None:
            server.stop()
    report["accounting"] = account(cluster, server.db)
    if on_tmpfs:
        subprocess.run(["umount", "-l", str(dbfs)], check=False)
    if args.keep:
        print(f"work folder kept: {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        show(report)
    return report


def server_memory(pid: int, key: str = "VmHWM") -> int:
    """The server's peak (VmHWM) or current (VmRSS) resident memory in bytes, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def reset_peak(pid: int) -> bool:
    """Reset the server's VmHWM to its current RSS (Linux: 5 > clear_refs), so each phase shows its own peak."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class HealthProbe:
    """/healthz from 127.0.0.1 every 0.1 s while a phase runs: its latencies, and the calls that failed."""

    def __init__(self, port: int) -> None:
        self.port, self.latencies, self.failed = port, [], 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                ok = requests.get(f"http://127.0.0.1:{self.port}/healthz", timeout=5).ok
            except requests.RequestException:
                ok = False
            self.latencies.append(time.perf_counter() - started)
            self.failed += not ok
            self.stop.wait(0.1)

    def __enter__(self) -> "HealthProbe":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def bomb_body(rows: int) -> bytes:
    """An LZ4 body in the sample schema of all zeros and nulls: ~250 unpacked bytes per packed byte. The columns
    share their buffers, so building it costs this process a few hundred MB at most, not what it declares."""
    import numpy as np
    import pyarrow as pa

    from gpuledger.collector.samples import SAMPLE_SCHEMA
    same: dict = {}
    for f in SAMPLE_SCHEMA:
        if f.type not in same:
            same[f.type] = (pa.nulls(rows, f.type) if pa.types.is_string(f.type) or pa.types.is_boolean(f.type)
                            else pa.array(np.zeros(rows, np.int64)).cast(f.type))
    return encode(pa.Table.from_arrays([same[f.type] for f in SAMPLE_SCHEMA], schema=SAMPLE_SCHEMA))


def raw_exchange(port: int, head: bytes, body: bytes = b"", source: str = "127.0.0.1") -> str:
    """Send a request head, then the body 1 MiB at a time until the server answers; the status line answered,
    or what stopped the exchange."""
    import socket
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as sock:
            sock.sendall(head)
            for at in range(0, len(body), 2**20):
                sock.setblocking(False)
                try:
                    answered = bool(sock.recv(1, socket.MSG_PEEK))
                except BlockingIOError:
                    answered = False
                finally:
                    sock.setblocking(True)
                if answered:
                    break
                try:
                    sock.sendall(body[at:at + 2**20])
                except OSError:
                    break
            return sock.recv(256).split(b"\r\n", 1)[0].decode(errors="replace") or "closed"
    except OSError as exc:
        return type(exc).__name__


def attacks(server: Server, small: bool) -> dict[str, dict]:
    """The attacks of issue 21 against the running server, one phase each: per phase the server's peak RSS
    before and during it, its RSS after, /healthz latency p50 and max, and what the attack got back."""
    import socket
    pid, port, out = server.proc.pid, server.port, {}
    auth = f"Authorization: Bearer {TOKEN}\r\n"

    def bomb() -> str:
        body = bomb_body(1_000_000 if small else 4_000_000)
        answer = requests.post(f"http://127.0.0.1:{port}{INGEST_PATH}", data=body, timeout=120,
                               headers=request_headers("node-bomb", "soak", 0, INTERVAL_S, token=TOKEN))
        return f"{len(body) / 2**20:.1f} MiB body: {answer.status_code} {answer.json().get('detail', '')[:80]}"

    def oversized() -> str:
        seen: dict[str, int] = defaultdict(int)
        for _ in range(2 if small else 5):
            for path in ("/v1/placement", "/v1/tokens", INGEST_PATH):
                head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {400 * 2**20}\r\n\r\n").encode()
                seen[f"{path} 400 MiB declared: {raw_exchange(port, head)}"] += 1
            head = (b"POST /v1/tokens HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n" % (2**20) + b"x" * 2**20 + b"\r\n"
            seen[f"/v1/tokens 8 MiB streamed: {raw_exchange(port, head, chunk * 8)}"] += 1
            head = (f"POST {INGEST_PATH} HTTP/1.1\r\nHost: x\r\n{auth}X-Gpuledger-Node: n\r\nX-Gpuledger-Stream: s"
                    f"\r\nX-Gpuledger-Seq: 0\r\nX-Gpuledger-Interval: 10\r\nContent-Type: {CONTENT_TYPE}\r\n"
                    f"Transfer-Encoding: chunked\r\n\r\n").encode()
            seen[f"{INGEST_PATH} 72 MiB streamed with a token: {raw_exchange(port, head, chunk * 72)}"] += 1
        return "; ".join(f"{n}x {what}" for what, n in seen.items())

    def flood() -> str:
        held: list[socket.socket] = []
        failed = 0
        try:
            for _ in range(500 if small else 2000):
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0))
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Half: ")
                    held.append(sock)
                except OSError:
                    failed += 1
            time.sleep(2.0)  # the probe keeps asking /healthz meanwhile
            still = 0
            for sock in held:
                sock.setblocking(False)
                try:
                    sock.recv(256, socket.MSG_PEEK)  # an answer (503) or the end: the server let it go
                except BlockingIOError:
                    still += 1
                except OSError:
                    pass
            return f"{len(held)} half-sent heads from 127.0.0.2 ({failed} failed to connect): {still} still open"
        finally:
            for sock in held:
                sock.close()

    def huge_query() -> str:
        started = time.perf_counter()
        answer = requests.get(f"http://127.0.0.1:{port}/v1/gpus", params={"days": 366, "bucket_minutes": 1},
                              timeout=120)
        took = time.perf_counter() - started
        bucket = answer.json().get("bucket_minutes") if answer.ok else None
        return (f"{answer.status_code}, {len(answer.content) / 2**20:.1f} MiB in {took:.1f} s, "
                f"answered at bucket_minutes={bucket}")

    for name, attack in (("decompression bomb", bomb), ("oversized bodies", oversized),
                         ("half-header flood", flood), ("huge /v1/gpus", huge_query)):
        resets = reset_peak(pid)
        before = server_memory(pid, "VmHWM")
        with HealthProbe(port) as probe:
            outcome = attack()
        out[name] = {"peak_before_mib": before / 2**20, "peak_mib": server_memory(pid, "VmHWM") / 2**20,
                     "rss_after_mib": server_memory(pid, "VmRSS") / 2**20, "peak_reset": resets,
                     "healthz_p50_ms": percentile(probe.latencies, 0.5) * 1000,
                     "healthz_max_ms": max(probe.latencies, default=float("nan")) * 1000,
                     "healthz_failed": probe.failed, "healthz_calls": len(probe.latencies), "outcome": outcome}
    return out


def show(report: dict) -> None:
    ingest, reads = report["ingest"], report["reads"]
    print(f"{report['nodes']} agents ({report['gpus']} GPUs), time x{report['speedup']:g}: "
          f"offered {report['offered_rows_per_s']:,.0f} rows/s")
    print(f"ingest alone       {ingest['rows_per_s_alone']:>10,.0f} rows/s (baseline)")
    print(f"ingest + readers   {ingest['rows_per_s_with_readers']:>10,.0f} rows/s = {ingest['ratio']:.3f} x baseline")
    print(f"reads              {reads['count']} calls, {reads['failed']} failed; p50 {reads['p50_s'] * 1000:.0f} ms, "
          f"p95 {reads['p95_s'] * 1000:.0f} ms, max {reads['max_s'] * 1000:.0f} ms ({reads['slowest']})")
    for name, what in report["faults"].items():
        print(f"fault: {name}: {what}")
    print(f"{'phase':<28}{'batches':>9}{'rows sent':>11}{'stored':>10}{'refused':>9}{'lost':>6}{'dup':>5}")
    for phase, row in report["accounting"].items():
        if phase.startswith("_"):
            continue
        print(f"{phase:<28}{row['batches']:>9}{row['rows_sent']:>11}{row['stored']:>10}{row.get('refused', 0):>9}"
              f"{row['lost']:>6}{row['duplicated']:>5}")
    print(f"senders retried {report['retries']} time(s); rows stored with the added columns null: "
          f"{report['accounting']['_old_format_rows_with_nulls']['rows']}")
    if report.get("attacks"):
        print(f"{'attack':<22}{'peak RSS before':>16}{'peak during':>13}{'RSS after':>11}{'healthz p50':>13}"
              f"{'max':>9}{'failed':>8}")
        for name, row in report["attacks"].items():
            print(f"{name:<22}{row['peak_before_mib']:>12.0f} MiB{row['peak_mib']:>9.0f} MiB"
                  f"{row['rss_after_mib']:>7.0f}"
                  f" MiB{row['healthz_p50_ms']:>10.0f} ms{row['healthz_max_ms']:>6.0f} ms{row['healthz_failed']:>8}")
            print(f"  {row['outcome']}")


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--reader"]:  # a reader process started by main()
        read_loop(int(sys.argv[2]), Path(sys.argv[3]))
    else:
        main()
