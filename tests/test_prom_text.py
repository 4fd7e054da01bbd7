"""Our exposition parser must agree with prometheus_client's on valid pages and skip-and-count bad lines."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.collector.dcgm_render import render_page
from gpuledger.collector.prom_text import LabelError, PromTextParser, parse, parse_labels

PAGE = (Path(__file__).parent / "data" / "dcgm_h100_a100mig_pods.txt").read_text()


def reference(text: str) -> list[tuple[str, dict, float]]:
    """prometheus_client's samples, with the `_total` it appends to counters that lack it taken back off."""
    raw_names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name[:-6] if s.name.endswith("_total") and s.name not in raw_names else s.name
            out.append((name, dict(s.labels), s.value))
    return out


def ours(text: str) -> list[tuple[str, dict, float]]:
    return [(name, dict(labels), value) for name, labels, value, _ in parse(text).samples]


def test_agrees_with_prometheus_client_on_realistic_mig_pod_page():
    result = parse(PAGE)
    assert not result.errors
    assert sorted(ours(PAGE), key=repr) == sorted(reference(PAGE), key=repr)
    escaped = [labels["pod"] for _, labels, _ in ours(PAGE) if labels.get("namespace") == "default"]
    assert escaped and escaped[0] == 'debug-shell "bob"'


def test_agrees_with_prometheus_client_on_simulated_cluster_page(simulator):
    page = render_page(simulator.frame([simulator.start.timestamp() + 86400], 30.0))
    assert sorted(ours(page), key=repr) == sorted(reference(page), key=repr)


def test_cache_survives_across_scrapes_and_results_stay_equal():
    parser = PromTextParser()
    first = [(n, dict(labels), v) for n, labels, v, _ in parser.parse(PAGE).samples]
    second = [(n, dict(labels), v) for n, labels, v, _ in parser.parse(PAGE).samples]
    assert first == second


def test_bad_lines_are_skipped_and_counted_by_kind_without_losing_good_ones():
    text = "\n".join([
        'good_metric{a="1"} 1',
        'no_value_here{a="1"}',  # malformed
        'bad_value{a="1"} twelve',  # bad value
        'bad_labels{a=1} 3',  # unquoted label value
        '9starts_with_digit 4',  # bad metric name
        'unterminated{a="1" 5',  # no closing brace
        'plain_metric 2 1700000000000',  # with timestamp: fine
        'nan_metric{a="2"} NaN',  # NaN is a valid exposition value: parsed, the converter decides
        '   ',
        'good_metric{a="2"} +Inf',
    ])
    result = parse(text)
    names = [(n, v) for n, _, v, _ in result.samples]
    assert ("good_metric", 1.0) in names and ("plain_metric", 2.0) in names
    assert any(n == "nan_metric" and math.isnan(v) for n, v in names)
    assert ("good_metric", math.inf) in names
    assert result.errors == {"malformed_line": 2, "bad_value": 1, "bad_labels": 1, "bad_name": 1}
    assert len(result.examples) == 5 and "line 2" in result.examples[0]
    assert [ts for n, _, _, ts in result.samples if n == "plain_metric"] == [1700000000000]


def test_label_parser_handles_escapes_spaces_and_trailing_comma():
    assert parse_labels(r'a="x\"y", b = "line\nbreak",c="back\\slash",') == {
        "a": 'x"y', "b": "line\nbreak", "c": "back\\slash"}
    with pytest.raises(LabelError):
        parse_labels('a="unterminated')


def test_label_string_containing_braces_is_parsed():
    result = parse('m{path="/a/{id}/b",x="}"} 7\n')
    assert not result.errors
    assert result.samples[0][1] == {"path": "/a/{id}/b", "x": "}"} and result.samples[0][2] == 7.0


def test_openmetrics_float_second_timestamps_are_read_not_dropped():
    """OpenMetrics writes float seconds where Prometheus' text format writes integer milliseconds: both are one
    instant, and neither sample is lost as a bad value."""
    result = parse("a 1 1700000000123\nb 2 1700000000.123\nc 3 1000\nd 4 NaN_time\n")
    stamps = {name: ts for name, _, _, ts in result.samples}
    assert stamps == {"a": 1700000000123, "b": 1700000000123, "c": 1000}  # integers: milliseconds
    assert result.errors["bad_value"] == 1
    openmetrics = parse("a_total 1 1700000000\nb 2 1700000000.5\n# EOF\n")
    assert [ts for *_, ts in openmetrics.samples] == [1700000000000, 1700000000500]  # seconds
