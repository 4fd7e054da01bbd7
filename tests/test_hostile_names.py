"""Names are data, never code: a GPU model, team, department, job or user name that arrives from telemetry or the
config reaches every output (the Slurm script, Kubernetes YAML, the config, CSV, HTML, Markdown, a team's view)
as literal text, or is refused with an error that says why. The tests of the Slurm script, the config, CSV, the
dashboard and a team's view failed on the code before these fixes; those of YAML and HTML guard what was safe."""
from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
import requests
import streamlit as st
import yaml
from streamlit.testing.v1 import AppTest

from gpuledger.analytics.config import Config, ConfigError, load_config
from gpuledger.analytics.records import csv_cell, write_csv
from gpuledger.analytics.report import write_weekly_report
from gpuledger.analytics.store import Store
from gpuledger.analytics.team_scope import ANOTHER_TEAMS_JOB, redact_for_team
from gpuledger.collector.errors import InputError
from gpuledger.dashboard.escape import JOINER, md
from gpuledger.deploy.dashboard_proc import APP
from gpuledger.deploy.server import ApiServer
from gpuledger.policies.emitters import emitter_for
from gpuledger.policies.quota_plan import QuotaPlan, TeamPlan, k8s_name
from gpuledger.policies.recommendation import Recommendation, for_team
from gpuledger.policies.recommender import evaluate
from tests.helpers import T0, gpu_rows, table
from tests.browser import needs_chromium
from tests.procs import GPULEDGER

# what a shell, YAML or a CSV reader would run or read as syntax
SHELL_HOSTILE = [
    "$(touch pwned)",
    "`touch pwned`",
    "x; touch pwned",
    "x\ntouch pwned",
    "x\ttouch\tpwned",
    "it's \"quoted\" $(touch pwned)",
    "x && touch pwned || touch pwned | cat > pwned",
]


def hostile_plan(team: str, model: str, department: str) -> QuotaPlan:
    return QuotaPlan(teams=[TeamPlan(team, 30, department, {model: 2}, {model: 8}, always_busy={model: 1}),
                            TeamPlan("nlp", 10, None, {"H100": 1}, {"H100": 4})],
                     capacity={model: 8.0, "H100": 4.0}, made=T0)


@pytest.fixture
def fake_sacctmgr(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A directory to run the script in, the log of every argv `sacctmgr` got (one JSON list a line), and an
    environment whose PATH finds the recording stub first."""
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir()
    work.mkdir()
    log = tmp_path / "argv.jsonl"
    stub = bin_dir / "sacctmgr"
    stub.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"with open({str(log)!r}, 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n")
    stub.chmod(0o755)
    return work, log, {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to run the script")
@pytest.mark.parametrize("evil", SHELL_HOSTILE)
def test_the_slurm_script_passes_hostile_names_to_sacctmgr_as_literal_arguments(fake_sacctmgr, evil):
    work, log, env = fake_sacctmgr
    team, model, department = f"nlp{evil}", f"H100{evil}", f"ml{evil}"
    emitted = emitter_for("slurm").emit(hostile_plan(team, model, department))
    script = work / "slurm.sh"
    script.write_text(emitted.text)
    done = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not list(work.parent.rglob("pwned")), "the script ran a command hidden in a name"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    tres = f"GrpTRES=gres/gpu:{model.lower().replace(' ', '-')}=8"
    assert calls == [
        ["-i", "add", "account", f"name={department}", "fairshare=30"],
        ["-i", "add", "account", f"name={team}", f"parent={department}", "fairshare=30"],
        ["-i", "modify", "account", f"name={team}", "set", tres],
        ["-i", "add", "account", "name=nlp", "fairshare=10"],
        ["-i", "modify", "account", "name=nlp", "set", "GrpTRES=gres/gpu:h100=4"],
    ]
    # the same plan as JSON records holds each name exactly
    records = json.loads(json.dumps(emitted.objects))
    assert {r["account"] for r in records} == {department, team, "nlp"}
    assert [r["parent"] for r in records if r["account"] == team] == [department]
    assert [r["grp_tres"] for r in records if r["account"] == team] == [{tres[len("GrpTRES="):].rsplit("=", 1)[0]: 8}]


@pytest.mark.parametrize("evil, what", [("nlp,root", "account"), ("h100=0,gres/gpu:a100", "GPU type")])
def test_the_slurm_plan_refuses_names_sacctmgr_reads_as_syntax(evil, what):
    """Quoting stops the shell, not sacctmgr: `name=nlp,root` would modify root too."""
    plan = hostile_plan(evil if what == "account" else "vision", evil if what != "account" else "H100", "ml")
    with pytest.raises(InputError, match=what):
        emitter_for("slurm").emit(plan)


YAML_HOSTILE = ["x: y\nkind: Secret", "- evil", "{a: b}", "'quoted' \"both\"", "&anchor *alias", "! tag",
                "# comment", "$(touch pwned)", "vision\n---\napiVersion: v1", "%YAML 1.1", "null", "true", "1e3"]


@pytest.mark.parametrize("target", ["kai", "kueue", "volcano"])
@pytest.mark.parametrize("evil", YAML_HOSTILE)
def test_kubernetes_yaml_keeps_hostile_names_as_data(target, evil):
    """Every object name is a DNS-1123 label derived from the name; where the raw name is kept (KAI's
    displayName, Volcano's per-model annotation) YAML reads back exactly that string, and no name adds a
    document or a field."""
    team, model = f"team {evil}", f"H100 {evil}"
    emitted = emitter_for(target).emit(hostile_plan(team, model, f"dept {evil}"))
    documents = list(yaml.safe_load_all(emitted.text))
    assert documents == emitted.objects  # nothing added, nothing lost
    label = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    for obj in documents:
        assert set(obj) <= {"apiVersion", "kind", "metadata", "spec"}
        assert re.match(label, obj["metadata"]["name"]) and len(obj["metadata"]["name"]) <= 63
    if target == "kai":
        displays = {o["spec"]["displayName"] for o in documents}
        assert team in displays and f"{team} {model}" in displays
    if target == "volcano":
        queue = next(o for o in documents if o["metadata"]["name"] == k8s_name(team))
        assert json.loads(queue["metadata"]["annotations"]["gpuledger.io/guarantee-per-model"]) == {model: 2}


@pytest.mark.parametrize("target", ["kai", "kueue", "volcano"])
def test_two_names_that_fold_to_one_kubernetes_name_are_refused(target):
    """`Vision` beside `vision` (or `vision.` from a crafted name) must not overwrite the other's queue."""
    plan = QuotaPlan(teams=[TeamPlan("vision", 30, None, {"H100": 2}, {"H100": 8}),
                            TeamPlan("Vision!", 1, None, {"H100": 8}, {"H100": 8})],
                     capacity={"H100": 8.0}, made=T0)
    with pytest.raises(InputError, match="both become the Kubernetes name 'vision'"):
        emitter_for(target).emit(plan)


# --- the config: names held to the identifier rule, numbers finite -------------------------------------------
@pytest.mark.parametrize("text, message", [
    ("[rates]\nH100 = nan\n", r"\[rates\] H100 must be a number >= 0, got nan"),
    ("[rates]\nH100 = inf\n", r"\[rates\] H100 must be a number >= 0, got inf"),
    ("[rates]\nH100 = -inf\n", r"\[rates\] H100 must be a number"),
    ("[rates]\nH100 = -0.5\n", r"\[rates\] H100 must be a number >= 0"),
    ("[teams.nlp]\nshare = nan\n", r"\[teams.nlp\] share must be a number"),
    ("[teams.nlp]\nquota_gpus = inf\n", r"\[teams.nlp\] quota_gpus must be a number"),
    ("[teams.nlp.guarantee]\nH100 = nan\n", r"\[teams.nlp.guarantee\] H100 must be a number"),
    ("[waste]\nidle_minutes = inf\n", r"\[waste\] idle_minutes must be a number"),
    ("[rates]\n\"H100$(touch pwned)\" = 1.0\n", r"\[rates\]: 'H100\$\(touch pwned\)' is not a valid GPU model name"),
    ("[rates]\n\"=HYPERLINK(1)\" = 1.0\n", r"\[rates\].*not a valid GPU model name"),
    ("[teams.\"nlp;rm -rf /\"]\nshare = 1\n", r"\[teams\]: 'nlp;rm -rf /' is not a valid team name"),
    ("[teams.\"<script>\"]\nshare = 1\n", r"\[teams\].*not a valid team name"),
    ("[teams.\"[x](http://evil.example)\"]\nshare = 1\n", r"not a valid team name"),
    ("[teams.nlp]\nshare = 1\nparent = \"ml`id`\"\n", r"\[teams.nlp\] parent: 'ml`id`' is not a valid department"),
    ("[teams.nlp]\nshare = 1\nparent = \"ml\\nx\"\n", r"not a valid department name"),
    ("[teams.nlp.limit]\n\"H100 $(id)\" = 4\n", r"\[teams.nlp.limit\].*not a valid GPU model name"),
    ("[attribution]\nnamespace_to_team = { \"cv prod\" = \"vision\" }\n", r"not a valid namespace"),
    ("[attribution]\nnamespace_to_team = { cv = \"vision\\\"'\" }\n", r"\[attribution.namespace_to_team\] cv:"),
    ("[attribution]\nuser_to_team = { \"@alice\" = \"vision\" }\n", r"not a valid user name"),
    ("[attribution]\nuser_to_team = { alice = \"=cmd|' /C calc'!A0\" }\n", r"not a valid team name"),
    ("[placement]\nlatency_sensitive = [\"inference\", \"x|y\"]\n", r"\[placement\] latency_sensitive"),
    ("[report.email]\nhost = \"smtp\"\n[report.email.teams]\n\"a b\" = [\"x@y.z\"]\n", r"not a valid team name"),
])
def test_the_config_refuses_hostile_names_and_non_finite_numbers(tmp_path, text, message):
    path = tmp_path / "gpuledger.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as raised:
        load_config(path)
    assert type(raised.value) is ConfigError and "\n" not in str(raised.value)  # one line for the CLI


def test_the_config_keeps_names_that_are_valid(tmp_path):
    path = tmp_path / "gpuledger.toml"
    path.write_text("[rates]\n\"RTX 6000 Ada\" = 1.5\n\"A100-80GB\" = 3.0\n"
                    "[teams.nlp_2]\nshare = 1\nparent = \"ml.org\"\n[teams.nlp_2.guarantee]\nH100 = 2\n"
                    "[attribution]\nnamespace_to_team = { \"cv-prod\" = \"nlp_2\" }\n"
                    "user_to_team = { \"alice@example.org\" = \"nlp_2\" }\n")
    config = load_config(path)
    assert config.rates["RTX 6000 Ada"] == 1.5 and config.teams["nlp_2"].parent == "ml.org"
    assert config.user_to_team == {"alice@example.org": "nlp_2"}


def test_a_nan_rate_is_one_line_from_the_cli_not_a_traceback(tmp_path):
    path = tmp_path / "gpuledger.toml"
    path.write_text("[rates]\nH100 = nan\n")
    done = subprocess.run([GPULEDGER, "report", "--config", str(path), "--db", str(tmp_path / "x.duckdb"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "H100 must be a number" in done.stderr


# --- a store whose telemetry carries hostile names, and advice that names other teams' jobs ---------------------
XSS_TEAM = "<script>alert(1)</script>"
XSS_JOB = '"><img src=x onerror=alert(1)>'
XSS_MODEL = "<b onmouseover=alert(1)>H100</b>"
FORMULA_TEAM = '=HYPERLINK("http://evil.example","invoice")'
FORMULA_JOB = "@SUM(1+1)*cmd|' /C calc'!A0"
SECRET_JOBS = ("vision/secret-training-run", "vision/secret-small")
SECRET_USER = "victor-secret"


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    """Twenty minutes ending now: on node f an inference job shares GPU 0 with vision's secret run; on node c
    vision's small secret job holds GPU 1 while a 2-GPU inference job waits (consolidation moves vision's job);
    on h1 and h2 jobs of teams whose names are HTML and a spreadsheet formula."""
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    start = now - timedelta(minutes=25)
    rows = []
    for job, team, user in (("inference/chat", "inference", "ina"), (SECRET_JOBS[0], "vision", SECRET_USER)):
        rows += [dict(r, gpu_fraction=0.5, pod=job, user=user) for r in
                 gpu_rows("f", 0, "H100", 20, start=start, util=60.0, job=job, team=team)]
    rows += gpu_rows("f", 1, "H100", 20, start=start)
    rows += gpu_rows("c", 0, "H100", 20, start=start)
    rows += [dict(r, user=SECRET_USER) for r in
             gpu_rows("c", 1, "H100", 20, start=start, util=70.0, job=SECRET_JOBS[1], team="vision")]
    rows += [dict(r, user=XSS_JOB) for r in
             gpu_rows("h1", 0, XSS_MODEL, 20, start=start, util=50.0, job=XSS_JOB, team=XSS_TEAM)]
    rows += gpu_rows("h2", 0, "H100", 20, start=start, util=40.0, job=FORMULA_JOB, team=FORMULA_TEAM)
    store = Store(tmp_path_factory.mktemp("hostile") / "hostile.duckdb")
    store.append_samples(table(rows))
    store.upsert_jobs(pd.DataFrame([{"job_id": "inference/gang", "team": "inference", "user": "ina",
                                     "namespace": "inference", "pod": None, "node": None, "gpu_model": "H100",
                                     "gpus": 2, "submit_ts": now - timedelta(minutes=30), "start_ts": None,
                                     "end_ts": None, "state": "pending"}]))
    yield store, start, now
    store.close()


def strings(value: object) -> list[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [str(k), *strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return [value] if isinstance(value, str) else []


def advice(store, now) -> list[dict]:
    return [r.to_dict() for r in evaluate(store, Config(), now).placement]


def test_placement_advice_shown_to_a_team_names_no_other_teams_job(hostile_store):
    store, _, now = hostile_store
    recs = [r for r in advice(store, now) if r["team"] == "inference"]
    assert {r["kind"] for r in recs} >= {"separate", "consolidate"}
    # the admin's view names them: the scenario is real
    assert any(job in s for r in recs for s in strings(r) for job in SECRET_JOBS)
    for rec in recs:
        shown = for_team(Recommendation.from_row({**rec, "action": json.dumps(rec["action"]),
                                                  "evidence": json.dumps(rec["evidence"])}), "inference").to_dict()
        assert not [s for s in strings(shown) if "secret" in s or SECRET_USER in s], shown
        assert shown["id"] == rec["id"] and shown["job_id"] == rec["job_id"] and shown["team"] == "inference"
        if rec["kind"] == "separate":
            assert shown["evidence"]["shares_gpu_with"] == [ANOTHER_TEAMS_JOB]
            assert f"with {ANOTHER_TEAMS_JOB};" in shown["reason"] and "inference/chat" in shown["reason"]
        if rec["kind"] == "consolidate":
            assert [m["job_id"] for m in shown["action"]["move"]] == [ANOTHER_TEAMS_JOB]
            assert shown["evidence"]["job_teams"] == {"inference/gang": "inference"}


def test_a_team_never_sees_its_own_job_redacted():
    rec = {"kind": "separate", "team": "inference", "job_id": "inference/a", "action": {},
           "evidence": {"shares_gpu_with": ["inference/b", "vision/x", "old-unknown"],
                        "job_teams": {"inference/a": "inference", "inference/b": "inference", "vision/x": "vision"}},
           "reason": "inference/a shares with inference/b, vision/x, old-unknown; vision/x.1 too"}
    shown = redact_for_team(rec, "inference")
    # a job the advice does not record as the team's own (advice stored before job_teams) counts as another's
    assert shown["evidence"]["shares_gpu_with"] == ["inference/b", "another team's job", "another team's job"]
    assert shown["reason"] == ("inference/a shares with inference/b, another team's job, another team's job; "
                               "another team's job.1 too")
    assert shown["evidence"]["job_teams"] == {"inference/a": "inference", "inference/b": "inference"}


def test_a_team_token_reads_recommendations_without_other_teams_jobs_or_users(hostile_store):
    store, _, _ = hostile_store
    boot = "bootstrap-admin-t0ken-hostile"
    server = ApiServer(store, Config(), port=0, token=boot)
    url = server.start()
    try:
        def get(path: str, token: str) -> object:
            answer = requests.get(f"{url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=120)
            assert answer.ok, answer.text
            return answer.json()
        made = requests.post(f"{url}/v1/tokens", json={"name": "lead", "role": "team:inference"}, timeout=60,
                             headers={"Authorization": f"Bearer {boot}"})
        assert made.status_code == 201, made.text
        team_token = made.json()["token"]
        admin = get("/v1/recommendations", boot)["recommendations"]  # evaluates and stores the advice
        assert any(job in s for s in strings(admin) for job in SECRET_JOBS)
        for path in ("/v1/recommendations", "/v1/recommendations?kind=separate", "/v1/recommendations/history"):
            seen = get(path, team_token)
            recs = seen["recommendations"] if isinstance(seen, dict) else seen
            assert {r["team"] for r in recs} == {"inference"}
            assert {"separate", "consolidate"} <= {r["kind"] for r in recs} or "kind=" in path
            leaked = [s for s in strings(seen) if "secret" in s or SECRET_USER in s or "vision" in s]
            assert not leaked, (path, leaked)
    finally:
        server.stop()


def test_a_teams_weekly_page_names_no_other_teams_job_and_escapes_every_name(hostile_store, tmp_path):
    store, start, now = hostile_store
    files = write_weekly_report(store, Config(), tmp_path, start - timedelta(hours=1), now + timedelta(hours=1),
                                "hostile", recommendations=advice(store, now))
    inference = files.team_pages["inference"].read_text()
    assert "shares GPU" in inference and "another team&#x27;s job" in inference  # its advice is there
    assert "secret" not in inference and SECRET_USER not in inference and "vision" not in inference
    admin = files.html.read_text()
    assert SECRET_JOBS[0] in admin  # the admin's page keeps the names
    # HTML: every name from telemetry is text, never markup
    pages = [admin, *(p.read_text() for p in files.team_pages.values())]
    for page in pages:
        tags = _tags(page)
        assert not {t for t, _ in tags} & {"script", "img", "b"}, "a name became markup"
        assert not [a for _, attrs in tags for a in attrs if a.startswith("on") or a == "src"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in admin and "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in \
        files.team_pages[XSS_TEAM].read_text()
    # CSV: no text cell a spreadsheet would run, numbers still numbers
    csvs = [files.summary_csv, *files.team_csvs.values()]
    cells = [cell for path in csvs for row in csv.reader(path.open()) for cell in row]
    assert f"'{FORMULA_TEAM}" in cells and FORMULA_TEAM not in cells
    text_cells = [c for c in cells if c and not _is_number(c)]
    assert not [c for c in text_cells if c[0] in "=+-@\t\r"], text_cells
    summary = list(csv.DictReader(files.summary_csv.open()))
    assert all(_is_number(r["cost_usd"]) for r in summary)


def _tags(page: str) -> list[tuple[str, list[str]]]:
    """Every start tag of an HTML page with its attribute names, as a browser's tokenizer sees them."""
    found: list[tuple[str, list[str]]] = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            found.append((tag, [name for name, _ in attrs]))

    parser = Tags()
    parser.feed(page)
    parser.close()
    return found


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("value, written", [
    ("=1+1", "'=1+1"), ("+1", "'+1"), ("-1+cmd", "'-1+cmd"), ("@SUM(A1)", "'@SUM(A1)"), ("\tx", "'\tx"),
    ("\rx", "'\rx"), ("nlp", "nlp"), ("", ""), (-3.5, -3.5), (-2, -2), (None, None)])
def test_csv_cells_that_a_spreadsheet_would_run_are_quoted(value, written):
    assert csv_cell(value) == written


def test_write_csv_keeps_negative_numbers_numbers(tmp_path):
    path = tmp_path / "x.csv"
    write_csv(pd.DataFrame({"team": ["=evil()", "-nlp"], "cost_change": [-0.25, 0.5], "n": [-3, 4]}), path)
    rows = list(csv.DictReader(path.open()))
    assert [r["team"] for r in rows] == ["'=evil()", "'-nlp"]
    assert [r["cost_change"] for r in rows] == ["-0.25", "0.5"] and [r["n"] for r in rows] == ["-3", "4"]


# --- the dashboard: names from the API are text in Streamlit's Markdown ----------------------------------------
PHISH = "[Sign in again](http://evil.example)"
PIXEL = "![x](http://evil.example/x.png)"
MARKDOWN_HOSTILE = [PHISH, PIXEL, "<img src=x onerror=alert(1)>", "**bold** _it_ ~~gone~~ `code`", "# Heading",
                    "- item\n- item", "1. one", "> quote", "$x^2$", ":red[alarm] :material/warning: :smile:",
                    "a | b\n--|--\n1 | 2", "&lt;b&gt;", "back\\slash\\[", "line\nbreak\r\nand\rmore", "+ plus",
                    "<http://evil.example>", "http://evil.example", "{curly}", "x\u2028y", "www.evil.example",
                    "mailto:x@evil.example", "bob@evil.example", "HTTPS://EVIL.EXAMPLE", "12:30"]


@pytest.mark.parametrize("value", MARKDOWN_HOSTILE)
def test_md_makes_markdown_show_the_name_literally(value):
    """Rendered by a CommonMark renderer (what Streamlit's react-markdown follows), the escaped name is one
    paragraph of exactly its text: no link, image, emphasis, heading, list, table, code or HTML."""
    markdown_it = pytest.importorskip("markdown_it")

    shown = md(value)
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").enable("strikethrough").render(shown)
    literal = value.replace("\r\n", " ").replace("\r", " ").replace("\n", " ").replace("\u2028", " ")
    assert rendered.replace(JOINER, "") == f"<p>{html.escape(literal, quote=False)}</p>\n"
    # GFM autolink literals (mdast-util-gfm-autolink-literal's pattern for URLs) find no site in the text shown
    assert not re.search(r"(?i)(https?://|www(?=\.))[-.\w]+", html.unescape(rendered)), rendered
    assert "\n" not in shown and "\r" not in shown


@pytest.fixture(scope="module")
def markdown_store(tmp_path_factory):
    """Forty idle minutes up to now of a job named like a phishing link on a node named like a tracking pixel,
    so the reclaim advice's reason holds both."""
    start = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=41)
    store = Store(tmp_path_factory.mktemp("markdown") / "markdown.duckdb")
    store.append_samples(table(gpu_rows(PIXEL, 0, "H100", 40, start=start, job=PHISH, team="nlp"),
                               gpu_rows("b", 0, "H100", 40, start=start, util=80.0, job="nlp/ok", team="nlp")))
    yield store
    store.close()


def test_the_dashboard_shows_hostile_names_escaped_in_labels_and_markdown(monkeypatch, markdown_store):
    server = ApiServer(markdown_store, Config(), port=0, token="t0k-markdown", open_reads=True)
    url = server.start()
    try:
        monkeypatch.setenv("GPULEDGER_API", url)
        st.cache_data.clear()
        at = AppTest.from_file(str(APP), default_timeout=120)
        at.run()
        seen: list[str] = []
        for page in ("Recommendations", "Teams"):
            at.session_state["page"] = page
            at.run()
            assert not at.exception, [e.value for e in at.exception]
            if page == "Recommendations":
                labels = [e.label for e in at.expander]
                reclaim = [label for label in labels if label.startswith("reclaim:")]
                assert reclaim, labels
                assert md(PHISH) in reclaim[0] and md(PIXEL) in reclaim[0]
                assert r"\[Sign in again\]\(http\://evil\.example\)" in reclaim[0].replace(JOINER, "")
                seen += labels
            seen += [m.value for m in at.markdown] + [c.value for c in at.caption]
            seen += [e.value for kind in (at.info, at.warning, at.error, at.success) for e in kind]
        teams_recs = [m.value for m in at.markdown if m.value.startswith("- reclaim")]
        assert teams_recs and md(PHISH) in teams_recs[0]
        # nowhere does Markdown get the raw name (an escaped one never holds "](" unescaped)
        assert not [s for s in seen if "](" in s.replace("\\](", "").replace("\\]\\(", "")], seen
    finally:
        server.stop()


def test_users_named_in_advice_are_redacted_unless_recorded_as_the_teams_own():
    rec = {"kind": "reclaim", "team": "nlp", "job_id": "nlp/1", "action": {"users": ["ann", "victor"]},
           "evidence": {"user": "victor", "user_teams": {"ann": "nlp", "victor": "vision"}},
           "reason": "nlp/1 idles; ann asked victor"}
    shown = redact_for_team(rec, "nlp")
    assert shown["action"]["users"] == ["ann", "another team's user"]
    assert shown["evidence"] == {"user": "another team's user", "user_teams": {"ann": "nlp"}}
    assert shown["reason"] == "nlp/1 idles; ann asked another team's user"
    assert redact_for_team(rec, "vision")["team"] == "another team"  # shown to a team it is not for: nothing named
    assert "nlp/1" not in str(redact_for_team(rec, "vision")) and "ann" not in str(redact_for_team(rec, "vision"))


@needs_chromium
def test_a_real_browser_shows_hostile_names_as_text_not_links_or_images(markdown_store):
    """What Streamlit's frontend makes of the escaped names: the expander's label and the team's advice read
    exactly the name, and the page holds no link to, nor image from, the attacker's host."""
    from tests.test_dashboard import advice_page
    with advice_page(markdown_store, Config(), "t0k-browser-md") as page:
        label = page.get_by_test_id("stExpander").first.locator("summary").inner_text().replace(JOINER, "")
        assert PHISH in label and PIXEL in label, label
        page.get_by_role("tab", name="Teams").click()
        page.get_by_text("Cost by GPU model").first.wait_for(state="visible", timeout=60_000)
        advice = page.get_by_text(re.compile(r"^reclaim: ")).first.inner_text().replace(JOINER, "")
        assert PHISH in advice and PIXEL in advice, advice
        found = page.locator("a[href*='evil.example'], img[src*='evil.example']")
        assert found.count() == 0, [found.nth(k).evaluate("e => e.parentElement.outerHTML")
                                    for k in range(found.count())]
