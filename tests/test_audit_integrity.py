"""An audit log that can be trusted and backups that cannot be forged (issue 21): a write and its entry commit
together (API and CLI), the chain is keyed outside the database and anchored at its end (a rewrite, a truncation
or an emptying shows), refused reads are logged without flooding the log, X-Forwarded-For is believed only from
trusted proxies, and a backup restores only as it was signed, at a schema this gpuledger can open, never
overwriting the database it replaces."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import duckdb
import pandas as pd
import pytest
import requests
from fastapi.testclient import TestClient

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import (
    GENESIS,
    KEY_ENV,
    KEYED_FROM,
    AuditEntry,
    AuditFiles,
    AuditKeyError,
    AuditLog,
    Role,
    _chained,
    check_audit,
    create_token,
    key_id,
)
from gpuledger.analytics.store.backup import BackupError, Manifest, manifest_path, restore, snapshot
from gpuledger.analytics.store.schema import SCHEMA_VERSION
from gpuledger.deploy.api import create_app
from gpuledger.deploy.server import ApiServer
from gpuledger.policies.recommendation import Recommendation
from tests.ingest_helpers import batch, post
from tests.procs import GPULEDGER, TOKEN, Server

BOOT = "bootstrap-admin-t0ken"
DECISION = "POST /v1/recommendations/{rec_id}/decision"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([GPULEDGER, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))


def proposed(store: Store, team: str = "nlp") -> str:
    """A stored, proposed recommendation's id."""
    rec = Recommendation(kind="quota", team=team, gpu_model="A100", action={"guarantee_gpus": 4.0, "limit_gpus": 8.0},
                         evidence={"busy_gpus": 3.9}, reason="demand above guarantee", status="proposed",
                         created=pd.Timestamp.now(tz="UTC").to_pydatetime())
    store.add_recommendations(pd.DataFrame([rec.to_row()]))
    return rec.id


def entries(store: Store, action: str | None = None) -> list[dict[str, Any]]:
    frame = store.query("SELECT seq, actor, role, action, target, status, remote, CAST(detail AS VARCHAR) AS detail "
                        "FROM audit_log WHERE $action IS NULL OR action = $action ORDER BY seq", {"action": action})
    rows = frame.to_dict("records")
    for row in rows:
        row["detail"] = json.loads(row["detail"]) if isinstance(row["detail"], str) else None
    return rows


@pytest.fixture
def api(tmp_path) -> Iterator[tuple[Store, TestClient]]:
    """A store with one proposed recommendation and the API over it (TestClient: the handlers are the point)."""
    store = Store(tmp_path / "a.duckdb")
    app = create_app(store, Config(), token=BOOT)
    try:
        yield store, TestClient(app, raise_server_exceptions=False)
    finally:
        app.state.audit.close()
        store.close()


# --- 1. a write and its entry in one transaction -----------------------------------------------------------------

def test_a_decision_whose_answer_fails_after_the_commit_still_has_its_entry(api, monkeypatch):
    store, client = api
    rec_id = proposed(store)

    def broken(self: Recommendation) -> dict:
        raise RuntimeError("answering failed after the commit")
    monkeypatch.setattr(Recommendation, "to_dict", broken)
    answer = client.post(f"/v1/recommendations/{rec_id}/decision", headers=bearer(BOOT),
                         json={"decision": "reject", "by": "carol"})
    assert answer.status_code == 500
    assert store.scalar("SELECT status FROM recommendations WHERE id = ?", [rec_id]) == "rejected"
    app = client.app
    app.state.audit.flush()
    logged = entries(store, DECISION)
    assert len(logged) == 1, logged  # committed with the decision, and not logged again by the middleware
    assert logged[0]["detail"]["recommendation"] == rec_id and logged[0]["detail"]["decision"] == "reject"
    assert logged[0]["actor"] == "bootstrap" and logged[0]["role"] == "admin"
    assert check_audit(store).intact


def test_a_decision_whose_entry_cannot_be_written_is_not_stored(api, monkeypatch):
    store, client = api
    rec_id = proposed(store)

    def full_disk(self: AuditLog, cur: Any, rows: Any) -> tuple[int, str]:
        raise duckdb.IOException("No space left on device")
    monkeypatch.setattr(AuditLog, "_insert", full_disk)
    answer = client.post(f"/v1/recommendations/{rec_id}/decision", headers=bearer(BOOT),
                         json={"decision": "accept", "by": "carol"})
    assert answer.status_code == 500
    assert store.scalar("SELECT status FROM recommendations WHERE id = ?", [rec_id]) == "proposed"
    monkeypatch.undo()
    client.app.state.audit.flush()  # the failure's own entry, queued meanwhile, goes in now
    assert [e["status"] for e in entries(store, DECISION)] == [500]


def test_token_writes_through_the_api_commit_with_their_entry_and_refusals_are_logged(api):
    store, client = api
    made = client.post("/v1/tokens", headers=bearer(BOOT), json={"name": "ops", "role": "reader"})
    assert made.status_code == 201
    gone = client.delete(f"/v1/tokens/{made.json()['id']}", headers=bearer(BOOT))
    assert gone.status_code == 200
    assert client.delete("/v1/tokens/000000000000", headers=bearer(BOOT)).status_code == 404
    assert client.post("/v1/tokens", headers=bearer(made.json()["token"]), json={"name": "x", "role": "admin"}
                       ).status_code == 401  # revoked
    client.app.state.audit.flush()
    got = [(e["action"], e["status"]) for e in entries(store)]
    assert got == [("POST /v1/tokens", 201), ("DELETE /v1/tokens/{token_id}", 200),
                   ("DELETE /v1/tokens/{token_id}", 404), ("POST /v1/tokens", 401)]
    assert entries(store)[0]["detail"]["token"] == made.json()["id"]


# --- 2. CLI writes on the file are audited -----------------------------------------------------------------------

def test_cli_writes_on_the_file_are_audited_as_the_os_user(tmp_path):
    db = tmp_path / "c.duckdb"
    with Store(db) as store:
        rec_id = proposed(store)
    made = cli("token", "create", "--role", "admin", "--name", "alice", "--db", str(db))
    assert made.returncode == 0, made.stderr
    token_id = made.stdout.strip().split("_")[1]
    assert cli("token", "revoke", token_id, "--db", str(db)).returncode == 0
    assert cli("token", "revoke", "ffffffffffff", "--db", str(db)).returncode == 2
    assert cli("decide", rec_id, "accept", "--by", "carol", "--db", str(db)).returncode == 0
    assert cli("decide", rec_id, "accept", "--by", "carol", "--db", str(db)).returncode == 2  # already accepted
    backed = cli("backup", str(tmp_path / "b"), "--db", str(db))
    assert backed.returncode == 0, backed.stderr
    with Store(db) as store:
        logged = entries(store)
        assert check_audit(store).intact
    assert [(e["action"], e["status"]) for e in logged] == [
        ("token create", 200), ("token revoke", 200), ("token revoke", 404), ("decide", 200), ("decide", 409),
        ("backup", 200)]
    user = logged[0]["actor"]
    assert user.startswith("cli:") and len(user) > 4
    assert {(e["actor"], e["role"], e["remote"]) for e in logged} == {(user, "admin", "local")}
    assert logged[0]["detail"]["token"] == token_id and logged[3]["detail"]["recommendation"] == rec_id

    copy = next((tmp_path / "b").glob("gpuledger-*.duckdb"))
    restored = tmp_path / "r.duckdb"
    done = cli("restore", str(copy), "--db", str(restored), env={KEY_ENV: str(AuditFiles.of(db).key)})
    assert done.returncode == 0, done.stderr
    with Store(restored) as store:
        last = entries(store)[-1]
        assert (last["action"], last["actor"], last["remote"]) == ("restore", user, "local")
        assert last["detail"]["backup"] == copy.name
        assert check_audit(store, AuditFiles(AuditFiles.of(db).key, AuditFiles.of(restored).head)).intact


# --- 3. kill -9 right after writes: nothing stored without its entry ----------------------------------------------

def test_kill_9_right_after_a_push_keeps_the_pushs_entry_with_its_batches(tmp_path):
    """Before: push entries waited up to a second for their flush, so a kill -9 right after a stored push left
    its batches without an entry. Now the entry commits in the writer's transaction with the batches."""
    server = Server(tmp_path).start()
    try:
        made = requests.post(server.url + "/v1/tokens", headers=bearer(TOKEN), json={"name": "n", "role": "reader"},
                             timeout=30)
        assert made.status_code == 201
        assert post(server.url, batch(), seq=0).status_code == 200
        assert post(server.url, batch(), seq=0).json()["status"] == "duplicate"  # a resent batch: an entry too
    finally:
        server.proc.kill9()  # at once: no flush can have run since the answers
    files = AuditFiles.of(server.db)
    with Store(server.db) as store:
        assert store.sample_count() > 0
        pushes = entries(store, "POST /v1/ingest")
        assert [e["status"] for e in pushes] == [200, 200], pushes
        assert pushes[0]["detail"]["node"] == "node-0000" and pushes[0]["detail"]["seq"] == 0
        made_entries = entries(store, "POST /v1/tokens")
        assert [e["status"] for e in made_entries] == [201]
        head = json.loads(files.head.read_text())
        assert head["seq"] >= max(e["seq"] for e in pushes + made_entries)  # anchored before the answers
        check = check_audit(store)
        assert check.intact, check.reason
    server.start()  # and the server opens the log again without an incident
    try:
        log = requests.get(server.url + "/v1/audit", headers=bearer(TOKEN), timeout=30).json()
        assert log["intact"] and log["reason"] is None
    finally:
        server.proc.stop()


# --- 4. a keyed chain, anchored outside the database ---------------------------------------------------------------

def written(tmp_path: Path, n: int = 6) -> Store:
    store = Store(tmp_path / "k.duckdb")
    log = AuditLog(store, flush_every_s=None)
    for i in range(n):
        log.append(AuditEntry(actor=f"a{i}", role="admin", action="POST /v1/tokens", target="/v1/tokens",
                              status=201, remote="127.0.0.1", detail={"i": i}))
    log.close()
    return store


def rehash(store: Store, key: bytes | None = None) -> None:
    """What someone with write access to the file but not the key does after editing: recompute every row's
    hash (plain SHA-256, or HMAC with a key of their own)."""
    import hmac
    rows = store.query("SELECT seq, ts, actor, role, action, target, status, remote, CAST(detail AS VARCHAR) AS detail "
                       "FROM audit_log ORDER BY seq")
    prev = GENESIS
    with store.transaction() as cur:
        for r in rows.itertuples(index=False):
            text = _chained(prev, int(r.seq), r.ts, r.actor, r.role, r.action, r.target, int(r.status),
                            None if pd.isna(r.remote) else r.remote, None if pd.isna(r.detail) else r.detail).encode()
            digest = hmac.new(key, text, hashlib.sha256).hexdigest() if key else hashlib.sha256(text).hexdigest()
            cur.execute("UPDATE audit_log SET prev_sha256 = ?, sha256 = ? WHERE seq = ?", [prev, digest, int(r.seq)])
            prev = digest


@pytest.mark.parametrize("key", [None, b"k" * 32], ids=["sha256", "another-key"])
def test_a_rewritten_and_rehashed_log_shows(tmp_path, key):
    store = written(tmp_path)
    assert check_audit(store).intact and check_audit(store).keyed_from == 1
    with store.transaction() as cur:
        cur.execute("UPDATE audit_log SET actor = 'nobody' WHERE seq = 2")
    rehash(store, key)
    check = check_audit(store)
    assert not check.intact and check.first_broken == 1 and "MAC" in check.reason
    store.close()


def test_a_truncated_or_emptied_log_shows_and_stays_shown(tmp_path):
    store = written(tmp_path)
    with store.transaction() as cur:
        cur.execute("DELETE FROM audit_log WHERE seq >= 5")
    check = check_audit(store)
    assert not check.intact and check.first_broken == 5 and "truncated" in check.reason
    log = AuditLog(store, flush_every_s=None)  # the server starts again and writes on
    log.append(AuditEntry("a", "admin", "POST /v1/tokens", "/v1/tokens", 201))
    check = check_audit(store)
    assert not check.intact and "log ends at 4" in check.reason  # the incident is kept in the anchored head
    with store.transaction() as cur:
        cur.execute("DELETE FROM audit_log")
    emptied = check_audit(store)
    assert not emptied.intact and emptied.first_broken == 1 and "log ends at 0" in emptied.reason
    store.close()


def test_a_forged_head_a_missing_head_or_key_shows(tmp_path):
    store = written(tmp_path)
    files = AuditFiles.of(store.path)
    head = json.loads(files.head.read_text())
    files.head.write_text(json.dumps({**head, "seq": 2}))  # rolled back by hand: its check no longer matches
    assert "not written with this audit key" in check_audit(store).reason
    files.head.unlink()
    assert "head anchor" in check_audit(store).reason and "missing" in check_audit(store).reason
    files.key.unlink()
    assert "audit key" in check_audit(store).reason
    with pytest.raises(AuditKeyError, match="missing"):
        AuditLog(store, flush_every_s=None)  # a keyed store is not silently re-keyed
    store.close()


def test_an_old_sha256_chain_is_sealed_by_the_first_keyed_entry(tmp_path):
    store = Store(tmp_path / "old.duckdb")
    prev = GENESIS
    with store.transaction() as cur:  # three entries as gpuledger wrote them before keying
        for seq in (1, 2, 3):
            ts = pd.Timestamp("2026-12-01", tz="UTC") + pd.Timedelta(minutes=seq)
            digest = hashlib.sha256(_chained(prev, seq, ts, "cli", "admin", "POST /v1/tokens", "/v1/tokens", 201,
                                             None, None).encode()).hexdigest()
            cur.execute("INSERT INTO audit_log VALUES (?, ?, 'cli', 'admin', 'POST /v1/tokens', '/v1/tokens', 201, "
                        "NULL, NULL, ?, ?)", [seq, ts, prev, digest])
            prev = digest
    assert check_audit(store).intact and check_audit(store).keyed_from is None  # not keyed yet
    log = AuditLog(store, flush_every_s=None)
    log.append(AuditEntry("x", "admin", "POST /v1/tokens", "/v1/tokens", 201))
    assert store.meta(KEYED_FROM) == "4"
    check = check_audit(store)
    assert check.intact and check.keyed_from == 4
    with store.transaction() as cur:
        cur.execute("UPDATE audit_log SET actor = 'other' WHERE seq = 2")
    rehash(store)  # an old row edited and everything rehashed: the first keyed entry no longer matches
    assert check_audit(store).first_broken == 4
    store.close()


def test_the_audit_command_and_the_api_say_why(tmp_path):
    store = written(tmp_path)
    app = create_app(store, Config(), token=BOOT)
    client = TestClient(app)
    try:
        with store.transaction() as cur:
            cur.execute("DELETE FROM audit_log WHERE seq > 3")
        log = client.get("/v1/audit", headers=bearer(BOOT)).json()
        assert not log["intact"] and "truncated" in log["reason"] and log["keyed_from"] == 1
    finally:
        app.state.audit.close()
        store.close()
    shown = cli("audit", "--db", str(tmp_path / "k.duckdb"))
    assert shown.returncode == 1 and "chain BROKEN" in shown.stdout and "truncated" in shown.stdout


# --- 5. refused reads --------------------------------------------------------------------------------------------

def test_refused_reads_of_team_data_are_logged_coalesced_per_minute(api):
    store, client = api
    store.upsert_teams(pd.DataFrame({"team": ["nlp", "vision"], "share": [1.0, 1.0], "quota_gpus": [1, 1]}))
    _, team_token = create_token(store, "lead", Role("team", "nlp"), "test")
    client.app.state.refused_reads.window_s = 3.0  # longer than the 42 requests take on a loaded 2-core machine
    for _ in range(40):
        assert client.get("/v1/teams/vision/usage", headers=bearer(team_token)).status_code == 403
    assert client.get("/v1/jobs", headers=bearer(team_token), params={"team": "vision"}).status_code == 403
    assert client.get("/v1/costs", headers=bearer("glt_000000000000_" + "x" * 43)).status_code == 401
    client.app.state.audit.flush()
    first = [e for e in entries(store) if e["actor"].startswith("lead (")]
    assert len(first) == 1 and first[0]["status"] == 403 and first[0]["target"] == "/v1/teams/vision/usage"
    assert [e["status"] for e in entries(store) if e["actor"] == "anonymous"] == [401]
    time.sleep(3.1)
    client.app.state.audit.flush()
    lead = [e for e in entries(store) if e["actor"].startswith("lead (")]
    assert len(lead) == 2  # 41 refusals, two entries
    assert lead[1]["detail"]["count"] == 40 and set(lead[1]["detail"]["paths"]) == {"/v1/teams/vision/usage",
                                                                                   "/v1/jobs"}
    assert client.get("/v1/costs", headers=bearer(team_token)).status_code == 200
    client.app.state.audit.flush()
    assert len([e for e in entries(store) if e["actor"].startswith("lead (")]) == 2  # allowed reads are not logged


# --- 6. X-Forwarded-For only from trusted proxies -----------------------------------------------------------------

@pytest.mark.parametrize("trusted, expected", [(None, "127.0.0.1"), (["127.0.0.0/8"], "203.0.113.9 via 127.0.0.1")])
def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy(tmp_path, trusted, expected):
    with Store(tmp_path / "x.duckdb") as store:
        server = ApiServer(store, Config(), port=0, token=BOOT, trusted_proxies=trusted)
        url = server.start()
        try:
            made = requests.post(f"{url}/v1/tokens", json={"name": "n", "role": "reader"}, timeout=30,
                                 headers={**bearer(BOOT), "X-Forwarded-For": "198.51.100.1, 203.0.113.9"})
            assert made.status_code == 201
        finally:
            server.stop()
        assert [e["remote"] for e in entries(store)] == [expected]


def test_trusted_proxies_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULEDGER_TRUSTED_PROXIES", "10.0.0.0/8, 127.0.0.1")
    with Store(tmp_path / "e.duckdb") as store:
        app = create_app(store, Config(), token=BOOT)
        try:
            assert [str(n) for n in app.state.trusted_proxies] == ["10.0.0.0/8", "127.0.0.1/32"]
        finally:
            app.state.audit.close()
    monkeypatch.setenv("GPULEDGER_TRUSTED_PROXIES", "not-an-address")
    with Store(tmp_path / "f.duckdb") as store, pytest.raises(Exception, match="trusted proxy"):
        create_app(store, Config(), token=BOOT)


# --- 7. backups that cannot be forged ----------------------------------------------------------------------------

@pytest.fixture
def site(tmp_path) -> Iterator[tuple[Store, AuditFiles]]:
    store = Store(tmp_path / "live.duckdb")
    log = AuditLog(store, flush_every_s=None)
    create_token(store, "alice", Role("admin"), "test")
    log.append(AuditEntry("alice", "admin", "POST /v1/tokens", "/v1/tokens", 201))
    yield store, log.files
    store.close()


def plant_admin_token(backup: Path) -> None:
    """Add an admin token to a backup and rewrite its manifest's hash, size and counts to match (the signature
    left as it was: the forger has no key)."""
    with duckdb.connect(str(backup)) as con:
        con.execute("INSERT INTO api_tokens (id, name, role, secret_sha256, created, created_by) "
                    "VALUES ('badbadbadbad', 'mallory', 'admin', ?, now(), 'x')",
                    [hashlib.sha256(b"s").hexdigest()])
    manifest = Manifest.read(manifest_path(backup))
    tables = {**manifest.tables, "api_tokens": manifest.tables["api_tokens"] + 1}
    forged = Manifest(manifest.taken_at, manifest.schema_version, tables,
                      hashlib.sha256(backup.read_bytes()).hexdigest(), backup.stat().st_size, manifest.key_id,
                      manifest.signature)
    forged.write(manifest_path(backup))


def test_a_backup_with_a_rewritten_manifest_does_not_restore(tmp_path, site):
    store, files = site
    copy = tmp_path / "b" / "one.duckdb"
    snapshot(store, copy, files)
    plant_admin_token(copy)
    target = tmp_path / "restored.duckdb"
    with pytest.raises(BackupError, match="signature"):
        restore(copy, target, files=AuditFiles(files.key, target.with_name("restored.duckdb.audit-head")))
    assert not target.exists()
    unsigned = Manifest.read(manifest_path(copy))
    Manifest(**{**unsigned.__dict__, "signature": None}).write(manifest_path(copy))
    with pytest.raises(BackupError, match="not signed"):
        restore(copy, target, files=AuditFiles(files.key, tmp_path / "h"))
    other = tmp_path / "other.key"
    other.write_text("ab" * 32)
    clean = tmp_path / "b" / "two.duckdb"
    snapshot(store, clean, files)
    with pytest.raises(BackupError, match="signed with audit key"):
        restore(clean, target, files=AuditFiles(other, tmp_path / "h"))
    with pytest.raises(BackupError, match="no audit key"):
        restore(clean, target)  # another machine, no key copied there
    assert not target.exists()


@pytest.mark.parametrize("claim", ["1", "99"])
def test_a_manifest_claiming_another_schema_does_not_restore(tmp_path, site, claim):
    store, files = site
    copy = tmp_path / "b" / "one.duckdb"
    manifest = snapshot(store, copy, files)
    Manifest(**{**manifest.__dict__, "schema_version": claim}).write(manifest_path(copy))
    with pytest.raises(BackupError, match="signature"):
        restore(copy, tmp_path / "r.duckdb", files=AuditFiles(files.key, tmp_path / "r.duckdb.audit-head"))


def test_a_newer_schema_is_refused_and_an_older_one_upgraded(tmp_path, site):
    store, files = site
    store.set_meta("schema_version", "99")  # a store a newer gpuledger wrote
    newer = tmp_path / "b" / "newer.duckdb"
    assert snapshot(store, newer, files).schema_version == "99"
    target = tmp_path / "r.duckdb"
    own = AuditFiles(files.key, tmp_path / "r.duckdb.audit-head")
    with pytest.raises(BackupError, match="newer than this gpuledger"):
        restore(newer, target, files=own)
    store.set_meta("schema_version", "7")
    with store.transaction() as cur:  # schema 7 had no hottest temperature in the minute rollups
        cur.execute("ALTER TABLE usage_minute DROP COLUMN temp_max")
    older = tmp_path / "b" / "older.duckdb"
    snapshot(store, older, files)
    done = restore(older, target, files=own)
    assert done.upgraded_from == "7" and done.kept is None
    with Store(target) as restored:
        assert restored.meta("schema_version") == SCHEMA_VERSION
        assert "temp_max" in restored.query("DESCRIBE usage_minute")["column_name"].tolist()  # migrated
        assert check_audit(restored, own).intact


def test_restore_force_twice_keeps_both_originals(tmp_path, site):
    store, files = site
    copy = tmp_path / "b" / "one.duckdb"
    snapshot(store, copy, files)
    db = tmp_path / "db.duckdb"
    with Store(db) as first:
        first.set_meta("which", "first")
    env = {KEY_ENV: str(files.key)}
    assert cli("restore", str(copy), "--db", str(db), env=env).returncode == 2  # not without --force
    kept = []
    for _ in range(2):
        done = cli("restore", str(copy), "--db", str(db), "--force", env=env)
        assert done.returncode == 0, done.stderr
        kept.append(Path(done.stdout.split("kept as ")[1].strip()))
    assert kept[0] != kept[1] and all(k.exists() for k in kept)
    assert Store.peek_meta(kept[0], "which") == "first"  # the original survives a second restore
    assert Store.peek_meta(kept[1], "which") is None  # the first restore's result, kept in turn
    with Store(db) as restored:
        assert [e["action"] for e in entries(restored)][-1] == "restore"
        assert check_audit(restored, AuditFiles(files.key, AuditFiles.of(db).head)).intact


def test_a_downgrade_to_a_plain_sha256_chain_shows(tmp_path):
    """Issue 40: delete the head file and the keying meta row, rehash every entry with plain SHA-256: the key file
    still says from which entry the log is keyed, so the rehashed entries fail their MAC and the check says so."""
    store = written(tmp_path)
    files = AuditFiles.of(store.path)
    assert files.keyed_from() == 1 and check_audit(store).intact
    files.head.unlink()
    with store.transaction() as cur:
        cur.execute("DELETE FROM meta WHERE key = ?", [KEYED_FROM])
    rehash(store)
    check = check_audit(store)
    assert not check.intact and "head anchor" in check.reason
    files.head.write_text("")  # an empty head file put back: damaged, not a fresh start
    assert not check_audit(store).intact
    files.head.unlink()
    log = AuditLog(store, flush_every_s=None)  # the server opens the log again: it reports the missing head
    log.close()
    again = check_audit(store)
    assert not again.intact
    store.close()


def test_the_first_keyed_entry_carries_the_keys_marker(tmp_path):
    """The chain itself says where keying began: the first keyed entry names the key's id in its detail, under its
    MAC; a log whose entry there lacks it (rewritten with the key file's keying line left as it was) shows."""
    store = written(tmp_path)
    files = AuditFiles.of(store.path)
    first = store.query("SELECT CAST(detail AS VARCHAR) AS d FROM audit_log WHERE seq = 1")["d"].iloc[0]
    assert json.loads(first)["audit_keyed"] == key_id(files.read_key()) and files.keying()["marked"]
    assert check_audit(store).intact
    with store.transaction() as cur:  # the marker taken out, and every MAC redone (with the key, even)
        cur.execute("UPDATE audit_log SET detail = json_object('i', 0) WHERE seq = 1")
    rehash(store, files.read_key())
    check = check_audit(store)
    assert not check.intact and check.first_broken == 1 and "lacks its marker" in check.reason
    store.close()
