"""Commands beside a running server, the rest of issue 41 item 1: a command run on the file a live server holds
finds that server by its note beside the file and asks it (no lock error, no --server needed); the weekly report
and compaction have routes (`GET /v1/reports/{week}`, `POST /v1/admin/compact`) and `report`/`compact --server`
print what the file path prints, with the same role checks as any API client."""
from __future__ import annotations

import json
import re
import os
import subprocess
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import pandas as pd
import pytest

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import Role, create_token
from gpuledger.analytics.windows import iso_week, utc_now
from gpuledger.deploy import server_file
from gpuledger.deploy.report_bundle import MANIFEST
from gpuledger.deploy.server import ApiServer
from tests.helpers import gpu_rows, table
from tests.procs import GPULEDGER, TOKEN, Server

ADMIN = "admin-t0ken-found"
NO_SERVER_ENV = {k: v for k, v in os.environ.items() if k not in ("GPULEDGER_SERVER", "GPULEDGER_TOKEN")}


def _last_week_store(db: Path) -> None:
    """Three teams' GPUs through part of last week, and the hour before now (so a draft statement has lines)."""
    start, _, _ = iso_week("last")
    with Store(db) as store:
        store.set_rates(Config().rates)
        rows = [gpu_rows("h", g, "H100", 180, step_s=60.0, start=start + timedelta(days=2), util=20.0 + 30 * g,
                         job=f"t{g}/train", team=f"t{g}") for g in range(3)]
        rows += [gpu_rows("h", g, "H100", 60, step_s=60.0, start=utc_now() - timedelta(hours=2), util=50.0,
                          job=f"t{g}/now", team=f"t{g}") for g in range(3)]
        store.append_samples(table(*rows))
        store.fold()


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([GPULEDGER, *args], capture_output=True, text=True, timeout=600,
                          env=env if env is not None else NO_SERVER_ENV)


@contextmanager
def _serving_with_roles(db: Path) -> Iterator[tuple[str, str, str]]:
    """An API server on `db` with a token of team t1 and a reader's: (its URL, the team token, the reader token)."""
    with Store(db) as store:
        _, team = create_token(store, "t1-lead", Role.parse("team:t1"), "test")
        _, reader = create_token(store, "finance", Role.parse("reader"), "test")
        server = ApiServer(store, Config(), port=0, token=ADMIN)
        url = server.start()
        try:
            yield url, team, reader
        finally:
            server.stop()


def _csvs(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.glob("*.csv"))}


def test_report_and_compact_through_the_server_with_each_role(tmp_path):
    db = tmp_path / "r.duckdb"
    _last_week_store(db)
    local = _run("report", "--week", "last", "--db", str(db), "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr
    label = iso_week("last")[2]
    with _serving_with_roles(db) as (url, team, reader):
        runs = {who: _run("report", "--week", "last", "--server", url, "--token", token, "--out",
                          str(tmp_path / who)) for who, token in (("admin", ADMIN), ("reader", reader),
                                                                   ("team", team))}
        nobody = _run("report", "--week", "last", "--server", url, "--out", str(tmp_path / "nobody"))
        empty_week = _run("report", "--week", "2020-W01", "--server", url, "--token", ADMIN, "--out",
                          str(tmp_path / "old"))
        compacted = {who: _run("compact", "--server", url, "--token", token)
                     for who, token in (("admin", ADMIN), ("reader", reader), ("team", team))}
        rebuilt = _run("compact", "--rebuild", "--server", url, "--token", ADMIN)
    for who in ("admin", "reader"):  # every file, as the file path wrote them
        assert runs[who].returncode == 0, runs[who].stderr
        assert _csvs(tmp_path / who / label) == _csvs(tmp_path / "local" / label) != {}
        assert runs[who].stdout.replace(str(tmp_path / who), "OUT") == local.stdout.replace(
            str(tmp_path / "local"), "OUT")
    # a team token: its own page and CSV, no other team's name in what it got
    assert runs["team"].returncode == 0, runs["team"].stderr
    got = sorted(p.name for p in (tmp_path / "team" / label).iterdir())
    assert got == ["team-t1.csv", "team-t1.html"], got
    assert (tmp_path / "team" / label / "team-t1.csv").read_text() == \
        (tmp_path / "local" / label / "team-t1.csv").read_text()
    assert not any(other in (tmp_path / "team" / label / "team-t1.html").read_text() for other in ("t0/", "t2/"))
    assert nobody.returncode == 2 and "401" in nobody.stderr, nobody.stderr
    assert empty_week.returncode == 2 and "404" in empty_week.stderr and "no samples" in empty_week.stderr
    # compaction: an admin's write; the figures as the file path prints them
    assert compacted["admin"].returncode == 0, compacted["admin"].stderr
    assert "rollups complete up to" in compacted["admin"].stdout and "hour rollups are kept" in compacted["admin"].stdout
    for who in ("reader", "team"):
        assert compacted[who].returncode == 2 and "403" in compacted[who].stderr, compacted[who].stderr
    assert rebuilt.returncode == 0 and "folded" in rebuilt.stdout, rebuilt.stderr
    offline = _run("compact", "--db", str(db))
    assert offline.returncode == 0 and offline.stdout.splitlines()[-1] == compacted["admin"].stdout.splitlines()[-1]


def test_a_command_on_a_held_file_finds_its_server_and_says_so(tmp_path):
    db = tmp_path / "held.duckdb"
    _last_week_store(db)
    period = f"{utc_now():%Y-%m}"
    statement = ("statement", "--period", period, "--draft", "--db", str(db))
    offline = _run(*statement, "--out", str(tmp_path / "offline"))
    assert offline.returncode == 0, offline.stderr
    server = Server(tmp_path, db=db).start()
    try:
        note = json.loads(server_file.note_path(db).read_text())
        assert note["url"] == server.url and note["pid"] == server.proc.popen.pid
        found = _run(*statement, "--out", str(tmp_path / "found"))
        report = _run("report", "--week", "last", "--db", str(db), "--out", str(tmp_path / "rep"))
        denied = _run("compact", "--db", str(db))  # a write: an admin token is needed, and said so
        compact = _run("compact", "--db", str(db), env={**NO_SERVER_ENV, "GPULEDGER_TOKEN": TOKEN})
    finally:
        assert server.proc.stop() == 0
    assert found.returncode == 0, found.stderr
    assert f"held by the server at {server.url}" in found.stderr
    def strip(out: str) -> str:
        return "\n".join(line for line in out.split("\ncsv:")[0].splitlines() if not line.startswith("coverage:"))

    assert strip(found.stdout) == strip(offline.stdout)
    assert report.returncode == 0 and "held by the server" in report.stderr, report.stderr
    assert (tmp_path / "rep" / iso_week("last")[2] / "summary.csv").exists()
    assert denied.returncode == 2 and "admin --token" in denied.stderr, denied.stderr
    assert compact.returncode == 0 and "rollups complete up to" in compact.stdout, compact.stderr
    assert not server_file.note_path(db).exists()  # the server took its note away when it stopped
    # a note a killed server left behind is ignored: the command opens the file itself
    dead = subprocess.Popen(["true"])
    dead.wait()
    server_file.note_path(db).write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": dead.pid}))
    after = _run(*statement, "--out", str(tmp_path / "after"))
    assert after.returncode == 0 and "held by" not in after.stderr, after.stderr


def test_the_report_bundle_writes_nothing_outside_its_folder(tmp_path):
    import io
    import zipfile

    from gpuledger.collector.errors import GpuledgerError
    from gpuledger.deploy.report_bundle import unpack
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr(MANIFEST, json.dumps({"label": "2026-W01", "html": "../evil.html", "summary_csv": "s.csv",
                                              "team_csvs": {}, "team_pages": {}}))
        bundle.writestr("../evil.html", "x")
        bundle.writestr("s.csv", "a")
    with pytest.raises(GpuledgerError, match="not a plain file name"):
        unpack(buffer.getvalue(), tmp_path / "out")
    assert not (tmp_path / "evil.html").exists()
    with pytest.raises(GpuledgerError, match="not a report bundle"):
        unpack(b"<html>a proxy's error page</html>", tmp_path / "out")


def test_a_slurm_read_is_stored_once_and_refused_like_any_write(tmp_path):
    """POST /v1/jobs/slurm (what `gpuledger jobs-agent` sends) without a real Slurm: the commands' output as
    tests/helpers captures it."""
    from fastapi.testclient import TestClient

    from gpuledger.deploy.api import create_app
    from tests.helpers import SACCT_SAMPLE
    at = utc_now()
    body = {"at": at.isoformat(), "squeue": "JOBID|STATE|SUBMIT_TIME|ACCOUNT|USER|PARTITION|QOS|TRES_PER_NODE|"
                                            "REASON|NAME|NODES|START_TIME\n",
            "sacct": SACCT_SAMPLE, "sacctmgr": "nlp||ml|30|cpu=64,gres/gpu:h100=3\n"}
    with Store(tmp_path / "s.duckdb") as store:
        client = TestClient(create_app(store, Config(), token=ADMIN))
        admin = {"Authorization": f"Bearer {ADMIN}"}
        first = client.post("/v1/jobs/slurm", json=body, headers=admin)
        assert first.status_code == 200, first.text
        jobs = store.query("SELECT * FROM jobs ORDER BY job_id")
        again = client.post("/v1/jobs/slurm", json=body, headers=admin)
        assert again.status_code == 200 and again.json()["jobs"] == first.json()["jobs"] > 0
        pd.testing.assert_frame_equal(store.query("SELECT * FROM jobs ORDER BY job_id"), jobs)  # stored once
        assert client.post("/v1/jobs/slurm", json=body).status_code == 401
        store.append_samples(table(gpu_rows("h", 0, "H100", 2, start=at - timedelta(minutes=5), team="nlp",
                                            job="nlp/x")))
        _, team = create_token(store, "lead", Role.parse("team:nlp"), "test")
        assert client.post("/v1/jobs/slurm", json=body, headers={"Authorization": f"Bearer {team}"}).status_code == 403
        future = {**body, "at": (at + timedelta(hours=1)).isoformat()}
        refused = client.post("/v1/jobs/slurm", json=future, headers=admin)
        assert refused.status_code == 422 and "in the future" in refused.text
        assert client.post("/v1/jobs/slurm", json={**body, "sacct_text": "x"}, headers=admin).status_code == 422


SACCT_HEADER = ("JobID|State|Submit|Eligible|Start|End|Account|User|Partition|QOS|NodeList|AllocTRES|ReqTRES|Reason|"
                "ExitCode|JobName")
READ_COMMANDS = {  # every read command in the README that can go through a server, as a user types it
    "report": ["report", "--week", "last", "--out", "{out}"],
    "statement": ["statement", "--period", "{month}", "--draft", "--out", "{out}"],
    "export focus": ["export", "focus", "--period", "{month}", "--draft", "--out", "{out}/focus.csv"],
    "recommend": ["recommend"],
    "capacity": ["capacity", "--weeks", "4"],
    "whatif": ["whatif", "--days", "7"],
    "emit": ["emit", "--target", "kueue", "--out", "{out}"],
    "notes": ["notes", "--days", "7", "--out", "{out}"],
}


def test_every_read_command_through_the_server_keeps_each_roles_view(tmp_path):
    """Admin and reader tokens run every read command; a team token gets its own team's view or the API's 403,
    never another team's name; no token gets the API's 401 (the server does not open reads)."""
    from gpuledger.deploy.job_import import ImportOptions, job_batches, store_jobs
    db = tmp_path / "roles.duckdb"
    _last_week_store(db)
    base = utc_now().replace(microsecond=0) - timedelta(hours=30)
    stamp = (lambda hours: f"{base + timedelta(hours=hours):%Y-%m-%dT%H:%M:%S}")  # noqa: E731
    sacct = [SACCT_HEADER] + [f"{9000 + i}|COMPLETED|{stamp(i)}|{stamp(i)}|{stamp(i + 1)}|{stamp(i + 3)}|t{i % 3}|u|"
                              f"gpu|normal|h|gres/gpu:h100=1,gres/gpu=1|gres/gpu:h100=1|None|0:0|job{i}"
                              for i in range(9)]
    with Store(db) as store:
        teams = ["t0", "t1", "t2"]
        store.upsert_teams(pd.DataFrame({"team": teams, "share": [1.0] * 3, "quota_gpus": [1] * 3}))
        store.set_team_quotas(pd.DataFrame({"team": teams, "gpu_model": ["H100"] * 3, "guarantee_gpus": [1.0] * 3,
                                            "limit_gpus": [3.0] * 3}))
        store_jobs(store, "sacct", job_batches("sacct", [line + "\n" for line in sacct], ImportOptions(), "t"), "t")
    month = f"{utc_now():%Y-%m}"
    results: dict[tuple[str, str], tuple[subprocess.CompletedProcess, Path]] = {}
    with _serving_with_roles(db) as (url, team, reader):
        # the reader and anonymous runs take a sample: the role check is the route's, one per role suffices
        for who, token, names in (("admin", ADMIN, list(READ_COMMANDS)), ("team", team, list(READ_COMMANDS)),
                                  ("reader", reader, ["report", "whatif"]), ("nobody", "", ["statement"])):
            for name in names:
                command = READ_COMMANDS[name]
                out = tmp_path / who / name.replace(" ", "-")
                out.mkdir(parents=True)
                args = [a.format(out=out, month=month) for a in command]
                results[who, name] = (_run(*args, "--server", url, *(["--token", token] if token else [])), out)
    for (who, name), (done, out) in results.items():
        if who in ("admin", "reader"):
            assert done.returncode == 0, (who, name, done.stderr)
        elif who == "nobody":
            assert done.returncode == 2 and "401" in done.stderr, (name, done.stderr)
        else:
            assert done.returncode == 0 or (done.returncode == 2 and "403" in done.stderr), (name, done.stderr)
            if done.returncode == 0:
                written = " ".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
                shown = done.stdout + written
                assert not re.search(r"(?<![\w-])t[02](?![\w-])", shown), (name, shown[:2000])
    # the team's own figures reached it where the route serves a team
    assert results["team", "statement"][0].returncode == 0 and "t1" in results["team", "statement"][0].stdout
    assert results["team", "report"][0].returncode == 0


def test_a_token_made_beside_the_demo_is_made_in_the_demos_file(tmp_path):
    """Only the demo's file exists: `token create` makes the token there (as every reader takes that file), not in
    a new empty server file that later commands would then read instead of the demo."""
    from gpuledger.analytics.store.access import list_tokens
    demo = tmp_path / "gpuledger-data" / "demo.duckdb"
    demo.parent.mkdir()
    _last_week_store(demo)
    made = subprocess.run([GPULEDGER, "token", "create", "--role", "reader", "--name", "finance"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=NO_SERVER_ENV)
    assert made.returncode == 0, made.stderr
    assert not (tmp_path / "gpuledger-data" / "gpuledger.duckdb").exists()
    with Store(demo) as store:
        assert list(list_tokens(store)["name"]) == ["finance"]


def test_a_config_given_to_a_command_the_server_answers_is_said_to_be_unused(tmp_path):
    db = tmp_path / "noted.duckdb"
    _last_week_store(db)
    site = tmp_path / "rates.toml"
    site.write_text('[rates]\nH100 = 100.0\n')
    with _serving_with_roles(db) as (url, _, reader):
        done = _run("statement", "--period", f"{utc_now():%Y-%m}", "--draft", "--out", str(tmp_path / "s"),
                    "--config", str(site), "--server", url, "--token", reader)
    assert done.returncode == 0, done.stderr
    assert "answers with the config it was started with" in done.stderr


def test_a_pdf_asked_for_without_the_pdf_extra_is_an_error_naming_it(tmp_path):
    """An install without playwright (shadowed here by a package that cannot be imported, as when the [pdf] extra
    is not installed): `report --pdf` and `statement --pdf` exit 2 naming the extra, not 0 with a warning."""
    db = tmp_path / "p.duckdb"
    _last_week_store(db)
    shadow = tmp_path / "shadow" / "playwright"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed (shadowed by the test)')\n")
    env = {**NO_SERVER_ENV, "PYTHONPATH": str(shadow.parent)}
    report = _run("report", "--week", "last", "--pdf", "--db", str(db), "--out", str(tmp_path / "r"), env=env)
    statement = _run("statement", "--period", f"{utc_now():%Y-%m}", "--draft", "--pdf", "--db", str(db), "--out",
                     str(tmp_path / "s"), env=env)
    for done in (report, statement):
        assert done.returncode == 2 and "gpuledger[pdf]" in done.stderr, done.stderr
    # the pages themselves were written before the PDF was refused: nothing else is lost
    assert (tmp_path / "r" / iso_week("last")[2] / "summary.csv").exists()
