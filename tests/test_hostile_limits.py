"""Hostile clients against a real `gpuledger serve` on 127.0.0.1 (issue 21): a decompression bomb, oversized bodies
with and without a token, a flood of half-sent request heads, answers too long to send, windows outside any
calendar the store has. Each test says what the server must not spend, and measures it from /proc."""
from __future__ import annotations

import re
import resource
import socket
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pytest
import requests

from gpuledger.collector.samples import SAMPLE_SCHEMA
from gpuledger.collector.wire import INGEST_PATH, WireError, check_stream, decode, encode, request_headers
from gpuledger.deploy.api.limits import DEFAULT_BODY_BYTES, INGEST_BODY_BYTES
from tests.ingest_helpers import batch, post
from tests.procs import TOKEN, Proc, _spawn, free_port, wait_until

MIB = 1024 * 1024
HEAD_TIMEOUT_S = 3.0
PER_CLIENT = 64
STREAM = 32 * MIB  # far more than loopback socket buffers hold (a few MiB), so a sender that is not read stalls
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Served:
    """`gpuledger serve` with reads closed (every route needs a token) and a short head timeout."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "server.log"
        self.proc: Proc = _spawn(["serve", "--create", "--source", "none", "--token", TOKEN, "--port", str(self.port),
                                  "--db", str(tmp / "hostile.duckdb"), "--reports", str(tmp / "reports"),
                                  "--head-timeout", str(HEAD_TIMEOUT_S),
                                  "--max-connections-per-client", str(PER_CLIENT)], self.log)

        def healthy() -> bool:
            assert self.proc.popen.poll() is None, self.proc.text()[-3000:]
            try:
                return requests.get(self.url + "/healthz", timeout=2).ok
            except requests.RequestException:
                return False
        wait_until(healthy, 60, "server health")

    def memory(self, key: str = "VmHWM") -> int:
        """The server's peak (VmHWM) or current (VmRSS) resident memory, in bytes."""
        status = Path(f"/proc/{self.proc.popen.pid}/status").read_text()
        return int(re.search(rf"^{key}:\s+(\d+) kB", status, re.M).group(1)) * 1024

    def refused(self, reason: str) -> float:
        page = requests.get(self.url + "/metrics", headers=AUTH, timeout=10).text
        found = re.search(rf'^gpuledger_http_refused_total{{reason="{reason}"}} (\S+)$', page, re.M)
        return float(found.group(1)) if found else 0.0


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    server = Served(tmp_path_factory.mktemp("hostile"))
    try:
        assert post(server.url, batch(), seq=0).status_code == 200  # one node's 8 GPUs: /v1/gpus has series
        yield server
    finally:
        server.proc.stop()


def bomb(rows: int) -> bytes:
    """A body in the sample schema whose columns are all zeros or nulls: LZ4 packs ~1 GiB into a few MiB. The
    columns share their buffers, so building it costs this process ~150 MB, not the 1 GiB it declares."""
    zeros = {}
    columns = []
    for f in SAMPLE_SCHEMA:
        if f.type not in zeros:
            if pa.types.is_string(f.type) or pa.types.is_boolean(f.type):
                zeros[f.type] = pa.nulls(rows, f.type)
            else:
                zeros[f.type] = pa.array(np.zeros(rows, np.int64)).cast(f.type)
        columns.append(zeros[f.type])
    return encode(pa.Table.from_arrays(columns, schema=SAMPLE_SCHEMA))


def test_decode_reads_the_unpacked_size_from_the_headers_before_decompressing():
    real = encode(batch())
    assert decode(real).num_rows == 8 and 0 < check_stream(real, 1 << 30) < 16 * len(real)
    body = bomb(400_000)
    declared = check_stream(body, 1 << 40)
    assert declared > 40 * len(body)  # a bomb
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(WireError, match=rf"unpacked size {declared} exceeds"):
        decode(body)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 16 * 1024  # KiB: nothing was unpacked
    # a compressed buffer whose length prefix lies: the first buffer of the body (the 8 timestamps: 64 bytes
    # unpacked) claims 1 TiB; refused from the headers, never allocated
    message = next(iter(pa.ipc.MessageReader.open_stream(pa.py_buffer(real))))  # the schema
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(real))
    reader.read_next_message()
    body = reader.read_next_message().body
    at = len(real) - 8 - body.size  # the batch's body ends where the 8-byte end-of-stream marker starts
    assert message.type == "schema" and real[at:at + 8] == (64).to_bytes(8, "little")
    lying = real[:at] + (1 << 40).to_bytes(8, "little") + real[at + 8:]
    with pytest.raises(WireError, match=f"unpacked size {(1 << 40) + check_stream(real, 1 << 40) - 64} exceeds"):
        decode(lying)
    real_table = batch()
    nested = real_table.set_column(real_table.schema.get_field_index("temp_c"), "temp_c",
                                   pa.array([[1.0]] * real_table.num_rows))
    with pytest.raises(WireError, match="column 'temp_c' has type list"):
        decode(encode(nested))
    with pytest.raises(WireError, match="missing column"):
        decode(encode(batch().drop_columns(["gpu_uuid"])))


def test_a_decompression_bomb_is_refused_without_the_memory_it_asks_for(served):
    body = bomb(4_000_000)
    assert check_stream(body, 1 << 40) > 900 * MIB and len(body) < 8 * MIB  # ~1 GiB from a few MiB
    before = served.memory()
    answer = post(served.url, body, seq=1)
    assert answer.status_code == 422 and "unpacked size" in answer.json()["detail"], answer.text
    assert served.memory() - before < 64 * MIB
    assert served.refused("unpacked_too_large") == 1
    assert post(served.url, batch(), seq=1).status_code == 200  # and the node's next batch is stored


def _exchange(head: bytes, body_chunks: Iterator[bytes] = iter(()), source: str = "127.0.0.1",
              port: int = 0) -> tuple[int | None, int]:
    """Send `head` then chunks until the server answers or closes; (status or None when it closed without one,
    body bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    sent = 0
    try:
        sock.sendall(head)
        for chunk in body_chunks:
            sock.setblocking(False)
            try:
                early = sock.recv(65536, socket.MSG_PEEK)
            except BlockingIOError:
                early = None
            except ConnectionResetError:
                return None, sent
            finally:
                sock.setblocking(True)
            if early is not None:
                break
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        try:
            answer = sock.recv(65536)
        except ConnectionResetError:
            return None, sent
        found = re.match(rb"HTTP/1\.1 (\d{3})", answer)
        return (int(found.group(1)) if found else None), sent
    finally:
        sock.close()


def _chunks(total: int, size: int = 256 * 1024) -> Iterator[bytes]:
    piece = b"x" * size
    for _ in range(total // size):
        yield f"{size:x}\r\n".encode() + piece + b"\r\n"


# (method, path, limit, the answer to a streamed body over the limit): a route that reads no body (DELETE) answers
# without reading it, and closes the connection so the rest is not read either
ROUTES = [("POST", INGEST_PATH, INGEST_BODY_BYTES, 413), ("POST", "/v1/placement", DEFAULT_BODY_BYTES, 413),
          ("POST", "/v1/tokens", DEFAULT_BODY_BYTES, 413),
          ("POST", "/v1/recommendations/r1/decision", DEFAULT_BODY_BYTES, 413),
          ("DELETE", "/v1/tokens/t1", DEFAULT_BODY_BYTES, 404)]


@pytest.mark.parametrize("method,path,limit,streamed", ROUTES, ids=[f"{m} {p}" for m, p, _, _ in ROUTES])
def test_oversized_bodies_are_refused_before_they_are_read(served, method, path, limit, streamed):
    headers = "".join(f"{k}: {v}\r\n" for k, v in request_headers("node-0000", "s1", 9, 10.0).items()
                      if k != "Content-Type")
    content_type = "application/vnd.apache.arrow.stream" if path == INGEST_PATH else "application/json"
    start = f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Type: {content_type}\r\n"
    before = served.memory()
    refused = served.refused("body_too_large")
    for auth in (f"Authorization: Bearer {TOKEN}\r\n", ""):
        # a declared length over the limit: answered before a byte of the body is sent
        status, _ = _exchange(f"{start}{auth}Content-Length: {400 * MIB}\r\n\r\n".encode(), port=served.port)
        assert status == 413, (auth, status)
    # a streamed body: counted as it arrives, refused once past the limit
    # (STREAM past the limit: more than the kernel's socket buffers on both sides can take without the server reading)
    status, sent = _exchange(f"{start}Authorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n".encode(),
                             _chunks(limit + STREAM), port=served.port)
    # the answer came before the client could send all of it (what it did send went to socket buffers)
    assert status == streamed and sent < limit + STREAM, (status, sent)
    assert sent >= limit or streamed != 413, sent  # and a 413 only once the limit was passed
    assert served.refused("body_too_large") == refused + (3 if streamed == 413 else 2)
    # without a token, a body is not read at all: 401 before the first chunk is taken
    status, sent = _exchange(f"{start}Transfer-Encoding: chunked\r\n\r\n".encode(), _chunks(STREAM),
                             port=served.port)
    assert status == 401 and sent < STREAM, (status, sent)
    # what the server held: the route's limit at most (an ingest body is read whole to be decoded), never 400 MiB
    assert served.memory() - before < 2 * limit + 32 * MIB


def test_a_flood_of_half_sent_heads_leaves_health_answering(served):
    refused, expired = served.refused("client_connections"), served.refused("head_timeout")
    attackers: list[socket.socket] = []
    try:
        for _ in range(2000):  # from another loopback address: the per-client cap is the attacker's, not ours
            sock = socket.create_connection(("127.0.0.1", served.port), timeout=5, source_address=("127.0.0.2", 0))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Half: ")
            attackers.append(sock)
        started = time.monotonic()
        assert requests.get(served.url + "/healthz", timeout=1).ok
        assert time.monotonic() - started < 1.0  # the bound: /healthz within 1 s under the flood

        def open_ones() -> list[socket.socket]:
            still = []
            for sock in attackers:
                sock.setblocking(False)
                try:
                    while data := sock.recv(65536):
                        pass
                    if data == b"":
                        continue
                except BlockingIOError:
                    still.append(sock)
                except ConnectionResetError:
                    pass
            return still
        wait_until(lambda: len(open_ones()) <= PER_CLIENT, 20, "the connections over the cap to be closed")
        assert len(open_ones()) == PER_CLIENT  # the cap's worth stay until their head timeout
        wait_until(lambda: not open_ones(), HEAD_TIMEOUT_S + 20, "half-sent heads to time out")
    finally:
        for sock in attackers:
            sock.close()
    assert served.refused("client_connections") - refused == 2000 - PER_CLIENT
    assert served.refused("head_timeout") - expired == PER_CLIENT
    log = served.log.read_text()
    assert log.count("connection refused, 64 already open from 127.0.0.2") == 1  # once a minute, not 1,936 lines
    assert requests.get(served.url + "/healthz", timeout=5).ok


def test_long_answers_are_bounded(served):
    gpus = requests.get(served.url + "/v1/gpus", params={"days": 366, "bucket_minutes": 1}, headers=AUTH, timeout=60)
    assert gpus.status_code == 200
    answer = gpus.json()
    assert answer["bucket_minutes"] == 30  # 8 GPUs x 366 days: 30 minutes is the finest within 200,000 points
    assert len(answer["holders"]) == 8 and len(gpus.content) < 1 * MIB
    usual = requests.get(served.url + "/v1/gpus", params={"days": 7, "bucket_minutes": 60}, headers=AUTH,
                         timeout=60).json()
    assert usual["bucket_minutes"] == 60
    for path in ("/v1/cluster/utilization", "/v1/teams/nobody/usage"):
        refused = requests.get(served.url + path, params={"days": 366, "bucket_minutes": 1}, headers=AUTH,
                               timeout=60)
        assert refused.status_code == 422 and "bucket_minutes=30 or more" in refused.json()["detail"], refused.text


def test_windows_outside_the_calendar_are_a_422_not_a_500(served):
    spec = requests.get(served.url + "/openapi.json", timeout=10).json()
    windowed = [path for path, ops in spec["paths"].items() if "get" in ops
                and any(p["name"] == "end" for p in ops["get"].get("parameters", []))]
    assert {"/v1/costs", "/v1/gpus", "/v1/cluster/utilization", "/v1/fragmentation"} <= set(windowed)
    with_days = {path for path in windowed
                 if any(p["name"] == "days" for p in spec["paths"][path]["get"]["parameters"])}
    assert len(with_days) >= 8
    for path in windowed:
        days = path in with_days
        path = path.replace("{team}", "nobody")
        for end in ("0001-01-01", "9999-12-31T23:59:59"):
            answer = requests.get(served.url + path, params={"end": end}, headers=AUTH, timeout=60)
            assert answer.status_code in (404, 422), (path, end, answer.status_code, answer.text[:300])
        if days:  # a window that starts before 2000
            answer = requests.get(served.url + path, params={"end": "2000-01-03", "days": 3}, headers=AUTH,
                                  timeout=60)
            assert answer.status_code in (404, 422), (path, answer.status_code, answer.text[:300])
