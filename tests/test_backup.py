"""Backup while serving and restore: `gpuledger backup DIR --server` during pushes gives a snapshot that agrees with
itself; once pushes stop, a restored backup holds every table exactly as the server does; a damaged backup, or a
restore over a database, is refused with the reason."""
from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import duckdb
import pyarrow.compute as pc

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import KEY_ENV, AuditFiles
from gpuledger.analytics.store.backup import Manifest, manifest_path
from gpuledger.collector.simulator import cluster_of
from gpuledger.deploy.server import ApiServer
from tests.conftest import fill_store
from tests.ingest_helpers import NOW, post
from tests.procs import GPULEDGER, TOKEN

NODES = 4


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([GPULEDGER, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))


def pusher(url: str, stop: threading.Event, sent: list[int]) -> None:
    """Each node's next 10 s batch in turn until told to stop (bounded: at most 400 batches)."""
    sim = cluster_of(NODES, now=NOW)
    for step in range(100):
        if stop.is_set():
            return
        frame = sim.frame([NOW.timestamp() - 3600 + 10 * step], 10.0)
        for i in range(NODES):
            node = f"node-{i:04d}"
            answer = post(url, frame.filter(pc.equal(frame["node"], node)), seq=step, node=node)
            assert answer.status_code == 200, answer.text
            sent.append(answer.json()["rows"])


def differing_tables(live: Store, restored: Path) -> dict[str, tuple[int, int]]:
    """Tables whose rows differ (in either direction) between the live store and a restored file."""
    cur = live._cursor()
    try:
        cur.execute(f"ATTACH '{restored}' AS restored (READ_ONLY)")
        main = cur.execute("SELECT current_database()").fetchone()[0]
        tables = [r[0] for r in cur.execute("SELECT table_name FROM information_schema.tables WHERE table_catalog = ? "
                                            "AND table_type = 'BASE TABLE'", [main]).fetchall()]
        assert len(tables) >= 15
        out = {}
        for t in tables:
            gone, extra = (cur.execute(f'SELECT count(*) FROM (SELECT * FROM "{a}"."{t}" EXCEPT ALL '
                                       f'SELECT * FROM "{b}"."{t}")').fetchone()[0]
                           for a, b in ((main, "restored"), ("restored", main)))
            if gone or extra:
                out[t] = (gone, extra)
        cur.execute("DETACH restored")
        return out
    finally:
        cur.close()


def test_backup_while_serving_and_restore_every_table(tmp_path, simulator):
    store = fill_store(Store(tmp_path / "live.duckdb"), simulator, days=1, step_s=600)
    store.fold()
    before = store.sample_count()
    server = ApiServer(store, Config(), port=0, token=TOKEN)
    url = server.start()
    stop, sent = threading.Event(), []
    thread = threading.Thread(target=pusher, args=(url, stop, sent))
    try:
        thread.start()
        while len(sent) < 20:
            thread.join(0.05)
        during = cli("backup", str(tmp_path / "during"), "--server", url, "--token", TOKEN)
        assert during.returncode == 0, during.stderr
        stop.set()
        thread.join(60)
        snap = next((tmp_path / "during").glob("gpuledger-*.duckdb"))
        with duckdb.connect(str(snap), read_only=True) as con:  # one transaction's view: runs and samples agree
            pushed = con.execute("SELECT sum(rows) FROM ingest_runs").fetchone()[0]
            assert con.execute("SELECT count(*) FROM samples").fetchone()[0] == before + pushed
        assert 0 < pushed <= sum(sent)

        denied = cli("backup", str(tmp_path / "x"), "--server", url, "--token", "wrong")
        assert denied.returncode == 2 and "401" in denied.stderr
        after = cli("backup", str(tmp_path / "after"), "--server", url, "--token", TOKEN)
        assert after.returncode == 0 and "tables" in after.stdout
        final = next((tmp_path / "after").glob("gpuledger-*.duckdb"))
        manifest = Manifest.read(manifest_path(final))
        assert manifest.tables["samples"] == store.sample_count() == before + sum(sent)

        restored = tmp_path / "restored" / "gpuledger.duckdb"
        site_key = {KEY_ENV: str(AuditFiles.of(tmp_path / "live.duckdb").key)}  # the key that signed it
        done = cli("restore", str(final), "--db", str(restored), env=site_key)
        assert done.returncode == 0, done.stderr
        # every table the same, but for the backup's own audit entry, written once the snapshot was taken, and the
        # restore's, written into the restored log
        assert differing_tables(store, restored) == {"audit_log": (1, 1)}
        assert store.scalar("SELECT action FROM audit_log ORDER BY seq DESC LIMIT 1") == "GET /v1/backup"
        again = cli("restore", str(final), "--db", str(restored), env=site_key)
        assert again.returncode == 2 and "--force" in again.stderr
        held = cli("restore", str(final), "--db", str(tmp_path / "live.duckdb"), "--force")
        assert held.returncode == 2 and "held by another process" in held.stderr
    finally:
        stop.set()
        thread.join(60)
        server.stop()
        store.close()
    log = duckdb.connect(str(tmp_path / "live.duckdb"), read_only=True)
    try:
        backups = log.execute("SELECT status, actor FROM audit_log WHERE action = 'GET /v1/backup'").fetchall()
    finally:
        log.close()
    assert sorted(backups) == [(200, "bootstrap"), (200, "bootstrap"), (401, "anonymous")]

    with open(final, "r+b") as handle:  # one flipped byte
        handle.seek(manifest.bytes // 2)
        byte = handle.read(1)
        handle.seek(manifest.bytes // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    damaged = cli("restore", str(final), "--db", str(tmp_path / "other.duckdb"), env=site_key)
    assert damaged.returncode == 2 and "SHA-256" in damaged.stderr
    assert not (tmp_path / "other.duckdb").exists()


def test_backup_of_a_file_no_server_holds(tmp_path, simulator):
    with fill_store(Store(tmp_path / "f.duckdb"), simulator, days=0.2, step_s=600) as store:
        rows = store.sample_count()
    made = cli("backup", str(tmp_path / "b"), "--db", str(tmp_path / "f.duckdb"))
    assert made.returncode == 0, made.stderr
    copy = next((tmp_path / "b").glob("gpuledger-*.duckdb"))
    checked = cli("restore", str(copy), "--check", "--db", str(tmp_path / "f.duckdb"))  # its key is beside it
    assert checked.returncode == 0 and checked.stdout.startswith("ok: ")
    assert Manifest.read(manifest_path(copy)).tables["samples"] == rows
