"""Who may read and write what, over real HTTP: roles (admin, reader, team, agent), tokens hashed at rest and
revoked, closed reads by default, the audit log and its hash chain, the CLI's token commands."""
from __future__ import annotations

import io
import re
import zipfile
from datetime import datetime
import json
import subprocess
from typing import Any, Iterator

import pytest
import requests

from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import verify_audit
from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED
from gpuledger.collector.wire import INGEST_PATH
from gpuledger.deploy.api.access import OTHER_TEAM
from gpuledger.deploy.server import ApiServer
from tests.conftest import SIM_END, SITE, fill_store
from tests.ingest_helpers import batch, post
from tests.procs import GPULEDGER

BOOT = "bootstrap-admin-t0ken"
END = SIM_END.isoformat()
TEAM = "nlp"


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def call(method: str, url: str, token: str | None = None, **kwargs: Any) -> requests.Response:
    return requests.request(method, url, headers=bearer(token), timeout=60, **kwargs)


@pytest.fixture(scope="module")
def own_store(tmp_path_factory, simulator) -> Iterator[Store]:
    """The simulated cluster's three days in a store of this module's own (its tests push and decide)."""
    store = fill_store(Store(tmp_path_factory.mktemp("access") / "access.duckdb"), simulator, days=3, step_s=600)
    yield store
    store.close()


@pytest.fixture(scope="module")
def closed(own_store) -> Iterator[tuple[str, dict[str, str]]]:
    """A server whose reads need a token, over the simulated store, and a token of each role made through the API
    by the bootstrap admin: (URL, role -> token)."""
    server = ApiServer(own_store, SITE, port=0, token=BOOT)
    url = server.start()
    tokens = {}
    for name, role in (("ops", "reader"), ("lead", f"team:{TEAM}"), ("node-a", "agent:node-a"), ("root", "admin")):
        made = call("POST", f"{url}/v1/tokens", BOOT, json={"name": name, "role": role})
        assert made.status_code == 201 and made.json()["role"] == role, made.text
        tokens[role.split(":")[0]] = made.json()["token"]
    assert call("GET", f"{url}/v1/recommendations", tokens["reader"]).ok  # evaluates and stores advice
    yield url, tokens
    server.stop()


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON answer, keys included."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
    elif isinstance(value, str):
        yield value


def get_paths(url: str) -> list[tuple[str, set[str]]]:
    """Every GET route of the OpenAPI spec with its query parameter names."""
    spec = requests.get(f"{url}/openapi.json", timeout=30).json()
    return [(path, {p["name"] for p in ops["get"].get("parameters", []) if p["in"] == "query"})
            for path, ops in spec["paths"].items() if "get" in ops]


def test_reads_need_a_token_unless_opened(closed):
    url, tokens = closed
    refused = call("GET", f"{url}/v1/costs")
    assert refused.status_code == 401 and "token" in refused.json()["detail"]
    assert refused.headers["WWW-Authenticate"] == "Bearer"
    assert call("GET", f"{url}/v1/costs", "glt_000000000000_" + "x" * 43).status_code == 401
    assert call("GET", f"{url}/healthz").status_code == 200  # liveness probes carry no token
    assert call("GET", f"{url}/docs").status_code == 200
    assert call("GET", f"{url}/v1/costs", tokens["reader"]).status_code == 200
    who = call("GET", f"{url}/v1/whoami", tokens["team"]).json()
    assert who["role"] == f"team:{TEAM}" and who["team"] == TEAM and not who["may_decide"]


def test_a_reader_reads_everything_and_writes_nothing(closed):
    url, tokens = closed
    for path, params in get_paths(url):
        if "{" in path or path in ("/v1/tokens", "/v1/audit", "/v1/backup", "/v1/recommendations/export"):
            continue
        query = {k: v for k, v in (("end", END), ("window", "3d")) if k in params}
        answer = call("GET", url + path, tokens["reader"], params=query)
        assert answer.status_code == 200, (path, answer.text)
    assert call("GET", f"{url}/v1/recommendations/export", tokens["reader"], params={"target": "kueue"}).ok
    rec = call("GET", f"{url}/v1/recommendations/history", tokens["reader"]).json()[0]
    decided = call("POST", f"{url}/v1/recommendations/{rec['id']}/decision", tokens["reader"],
                   json={"decision": "reject", "by": "ops"})
    assert decided.status_code == 403 and "admin" in decided.json()["detail"]
    for admin_only in ("/v1/tokens", "/v1/audit", "/v1/backup"):
        assert call("GET", url + admin_only, tokens["reader"]).status_code == 403
    assert post(url, batch(), seq=0, node="node-a", token=tokens["reader"]).status_code == 403


def test_a_team_token_sees_its_own_team_and_no_other(closed):
    url, tokens = closed
    everyone = call("GET", f"{url}/v1/jobs", tokens["reader"], params={"days": 3, "end": END, "limit": 10000}).json()
    teams = {t["team"] for t in call("GET", f"{url}/v1/teams", tokens["reader"]).json()}
    others = (teams - {TEAM, UNATTRIBUTED, IDLE_CAPACITY}) | {j["job_id"] for j in everyone if j["team"] != TEAM}
    assert len(teams) >= 3 and any(j["team"] == TEAM for j in everyone)
    checked = 0
    for path, params in get_paths(url):
        path = path.replace("{team}", TEAM).replace("{period}", END[:7])  # the month of the window's end
        path = path.replace("{node}", "node-a")
        week = datetime.fromisoformat(END.replace("Z", "+00:00")).isocalendar()
        path = path.replace("{week}", f"{week[0]}-W{week[1]:02d}")  # the weekly report of the window's end
        query = {k: v for k, v in (("days", 3), ("end", END), ("target", "kueue"), ("window", "3d"),
                                   ("aggregate", "team")) if k in params}
        answer = call("GET", url + path, tokens["team"], params=query)
        if path in ("/metrics", "/v1/recommendations/export", "/v1/tokens", "/v1/audit", "/v1/backup"):
            assert answer.status_code == 403, path  # every team's figures at once, or admin's
            continue
        assert answer.status_code == 200, (path, answer.text)
        if answer.headers["content-type"] == "application/zip":  # the report: the team's own page and CSV
            with zipfile.ZipFile(io.BytesIO(answer.content)) as bundle:
                text = " ".join(bundle.read(name).decode() for name in bundle.namelist())
            leaked = {name for name in others if re.search(rf"(?<![\w/-]){re.escape(name)}(?![\w/-])", text)}
            assert not leaked, f"{path} shows a team token other teams' names or jobs: {sorted(leaked)[:5]}"
            checked += 1
            continue
        leaked = others & set(strings(answer.json()))
        assert not leaked, f"{path} shows a team token other teams' names or jobs: {sorted(leaked)[:5]}"
        checked += 1
    assert checked >= 15
    own = call("GET", f"{url}/v1/jobs", tokens["team"], params={"days": 3, "end": END}).json()
    assert own and {j["team"] for j in own} == {TEAM}
    costs = call("GET", f"{url}/v1/costs", tokens["team"], params={"days": 3, "end": END}).json()
    full = call("GET", f"{url}/v1/costs", tokens["reader"], params={"days": 3, "end": END}).json()
    # the table adds up to its total; the cluster's cost is beside it, without the other teams' names
    assert costs["total_usd"] == pytest.approx(sum(t["cost_usd"] for t in costs["teams"]))
    assert costs["cluster_total_usd"] == pytest.approx(full["total_usd"])
    assert costs["cluster_total_usd"] > costs["total_usd"]
    assert {t["team"] for t in costs["teams"]} <= {TEAM, UNATTRIBUTED, IDLE_CAPACITY}
    gpus = call("GET", f"{url}/v1/gpus", tokens["team"], params={"days": 1, "end": END}).json()["holders"]
    assert {h["team"] for h in gpus} <= {TEAM, OTHER_TEAM, None}
    for refused in ("/v1/teams/vision/usage", "/v1/jobs?team=vision", "/v1/recommendations?team=vision"):
        answer = call("GET", url + refused, tokens["team"])
        assert answer.status_code == 403 and TEAM in answer.json()["detail"], refused


def test_an_agent_token_pushes_only_as_its_node(closed, own_store):
    url, tokens = closed
    before = own_store.sample_count()
    stolen = post(url, batch(), seq=0, node="node-b", token=tokens["agent"])
    assert stolen.status_code == 403 and "node-a" in stolen.json()["detail"]
    assert own_store.sample_count() == before  # nothing stored under the other node's name
    assert call("GET", f"{url}/v1/costs", tokens["agent"]).status_code == 403
    own = post(url, batch(), seq=0, node="node-a", token=tokens["agent"])
    assert own.status_code == 200 and own.json()["rows"] == 8
    stored = own_store.query("SELECT DISTINCT node FROM samples WHERE ts = ?", [batch().column("ts")[0].as_py()])
    assert stored["node"].tolist() == ["node-a"]  # the rows carry the token's node


def test_tokens_are_hashed_at_rest_and_revoked_at_once(closed, own_store):
    url, tokens = closed
    rows = own_store.query("SELECT * FROM api_tokens")
    dumped = rows.to_csv()
    # glt_<id>_<secret>, and the secret's own alphabet holds '_': split twice only (split("_")[-1] was a letter)
    assert all(t.split("_", 2)[2] not in dumped for t in tokens.values())  # no secret is stored
    made = call("POST", f"{url}/v1/tokens", tokens["admin"], json={"name": "temp", "role": "reader"}).json()
    assert call("GET", f"{url}/v1/teams", made["token"]).ok
    listed = call("GET", f"{url}/v1/tokens", tokens["admin"]).json()
    assert made["id"] in {t["id"] for t in listed} and all("token" not in t for t in listed)
    assert call("DELETE", f"{url}/v1/tokens/{made['id']}", tokens["admin"]).json()["revoked"]
    assert call("GET", f"{url}/v1/teams", made["token"]).status_code == 401
    assert call("DELETE", f"{url}/v1/tokens/{made['id']}", tokens["admin"]).status_code == 404
    bad = call("POST", f"{url}/v1/tokens", tokens["admin"], json={"name": "x", "role": "team:"})
    assert bad.status_code == 422 and "team name" in bad.json()["detail"]
    assert call("POST", f"{url}/v1/tokens", tokens["team"], json={"name": "x", "role": "admin"}).status_code == 403


def test_every_write_is_audited_and_the_chain_shows_tampering(closed, own_store):
    url, tokens = closed
    rec = call("GET", f"{url}/v1/recommendations/history", tokens["admin"], params={"status": "proposed"}).json()[0]
    done = call("POST", f"{url}/v1/recommendations/{rec['id']}/decision", tokens["admin"],
                json={"decision": "reject", "by": "carol", "note": "not this quarter"})
    assert done.status_code == 200
    post(url, batch(), seq=7, node="node-c", token=tokens["agent"])  # refused: another node
    log = call("GET", f"{url}/v1/audit", tokens["admin"]).json()
    assert log["intact"] and log["first_broken"] is None
    entries = log["entries"]
    decision = next(e for e in entries if e["action"] == "POST /v1/recommendations/{rec_id}/decision"
                    and e["status"] == 200)
    assert decision["actor"].startswith("root (") and decision["role"] == "admin"
    assert decision["detail"]["decision"] == "reject" and decision["remote"] == "127.0.0.1"
    refused = next(e for e in entries if e["action"] == f"POST {INGEST_PATH}" and e["status"] == 403)
    assert refused["detail"]["node"] == "node-c" and refused["role"] == "agent:node-a"
    made = [e for e in entries if e["action"] == "POST /v1/tokens" and e["status"] == 201]
    assert {e["detail"]["role"] for e in made} >= {"reader", f"team:{TEAM}", "agent:node-a", "admin"}
    seqs = [e["seq"] for e in entries]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == len(seqs)
    assert verify_audit(own_store) is None
    original = own_store.scalar("SELECT actor FROM audit_log WHERE seq = 2")
    with own_store.transaction() as cur:  # someone edits the log behind gpuledger's back
        cur.execute("UPDATE audit_log SET actor = 'nobody' WHERE seq = 2")
    try:
        assert verify_audit(own_store) == 2
        assert call("GET", f"{url}/v1/audit", tokens["admin"]).json()["first_broken"] == 2
    finally:
        with own_store.transaction() as cur:
            cur.execute("UPDATE audit_log SET actor = ? WHERE seq = 2", [original])
    assert verify_audit(own_store) is None


def test_the_token_cli_on_a_file_and_through_a_server(tmp_path):
    db = tmp_path / "t.duckdb"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([GPULEDGER, *args], capture_output=True, text=True, timeout=120)
    made = cli("token", "create", "--role", "admin", "--name", "alice", "--db", str(db))
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("glt_") and "shown once" in made.stderr
    assert cli("token", "create", "--role", "boss", "--db", str(db)).stderr.startswith("gpuledger token: error: "
                                                                                       "unknown role 'boss'")
    with Store(db) as store:
        server = ApiServer(store, SITE, port=0)  # no bootstrap token: the file's admin token is the way in
        url = server.start()
        try:
            held = cli("token", "list", "--db", str(db))
            assert held.returncode == 2 and "--server URL" in held.stderr  # the server holds the file
            agent = cli("token", "create", "--role", "agent:gpu-07", "--server", url, "--token", token)
            assert agent.returncode == 0, agent.stderr
            listed = json.loads(cli("token", "list", "--json", "--server", url, "--token", token).stdout)
            assert {t["role"] for t in listed} == {"admin", "agent:gpu-07"}
            assert post(url, batch(), seq=0, node="gpu-07", token=agent.stdout.strip()).status_code == 200
            gone = cli("token", "revoke", listed[0]["id"] if listed[0]["role"] != "admin" else listed[1]["id"],
                       "--server", url, "--token", token)
            assert gone.returncode == 0 and "revoked" in gone.stderr
            assert post(url, batch(), seq=1, node="gpu-07", token=agent.stdout.strip()).status_code == 401
            denied = cli("token", "list", "--server", url, "--token", agent.stdout.strip())
            assert denied.returncode == 2 and "401" in denied.stderr
        finally:
            server.stop()
    audit = cli("audit", "--db", str(db))
    assert audit.returncode == 0 and "chain intact" in audit.stdout and "POST /v1/tokens" in audit.stdout
