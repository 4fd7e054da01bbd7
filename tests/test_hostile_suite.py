"""Generated hostile input through every surface: names from the whole Unicode range and the characters each output
format treats as syntax, numbers from the whole float range, pushed through ingest as one agent and through the
config loader; then every read route of the spec, every export, the weekly report and every dashboard page are
checked.

The invariants (issue 21):
- no route answers 500 and nothing shows a traceback;
- nothing unescaped: every name an output holds is one the identifier rule accepts (so it can hold no shell, YAML,
  HTML, Markdown or formula syntax), the Slurm plan parses as plain sacctmgr commands, the report has no tag or
  handler it did not write;
- bills unchanged for what the sender does not own: the victim node's GPUs cost the same before and after, no bill
  line is negative or not finite, and the attacker's node adds at most its own GPUs for the batch's interval.

Bounded: HYPOTHESIS_EXAMPLES (default 25) examples per property, no deadline; each example is one small batch.
"""
from __future__ import annotations

import html.parser
import math
import os
import re
import shlex
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.analytics.config import Config, ConfigError, load_config
from gpuledger.analytics.cost import cost_by_team
from gpuledger.analytics.report import write_weekly_report
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.ingest_writer import IngestWriter
from gpuledger.analytics.windows import iso_week
from gpuledger.collector.identifiers import is_identifier
from gpuledger.collector.samples import rows_to_table
from gpuledger.collector.simulator import cluster_of
from gpuledger.deploy.api import create_app
from gpuledger.policies.emitters import TARGETS
from gpuledger.policies.exporting import export

NOW = datetime.now(timezone.utc).replace(microsecond=0)
EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", 25))
BOUNDED = settings(max_examples=EXAMPLES, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SYNTAX = "$`;|&<>()[]{}!*#\"'\\\n\t\r=+-@:,/ \u202e\u0000"
NAMES = st.one_of(
    st.text(min_size=0, max_size=40),  # the whole Unicode range, surrogates excluded by hypothesis
    st.text(alphabet=SYNTAX + "abcXYZ019._", min_size=1, max_size=30),
    st.sampled_from(["H100$(touch pwned)", "[Sign in again](http://evil.example)", "=HYPERLINK(\"x\")",
                     "<script>alert(1)</script>", "__idle__", "unattributed", "a\nb", "x" * 300, ""]),
)
NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none(),
                    st.sampled_from([1e6, -1000.0, 1.7e308, -0.0, 5e-324, 1e9, 101.0]))
FIELDS = ("team", "job_id", "user", "namespace", "pod", "container", "gpu_model", "model_name", "mig_profile")
VICTIM, ATTACKER = "node-0000", "node-0001"


def _frame(node: int, at: datetime, nodes: int = 2) -> pa.Table:
    frame = cluster_of(nodes).frame([at.timestamp()], 10.0)
    return frame.filter(pc.equal(frame["node"], f"node-{node:04d}"))


@pytest.fixture(scope="module")
def victim_store(tmp_path_factory):
    """A store holding the victim node's GPUs for ten minutes, pushed honestly; copied per example."""
    path = tmp_path_factory.mktemp("victim") / "base.duckdb"
    with Store(path) as store:
        store.set_rates(Config().rates)
        writer = IngestWriter(store, idle_checkpoint_s=600)
        try:
            for i in range(10):
                writer.submit(VICTIM, "honest", i, 1, 10.0, _frame(0, NOW - timedelta(minutes=10 - i)))
        finally:
            writer.stop()
    return path


def _victim_cost(store: Store) -> float:
    frame = store.query("""SELECT sum(interval_s * gpu_fraction) AS gpu_s FROM samples WHERE node = $node""",
                        {"node": VICTIM})
    return float(frame["gpu_s"].iloc[0] or 0.0)


def read_routes(client: TestClient) -> list[str]:
    """Every GET route of the server's OpenAPI spec with its defaults, a team route once per team the store knows
    (the exports and the backup are checked apart: the exports per target below, the backup is an admin's file)."""
    spec = client.get("/openapi.json").json()
    teams = [t["team"] for t in client.get("/v1/teams").json()]
    routes = []
    for path, operations in spec["paths"].items():
        if "get" not in operations or path in ("/v1/backup", "/v1/recommendations/export"):
            continue
        routes += [path.replace("{team}", t) for t in teams] if "{team}" in path else [path]
    return routes


def _hostile_batch(at: datetime) -> pa.Table:
    """The attacker node's GPUs with every name field set to one of the hostile examples and extreme numbers."""
    hostile = ["H100$(touch pwned)", "[Sign in again](http://evil.example)", "=HYPERLINK(\"x\")",
               "<script>alert(1)</script>", "__idle__", "a\nb", "x" * 300, "\u202eevil", "ok-team"]
    rows = _frame(1, at).to_pylist()
    for i, row in enumerate(rows):
        row.update({f: hostile[(i + k) % len(hostile)] for k, f in enumerate(FIELDS)})
        row.update({"gpu_fraction": [1e6, -1000.0, math.inf, 0.5][i % 4], "util_pct": [250.0, math.nan, 50.0][i % 3],
                    "allocated": True})
    return rows_to_table(rows)


def test_every_dashboard_page_renders_after_a_hostile_push(victim_store, tmp_path, monkeypatch):
    """The same push as above, once with every hostile name at once, then every dashboard page (Streamlit's
    AppTest over a real server): no exception, no error box."""
    from gpuledger.deploy.server import ApiServer
    from tests.test_dashboard import PAGES
    from tests.test_dashboard_live import app_on
    path = tmp_path / "h.duckdb"
    path.write_bytes(victim_store.read_bytes())
    with Store(path) as store:
        writer = IngestWriter(store, idle_checkpoint_s=600)
        try:
            (result,) = writer.submit(ATTACKER, "evil", 0, 1, 10.0, _hostile_batch(NOW - timedelta(seconds=30)))
        finally:
            writer.stop()
        assert sum(result.rejected.values()) > 0  # the screen refused what it must
        server = ApiServer(store, Config(), port=0, open_reads=True)
        url = server.start()
        try:
            for page in PAGES:
                app_on(monkeypatch, url, page)  # asserts no exception and no error on the page
        finally:
            server.stop()


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.bad: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("script", "img", "iframe", "object") or any(k.startswith("on") for k, _ in attrs):
            self.bad.append(tag)


@BOUNDED
@given(names=st.lists(NAMES, min_size=len(FIELDS), max_size=len(FIELDS)),
       numbers=st.lists(NUMBERS, min_size=4, max_size=4), steal=st.booleans())
def test_a_hostile_agent_cannot_break_a_surface_or_another_nodes_bill(victim_store, tmp_path_factory, names,
                                                                      numbers, steal):
    path = tmp_path_factory.mktemp("hostile") / "h.duckdb"
    path.write_bytes(victim_store.read_bytes())
    with Store(path) as store:
        before = _victim_cost(store)
        rows = _frame(1, NOW - timedelta(seconds=30)).to_pylist()
        for i, row in enumerate(rows):
            row.update({f: names[(i + k) % len(names)] or None for k, f in enumerate(FIELDS)})
            row.update(dict(zip(("gpu_fraction", "interval_s", "util_pct", "power_w"), numbers)))
            row["allocated"] = True
            if steal and i == 0:  # claim a GPU the victim node holds
                row["gpu_uuid"] = _frame(0, NOW).column("gpu_uuid")[0].as_py()
        writer = IngestWriter(store, idle_checkpoint_s=600)
        try:
            (result,) = writer.submit(ATTACKER, "evil", 0, 1, 10.0, rows_to_table(rows))
        finally:
            writer.stop()
        # what was stored holds only valid names and bounded numbers
        stored = store.query("SELECT * FROM samples WHERE node = $n", {"n": ATTACKER})
        for field in FIELDS:
            for value in stored[field].dropna():
                assert is_identifier(field if field != "mig_profile" else "mig_profile", value), (field, value)
        assert ((stored["gpu_fraction"] >= 0) & (stored["gpu_fraction"] <= 1)).all()
        assert (stored["interval_s"] <= 21.0).all()
        assert _victim_cost(store) == pytest.approx(before), "the victim node's GPU-seconds changed"
        store.fold()
        lines = cost_by_team(store, NOW - timedelta(days=1), NOW + timedelta(minutes=5))
        assert lines["cost_usd"].map(math.isfinite).all() and (lines["cost_usd"] >= 0).all()
        assert float(stored.eval("interval_s * gpu_fraction").sum()) <= 8 * 21.0 + 1e-6  # its own 8 GPUs at most
        with TestClient(create_app(store, Config(), open_reads=True), raise_server_exceptions=False) as client:
            for route in read_routes(client):
                answer = client.get(route)
                assert answer.status_code < 500, (route, answer.text[:300])
                assert "Traceback" not in answer.text
        for target in TARGETS:
            text = export(store, Config(), target, status="open").native
            if target == "slurm":
                for line in text.splitlines():
                    if line and not line.startswith("#"):
                        words = shlex.split(line)  # parses: every value is one quoted word
                        assert words[:2] == ["sacctmgr", "-i"], line
                        assert not re.search(r"[`$;|&<>]", line.replace("'", "")) or "'" in line, line
        start, end, label = iso_week("current")
        files = write_weekly_report(store, Config(), tmp_path_factory.mktemp("report"), start, end, label, [])
        for page in [Path(files.html), *map(Path, files.team_pages.values())]:
            tags = _Tags()
            tags.feed(page.read_text())
            assert not tags.bad, (page.name, tags.bad)
        assert result.rows + sum(result.rejected.values()) <= len(rows)


@BOUNDED
@given(team=NAMES, model=NAMES, rate=NUMBERS)
def test_the_config_loader_takes_only_valid_names_and_finite_numbers(tmp_path_factory, team, model, rate):
    path = tmp_path_factory.mktemp("cfg") / "c.toml"
    quoted = lambda s: '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'  # noqa: E731 - a TOML basic string
    try:
        number = repr(rate) if rate is not None and math.isfinite(rate) else ("nan" if rate is None else
                                                                             ("inf" if rate > 0 else "-inf"))
        path.write_text(f"[rates]\n{quoted(model)} = {number}\n\n[teams.{quoted(team)}]\nshare = 1\n")
    except (UnicodeEncodeError, ValueError):
        return  # a name no file can hold (a lone surrogate): nothing to load
    try:
        config = load_config(path)
    except ConfigError:
        return  # refused, naming the problem: the one exception the loader may raise
    assert all(is_identifier("team", t) for t in config.teams)
    assert all(is_identifier("model_name", m) and math.isfinite(r) and r >= 0 for m, r in config.rates.items())
