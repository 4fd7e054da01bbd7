"""Probes and reads that cannot starve each other (issue 40, item 5), on a real server on 127.0.0.1: twice the worker
pool's size of slow reads, from one token and from several, leave /livez, /readyz and /healthz answering and a
write going through; the reads past the bounds are refused at once with Retry-After, never queued."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import requests

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.deploy.api.read_limits import PER_CALLER, POOL_THREADS, TOTAL
from gpuledger.deploy.server import ApiServer
from tests.procs import TOKEN, wait_until


def test_slow_reads_leave_the_probes_and_writes_answering(tmp_path):
    release = threading.Event()
    started = []

    def slow() -> dict:
        """A read that holds its worker thread until the test lets it go (at most 30 s)."""
        started.append(1)
        release.wait(30)
        return {"ok": True}

    with Store(tmp_path / "r.duckdb") as store:
        server = ApiServer(store, Config(), port=0, token=TOKEN)
        server.app.add_api_route("/v1/slow", slow, methods=["GET"])
        url = server.start()
        calls = 2 * POOL_THREADS
        try:
            with ThreadPoolExecutor(max_workers=calls) as pool:
                one = [pool.submit(requests.get, f"{url}/v1/slow", headers={"Authorization": "Bearer team-a"},
                                   timeout=60) for _ in range(calls // 2)]
                many = [pool.submit(requests.get, f"{url}/v1/slow", headers={"Authorization": f"Bearer t{i % 8}"},
                                    timeout=60) for i in range(calls // 2)]
                wait_until(lambda: len(started) >= TOTAL, 30, "the reads the bounds let in to hold their threads")
                for _ in range(5):  # the pool holds every read it may: the probes and a write still answer
                    for probe in ("/livez", "/readyz", "/healthz"):
                        assert requests.get(url + probe, timeout=10).status_code == 200, probe
                made = requests.post(f"{url}/v1/tokens", json={"name": "n", "role": "reader"}, timeout=10,
                                     headers={"Authorization": f"Bearer {TOKEN}"})
                assert made.status_code == 201, made.text
                busy = requests.get(f"{url}/v1/slow", headers={"Authorization": "Bearer another"}, timeout=10)
                assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
                release.set()
                answers = [f.result() for f in one + many]
        finally:
            release.set()
            server.stop()
    codes = [a.status_code for a in answers]
    assert len(started) == TOTAL  # never more reads in flight than the bound
    team_a = [a.status_code for a in answers[:calls // 2]]
    assert team_a.count(200) <= PER_CALLER and 429 in team_a  # one caller: at most its share, the rest refused
    assert all(a.headers.get("Retry-After") == "1" for a in answers if a.status_code in (429, 503))
    assert set(codes) <= {200, 429, 503} and codes.count(200) == TOTAL


def test_a_read_past_its_time_limit_is_stopped_and_says_so(tmp_path, monkeypatch):
    """A read whose query runs past the limit is interrupted in DuckDB (its thread is free again) and answered 503
    with the reason; the next read is answered as usual, and a write outside any request has no deadline."""
    from gpuledger.deploy.api import read_limits
    from tests.helpers import api_client
    monkeypatch.setattr(read_limits, "READ_TIME_LIMIT_S", 1.0)
    with Store(tmp_path / "t.duckdb") as store:
        with api_client(store, Config(), open_reads=True) as client:
            client.app.add_api_route("/v1/forever", lambda: {"n": int(store.scalar(
                "SELECT count(*) FROM range(1000000000000) a WHERE a.range % 7 = 3"))}, methods=["GET"])
            stopped = client.get("/v1/forever")  # a trillion rows would take hours: only an interrupt ends it
            assert stopped.status_code == 503 and "past the server's 1 s limit" in stopped.json()["detail"]
            assert client.get("/livez").status_code == 200 and client.get("/v1/teams").status_code == 200
        assert store.scalar("SELECT count(*) FROM range(1000)") == 1000
