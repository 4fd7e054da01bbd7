"""Property-based tests of what hostile or broken input can reach: the Prometheus text parser (against
prometheus_client's), the wire decoder behind the real ingest endpoint, the config loader, and the whole API from its
own OpenAPI spec (Schemathesis) with the tokens of each role. Examples are bounded so CI stays short."""
from __future__ import annotations

import itertools
import math
import os
import string
from pathlib import Path

import pyarrow as pa
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import GenerationMode

from gpuledger.analytics.config import ConfigError, load_config
from gpuledger.analytics.store import Store
from gpuledger.collector.prom_text import parse
from gpuledger.collector.samples import SAMPLE_SCHEMA
from gpuledger.collector.wire import encode
from gpuledger.deploy.api.ingest import MAX_BATCH_BYTES
from gpuledger.deploy.server import ApiServer
from tests.conftest import SITE, fill_store
from tests.ingest_helpers import batch, post
from tests.procs import TOKEN

STREAMS = itertools.count()  # a fresh stream per example: a batch id seen before is acknowledged as a duplicate
BOUNDED = settings(max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", 60)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                          HealthCheck.too_slow])

# --- the Prometheus text parser --------------------------------------------------------------------------------
names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,30}", fullmatch=True)
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,20}", fullmatch=True).filter(lambda n: not n.startswith("__"))
label_values = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**12, 10**12))


def escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def rendered(value: float | int) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


@st.composite
def pages(draw: st.DrawFn) -> tuple[str, list[tuple[str, dict[str, str], float, int | None]]]:
    """A valid exposition page (one family per name, as the format requires) and the samples it holds."""
    lines, expected = [], []
    for name in draw(st.lists(names, min_size=1, max_size=6, unique=True)):
        lines.append(f"# HELP {name} generated")
        seen = set()
        for _ in range(draw(st.integers(1, 4))):
            labels = draw(st.dictionaries(label_names, label_values, max_size=4))
            key = tuple(sorted(labels.items()))
            if key in seen:
                continue
            seen.add(key)
            value = draw(values)
            ts = draw(st.one_of(st.none(), st.integers(0, 2**41)))
            inside = ",".join(f'{k}="{escaped(v)}"' for k, v in labels.items())
            text = f"{name}{{{inside}}}" if labels or draw(st.booleans()) else name
            lines.append(f"{text} {rendered(value)}" + (f" {ts}" if ts is not None else ""))
            expected.append((name, labels, float(value), ts))
    return "\n".join(lines) + "\n", expected


def same_value(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@BOUNDED
@given(pages())
def test_the_parser_reads_valid_pages_as_prometheus_client_does(page):
    text, expected = page
    ours = parse(text)
    assert not ours.errors, ours.examples
    theirs = [(s.name, s.labels, s.value, s.timestamp)
              for family in text_string_to_metric_families(text) for s in family.samples]
    assert len(ours.samples) == len(theirs) == len(expected)
    for (name, labels, value, ts), (t_name, t_labels, t_value, t_ts), want in zip(ours.samples, theirs, expected):
        assert (name, dict(labels)) == (t_name, t_labels) == (want[0], want[1])
        assert same_value(value, t_value) and same_value(value, want[2])
        assert ts == want[3] and (t_ts is None if ts is None else float(t_ts) == pytest.approx(ts / 1000))


@BOUNDED
@given(st.text(max_size=400), st.integers(0, 400))
def test_the_parser_never_crashes_and_accounts_for_every_line(garbage, cut):
    for text in (garbage, garbage[:cut] + "\n" + garbage[cut:]):
        result = parse(text)
        meant = [ln for ln in text.split("\n") if ln and ln[0] != "#" and ln.strip()]
        assert len(result.samples) + sum(result.errors.values()) == len(meant)


@BOUNDED
@given(pages(), st.data())
def test_a_damaged_page_keeps_its_undamaged_lines(page, data):
    text, expected = page
    lines = text.split("\n")
    hit = data.draw(st.integers(0, len(lines) - 1))
    junk = data.draw(st.sampled_from(['{', '} 1', 'x{a="1" 2', '1 2 3 4', 'm{a=1} 2', 'm NaNx', 'm{a="\\"} 1']))
    lines.insert(hit, junk)
    result = parse("\n".join(lines))
    assert len(result.samples) == len(expected) and sum(result.errors.values()) == 1


# --- the wire decoder, behind the real ingest endpoint ---------------------------------------------------------
@pytest.fixture(scope="module")
def ingest_server(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("wire") / "wire.duckdb")
    server = ApiServer(store, SITE, port=0, token=TOKEN)
    url = server.start()
    yield url, store
    server.stop()
    store.close()


def stored(store: Store) -> int:
    return store.scalar("SELECT count(*) FROM samples")


@BOUNDED
@given(st.data())
def test_broken_bodies_are_refused_with_a_reason_and_store_nothing(ingest_server, data):
    url, store = ingest_server
    good = encode(batch())
    body = data.draw(st.one_of(
        st.binary(max_size=2048),
        st.integers(0, len(good) - 1).map(lambda n: good[:n]),
        st.tuples(st.integers(8, len(good) - 1), st.binary(min_size=1, max_size=8)).map(
            lambda cut: good[:cut[0]] + cut[1] + good[cut[0] + len(cut[1]):]),
    ), label="body")
    assume(body != good)
    before = stored(store)
    answer = post(url, body, seq=data.draw(st.integers(0, 10**6)), node="fuzz-node")
    if answer.status_code == 200:  # a cut at a message boundary is a shorter, valid stream: only rows it holds
        assert stored(store) - before <= batch().num_rows
        return
    assert answer.status_code == 422 and answer.json()["detail"], answer.text
    assert stored(store) == before


@BOUNDED
@given(st.data())
def test_batches_of_the_wrong_shape_are_refused_and_store_nothing(ingest_server, data):
    url, store = ingest_server
    table = batch()
    how = data.draw(st.sampled_from(["drop", "text", "struct"]))
    required = ("gpu_uuid", "ts", "gpu_util", "mem_used_mib", "gpu_fraction", "interval_s")  # (node: the header's)
    column = data.draw(st.sampled_from([f.name for f in SAMPLE_SCHEMA if f.name in required
                                        and not (how == "text" and pa.types.is_string(f.type))]))
    index = table.schema.get_field_index(column)
    if how == "drop":
        table = table.remove_column(index)
    elif how == "text":
        junk = "x" + data.draw(st.text(string.ascii_letters, max_size=5))  # never a number ("inf" would be)
        table = table.set_column(index, column, pa.array([junk] * table.num_rows))
    else:
        table = table.set_column(index, column, pa.array([{"x": 1}] * table.num_rows))
    before = stored(store)
    answer = post(url, table, seq=0, node="fuzz-node", stream=f"shape{next(STREAMS)}")  # a batch id never seen
    assert answer.status_code == 422 and column in answer.json()["detail"], (column, how, answer.text)
    assert stored(store) == before


def test_an_oversized_body_is_refused(ingest_server):
    url, store = ingest_server
    before = stored(store)
    answer = post(url, b"\0" * (MAX_BATCH_BYTES + 1), seq=1, node="fuzz-node")
    assert answer.status_code == 413 and "bytes" in answer.json()["detail"]
    assert stored(store) == before


# --- the config loader -----------------------------------------------------------------------------------------
keys = st.sampled_from(["rates", "teams", "waste", "quota", "fairshare", "retention", "attribution", "placement",
                        "report", "share", "quota_gpus", "idle_minutes", "idle_util_pct", "window_days",
                        "latency_sensitive", "H100", "nlp", "guarantee", "limit", "parent", "algorithm",
                        "half_life_days", "email", "smtp_host", "junk"])
scalars = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.booleans(), st.text(string.ascii_letters + " -_", max_size=10),
                    st.lists(st.text(string.ascii_letters, max_size=5), max_size=3))


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


@st.composite
def toml_documents(draw: st.DrawFn) -> str:
    lines = []
    for section in draw(st.lists(keys, max_size=4, unique=True)):
        sub = draw(st.sampled_from(["", ".nlp", ".nlp.guarantee", ".email"]))
        lines.append(f"[{section}{sub}]")
        for key, value in draw(st.dictionaries(keys, scalars, max_size=4)).items():
            lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


@BOUNDED
@given(st.one_of(toml_documents(), st.text(max_size=200)))
def test_the_config_loader_accepts_or_names_the_problem(tmp_path_factory, document):
    path = Path(tmp_path_factory.mktemp("cfg")) / "gpuledger.toml"
    path.write_text(document)
    try:
        load_config(path)
    except ConfigError as exc:
        assert str(exc)  # a ConfigError says what is wrong; anything else (KeyError, TypeError...) fails here


# --- the API from its OpenAPI spec -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory, simulator):
    """A server with reads closed over a small store, and a token per role: (URL, store, role -> token)."""
    store = fill_store(Store(tmp_path_factory.mktemp("fuzz") / "fuzz.duckdb"), simulator, days=0.3, step_s=600)
    server = ApiServer(store, SITE, port=0, token=TOKEN)
    url = server.start()
    tokens = {"anonymous": None}
    for role in ("reader", "team:nlp"):
        made = requests.post(f"{url}/v1/tokens", json={"name": "fuzz", "role": role}, timeout=30,
                             headers={"Authorization": f"Bearer {TOKEN}"}).json()
        tokens[role] = made["token"]
    requests.get(f"{url}/v1/recommendations", timeout=60, headers={"Authorization": f"Bearer {tokens['reader']}"})
    yield url, store, tokens
    server.stop()
    store.close()


def fingerprint(store: Store) -> dict[str, str]:
    """Rows and a hash of every table but the audit log (which records refused writes, as it should), and of the
    tokens without their `last_used` (a read notes that its token was used, as an access review needs)."""
    tables = store.query("SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database() "
                         "AND table_type = 'BASE TABLE' AND table_name <> 'audit_log'")["table_name"]
    rows = {t: f'(SELECT * EXCLUDE (last_used) FROM "{t}")' if t == "api_tokens" else f'"{t}"' for t in tables}
    return {t: store.scalar(f"SELECT count(*) || ':' || coalesce(sum(hash(x))::VARCHAR, '') FROM {rows[t]} x")
            for t in tables}


def test_no_request_breaks_the_server_or_changes_what_it_may_not(fuzzed):
    """Requests Schemathesis makes from the server's own OpenAPI spec, valid and invalid, each sent with no token,
    a reader's and a team's: no 500, every 4xx says why, and none of them changes any data."""
    url, store, tokens = fuzzed
    spec = schemathesis.openapi.from_url(url + "/openapi.json")
    operations = [result.ok() for result in spec.get_all_operations()]
    assert len(operations) >= 25
    before = fingerprint(store)
    seen: dict[str, set[int]] = {}
    for operation in operations:
        cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                          operation.as_strategy(GenerationMode.NEGATIVE))

        @settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(cases)
        def send(case: schemathesis.Case) -> None:
            for role, token in tokens.items():
                response = case.call(base_url=url, timeout=60,
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
                where = f"{case.method} {case.formatted_path} as {role}"
                seen.setdefault(f"{operation.label} as {role}", set()).add(response.status_code)
                assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:500]}"
                if 400 <= response.status_code < 500:
                    assert response.json().get("detail"), f"{where}: a {response.status_code} that says not why"
        send()
    assert fingerprint(store) == before
    assert any(200 in codes for label, codes in seen.items() if label.endswith("as reader"))
    opened = {label: codes for label, codes in seen.items()
              if label.endswith("as anonymous") and "/v1/" in label and "whoami" not in label and codes - {400, 401, 422}}
    assert not opened, f"answered without a token: {opened}"
