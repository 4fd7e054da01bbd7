"""The `gpuledger` command as a user runs it: a real process, real files, real HTTP."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import requests

from gpuledger.analytics.store import Store
from gpuledger.collector.dcgm_render import render_page
from gpuledger.collector.errors import InputError
from tests.conftest import SIM_END, fill_store

GPULEDGER = str(Path(sys.executable).with_name("gpuledger"))


def run(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([GPULEDGER, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def small_db(tmp_path: Path, simulator) -> Path:
    path = tmp_path / "small.duckdb"
    fill_store(Store(path), simulator, days=2, step_s=600).close()
    return path


def test_help_explains_every_command():
    top = run("--help")
    assert top.returncode == 0
    for command in ("demo", "serve", "collect", "report", "recommend", "dashboard"):
        assert command in top.stdout
    demo = run("demo", "--help")
    assert "--days" in demo.stdout and "--duration" in demo.stdout and "Ctrl-C" in demo.stdout


def test_report_and_recommend_on_a_database(tmp_path, simulator):
    db = small_db(tmp_path, simulator)
    week = (SIM_END - timedelta(days=1)).strftime("%G-W%V")
    out = run("report", "--week", week, "--db", str(db), "--out", str(tmp_path / "reports"))
    assert out.returncode == 0, out.stderr
    html = Path(re.search(r"report \S+: (\S+)", out.stdout).group(1))
    assert html.exists() and "team-nlp.csv" in out.stdout
    rec = run("recommend", "--db", str(db))
    assert rec.returncode == 0, rec.stderr
    quota = [r for r in json.loads(rec.stdout)["recommendations"] if r["kind"] == "quota"]
    # two days of samples for a 14-day policy window: no quota numbers, a reason per team and model instead
    assert quota and all(r["status"] == "insufficient_data" and r["action"] == {} for r in quota)
    assert "cover 14%" in quota[0]["reason"]
    assert run("report", "--week", "2030-W01", "--db", str(db)).stderr.endswith(
        "no samples in week 2030-W01 (2029-12-31 to 2030-01-07): nothing to report\n")


def test_recommend_stores_advice_and_decide_records_a_decision(tmp_path, simulator):
    db = small_db(tmp_path, simulator)
    cfg = tmp_path / "policy.toml"
    cfg.write_text("[quota]\nwindow_days = 1\n")
    first = json.loads(run("recommend", "--db", str(db), "--config", str(cfg)).stdout)["recommendations"]
    proposed = [r for r in first if r["status"] == "proposed"]
    assert proposed and all(r["created"] for r in proposed)
    again = json.loads(run("recommend", "--db", str(db), "--config", str(cfg)).stdout)["recommendations"]
    assert {r["id"] for r in again if r["status"] == "proposed"} == {r["id"] for r in proposed}  # stable
    decided = run("decide", proposed[0]["id"], "reject", "--by", "alice", "--note", "not now", "--db", str(db))
    assert decided.returncode == 0 and f"{proposed[0]['id']}: rejected by alice" in decided.stdout
    twice = run("decide", proposed[0]["id"], "accept", "--by", "bob", "--db", str(db))
    assert twice.returncode == 2 and "is rejected; it cannot become accepted" in twice.stderr
    preview = json.loads(run("recommend", "--db", str(db), "--config", str(cfg), "--at",
                             "2030-01-01T00:00:00Z").stdout)["recommendations"]
    assert preview and {r["status"] for r in preview} == {"insufficient_data"}


def test_errors_are_one_clear_line_and_exit_2(tmp_path):
    missing = run("report", "--db", str(tmp_path / "nope.duckdb"))
    assert missing.returncode == 2 and "no database at" in missing.stderr and "Traceback" not in missing.stderr
    empty = tmp_path / "empty.duckdb"
    Store(empty).close()
    assert "holds no samples" in run("recommend", "--db", str(empty)).stderr
    bad_week = run("report", "--db", str(empty), "--week", "26-48")
    assert bad_week.returncode == 2
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[rates]\nH100 = -3\n")
    bad_cfg = run("recommend", "--db", str(empty), "--config", str(cfg))
    assert bad_cfg.returncode == 2 and "H100 must be a number" in bad_cfg.stderr
    assert run("demo", "--days", "-1").returncode == 2  # argparse rejects it with usage
    no_source = run("agent", "--source", "none", "--server", "http://127.0.0.1:9", "--token", "t")
    assert no_source.returncode == 2 and "invalid choice: 'none'" in no_source.stderr  # only `serve` receives


def test_collect_from_a_dcgm_exporter_page(tmp_path, page_server, simulator):
    page_server.body = render_page(simulator.frame([SIM_END.timestamp()], 30.0).slice(0, 8))
    db = tmp_path / "c.duckdb"
    out = run("collect", "--source", "dcgm", "--dcgm-url", page_server.url, "--db", str(db),
              "--count", "2", "--interval", "0.1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("8 sample(s)") == 2
    with Store(db) as store:
        assert store.sample_count() == 16 and len(store.current_rates()) == 9
    # a page whose Hostname is the exporter's container id: the node comes from --node, else it is 'unknown'
    real = Path(__file__).resolve().parent.parent.parent / "shared" / "dcgm-pages" / \
        "datadog-integrations-core-dcgm-fixture-t4-460.txt"
    page_server.body = real.read_text()
    named = run("collect", "--source", "dcgm", "--dcgm-url", page_server.url, "--db", str(db), "--node", "gpu-7")
    unnamed = run("collect", "--source", "dcgm", "--dcgm-url", page_server.url, "--db", str(db))
    assert named.returncode == 0 and unnamed.returncode == 0, named.stderr + unnamed.stderr
    assert "no node name (Hostname='424773df46e0' is the exporter's container or pod)" in unnamed.stderr
    with Store(db) as store:
        nodes = store.query("SELECT node, count(*) AS n FROM samples WHERE gpu_model = 'T4' GROUP BY 1 ORDER BY 1")
    assert nodes.values.tolist() == [["gpu-7", 1], ["unknown", 1]]
    page_server.status = 500
    failed = run("collect", "--source", "dcgm", "--dcgm-url", page_server.url, "--db", str(db))
    assert failed.returncode == 2 and "cannot scrape dcgm-exporter" in failed.stderr


def test_demo_runs_end_to_end_and_serves_data(tmp_path):
    proc = subprocess.Popen([GPULEDGER, "demo", "--days", "1", "--no-dashboard", "--duration", "12",
                             "--api-port", "0", "--interval", "1", "--db", str(tmp_path / "demo.duckdb"),
                             "--reports", str(tmp_path / "reports")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    api = None
    while api is None and time.monotonic() < deadline and proc.poll() is None:
        for line in list(lines):
            if m := re.search(r"API:\s+(http://127\.0\.0\.1:\d+)", line):
                api = m.group(1)
        time.sleep(0.2)
    try:
        assert api, "".join(lines)
        recs = requests.get(f"{api}/v1/recommendations", timeout=60).json()["recommendations"]
        assert any(r["kind"] == "quota" for r in recs)
        first = requests.get(f"{api}/healthz", timeout=10).json()["samples"]
        time.sleep(2.5)
        assert requests.get(f"{api}/healthz", timeout=10).json()["samples"] > first  # live collection
    finally:
        assert proc.wait(timeout=90) == 0, "".join(lines)
    reader.join(5)
    output = "".join(lines)
    assert "backfill 1/1 days" in output and "weekly report:" in output and "stopped;" in output
    assert list((tmp_path / "reports").glob("*/gpuledger-*.html"))
    # a new demo database gets its audit key as news: nothing in a clean demo run is a warning
    assert "audit key created" in output and not [line for line in lines if "WARNING" in line], output
    # the demo's file served again judges its inference services against the demo's SLOs, as the demo did
    served = subprocess.Popen([GPULEDGER, "serve", "--db", str(tmp_path / "demo.duckdb"), "--port", "0",
                               "--open-reads", "--reports", str(tmp_path / "reports")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        for line in iter(served.stdout.readline, ""):
            if m := re.search(r"serving (http://127\.0\.0\.1:\d+)", line):
                url = m.group(1)
                break
        assert url, "serve did not start"
        services = requests.get(f"{url}/v1/inference", params={"days": 2}, timeout=60).json()["services"]
        assert services and all(s["slo_status"] in ("met", "missed", "unknown") for s in services)
    finally:
        served.terminate()
        served.wait(timeout=30)


def test_demo_refuses_to_overwrite_a_real_database(tmp_path):
    real = tmp_path / "prod.duckdb"
    Store(real).close()
    out = run("demo", "--db", str(real), "--days", "1", "--no-dashboard", "--duration", "1")
    assert out.returncode == 2 and "not a gpuledger demo database" in out.stderr
    assert real.exists()


def test_a_bug_keeps_its_traceback_and_a_user_error_is_one_line(tmp_path, monkeypatch, capsys):
    """Only errors a user can fix are turned into one line; anything else is a bug and must show where it is."""
    from gpuledger.deploy import cli

    def broken(args, config):
        raise KeyError("a bug in a command")

    monkeypatch.setitem(cli.COMMANDS, "recommend", broken)
    with pytest.raises(KeyError, match="a bug in a command"):
        cli.main(["recommend", "--db", str(tmp_path / "x.duckdb")])

    def refused(args, config):
        raise InputError("that week does not exist")

    monkeypatch.setitem(cli.COMMANDS, "recommend", refused)
    assert cli.main(["recommend", "--db", str(tmp_path / "x.duckdb")]) == 2
    assert capsys.readouterr().err == "gpuledger recommend: error: that week does not exist\n"


def test_every_command_has_a_function():
    from gpuledger.deploy import cli
    parser_commands = set(cli.build_parser()._subparsers._group_actions[0].choices)
    assert parser_commands == set(cli.COMMANDS) | {"dashboard"}


def test_emit_writes_files_and_only_changes_against_current(tmp_path, simulator):
    db = small_db(tmp_path, simulator)
    out = run("emit", "--target", "kueue", "--db", str(db), "--out", str(tmp_path / "plan"))
    assert out.returncode == 0, out.stderr
    written = (tmp_path / "plan" / "kueue.yaml").read_text()
    assert "kind: ClusterQueue" in written and "nominalQuota" in written
    same = tmp_path / "now.yaml"
    same.write_text(written)
    unchanged = run("emit", "--target", "kueue", "--db", str(db), "--current", str(same))
    assert unchanged.returncode == 0 and unchanged.stdout == ""  # what exists is already the plan
    slurm = run("emit", "--target", "slurm", "--db", str(db), "--out", str(tmp_path / "plan"))
    assert slurm.returncode == 0 and (tmp_path / "plan" / "slurm.sh").read_text().startswith("#!/bin/sh")
    assert json.loads((tmp_path / "plan" / "slurm.json").read_text())
    bad = run("emit", "--target", "kai", "--db", str(db), "--current", str(tmp_path / "missing.yaml"))
    assert bad.returncode == 2 and "cannot read --current" in bad.stderr


def test_every_user_error_is_one_line_with_exit_2(tmp_path, simulator):
    db = small_db(tmp_path, simulator)
    port = run("serve", "--port", "99999", "--source", "none", "--db", str(tmp_path / "s.duckdb"))
    assert port.returncode == 2 and "a port is 0 to 65535" in port.stderr
    typo = run("serve", "--port", "0", "--source", "none", "--db", str(tmp_path / "mistyped.duckdb"))
    assert typo.returncode == 2 and "add --create" in typo.stderr  # not a new, empty database
    assert not (tmp_path / "mistyped.duckdb").exists()
    a_file = tmp_path / "a-file"
    a_file.write_text("")  # a folder cannot be made under a file, not even by root
    out = run("report", "--week", (SIM_END - timedelta(days=1)).strftime("%G-W%V"), "--db", str(db),
              "--out", str(a_file / "reports"))
    assert out.returncode == 2 and "cannot write the report into" in out.stderr and "Traceback" not in out.stderr
    emitted = run("emit", "--target", "kai", "--db", str(db), "--out", str(a_file / "plan"))
    assert emitted.returncode == 2 and "cannot write into" in emitted.stderr
    not_db = tmp_path / "notes.duckdb"
    not_db.write_text("not a database")
    bad = run("recommend", "--db", str(not_db))
    assert bad.returncode == 2 and "not a valid DuckDB database file" in bad.stderr and "lock" not in bad.stderr
    unreachable = tmp_path / "never.duckdb"
    failed = run("collect", "--source", "dcgm", "--dcgm-url", "http://127.0.0.1:9/metrics", "--db", str(unreachable))
    assert failed.returncode == 2 and "cannot scrape dcgm-exporter" in failed.stderr
    assert not unreachable.exists()  # nothing read, no empty database left behind


def test_recommend_into_a_closed_pipe_is_quiet(tmp_path, simulator):
    db = small_db(tmp_path, simulator)
    piped = subprocess.run(f"'{GPULEDGER}' recommend --db '{db}' | head -c 10", shell=True, capture_output=True,
                           text=True, timeout=120)
    assert piped.returncode == 0 and len(piped.stdout) == 10 and "Traceback" not in piped.stderr
    assert "BrokenPipe" not in piped.stderr


def test_readers_find_the_demo_database_when_it_is_the_only_one(tmp_path, simulator):
    data = tmp_path / "gpuledger-data"
    data.mkdir()
    small_db(tmp_path, simulator).rename(data / "demo.duckdb")
    found = run("recommend", cwd=tmp_path)
    assert found.returncode == 0 and json.loads(found.stdout)["recommendations"]
    assert not (data / "gpuledger.duckdb").exists()


def test_compact_drops_expired_samples_and_keeps_every_total(tmp_path, simulator):
    from gpuledger.analytics.cost import cost_by_team
    db = small_db(tmp_path, simulator)
    window = (SIM_END - timedelta(days=2), SIM_END)
    with Store(db) as store:
        before, rows = cost_by_team(store, *window), store.scalar("SELECT count(*) FROM samples")
    config = tmp_path / "short.toml"
    config.write_text("[retention]\nraw_days = 1\nminute_days = 1\n")
    out = run("compact", "--db", str(db), "--config", str(config))
    assert out.returncode == 0, out.stderr
    dropped = int(re.search(r"dropped ([\d,]+) raw sample", out.stdout).group(1).replace(",", ""))
    assert 0 < dropped < rows and "older than 1 days" in out.stdout
    with Store(db) as store:
        assert store.scalar("SELECT count(*) FROM samples") == rows - dropped
        after = cost_by_team(store, *window)
    assert after["cost_usd"].round(2).tolist() == before["cost_usd"].round(2).tolist()
    assert after["gpu_hours"].round(6).tolist() == before["gpu_hours"].round(6).tolist()
    config.write_text("[retention]\nraw_days = 100\n")
    bad = run("compact", "--db", str(db), "--config", str(config))
    assert bad.returncode == 2 and "[retention] raw_days must be >= 1 and <= minute_days" in bad.stderr
