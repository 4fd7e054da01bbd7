"""A fast parser for the Prometheus text exposition format, tuned for dcgm-exporter pages.

prometheus_client's parser walks every character in Python. dcgm-exporter repeats the same
label set on every metric of a GPU, so parsing each distinct label string once and caching
the result turns most lines into a couple of str.find calls and a float(). Bad lines are
skipped and counted by kind; they never abort the page, so one garbage line cannot lose the
rest of a node's samples.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

from gpuledger.collector.errors import InputError

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|\Z)')
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}
_EMPTY: Mapping[str, str] = {}
MAX_EXAMPLES = 5
# the longest line read: past it a line is skipped and counted (`line_too_long`) before any regex or copy of its
# labels. Real lines are short (dcgm-exporter's ~400 characters; kube-state-metrics' kube_pod_labels with dozens of
# labels a few KiB); one 16 MiB label took the server to 3 GB on every read (the label regex and the label cache).
MAX_LINE_CHARS = 64 * 1024


class LabelError(InputError):
    """A `{...}` that is not key="value" pairs: the line is skipped and counted, never the page refused."""


def parse_labels(text: str) -> dict[str, str]:
    """Parse the inside of `{...}`; raises LabelError on anything that is not key="value" pairs."""
    labels: dict[str, str] = {}
    pos, end = 0, len(text)
    while pos < end:
        if text[pos:].strip() == "":
            break
        match = _LABEL_PAIR.match(text, pos)
        if not match:
            raise LabelError(f"cannot parse labels at offset {pos}: {text[pos:pos + 40]!r}")
        value = match.group(2)
        if "\\" in value:
            value = _UNESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value)
        labels[match.group(1)] = value
        pos = match.end()
    return labels


@dataclass
class ParseResult:
    """Samples as (name, labels, value, timestamp_ms|None). Label dicts are shared: do not mutate them."""

    samples: list[tuple[str, Mapping[str, str], float, int | None]]
    errors: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def skipped(self) -> Counter:
        """The bad lines counted per kind as `page_<kind>`: how a reader of the page starts its own skip count."""
        return Counter({f"page_{kind}": n for kind, n in self.errors.items()})

    def reject(self, kind: str, lineno: int, line: str) -> None:
        self.errors[kind] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"line {lineno}: {kind}: {line[:120]!r}")


class PromTextParser:
    """Stateful so the label cache survives across scrapes of the same exporter."""

    def __init__(self, max_cached_label_sets: int = 200_000) -> None:
        self._labels: dict[str, Mapping[str, str]] = {}
        self._names: set[str] = set()
        self._max = max_cached_label_sets

    def parse(self, text: str) -> ParseResult:
        result = ParseResult(samples=[])
        samples = result.samples
        append = samples.append
        cache = self._labels
        names = self._names
        if len(cache) > self._max:
            cache.clear()
        seconds = text.rstrip().endswith("# EOF")  # OpenMetrics: timestamps in seconds
        for lineno, line in enumerate(text.split("\n"), 1):
            if not line or line[0] == "#":
                continue
            if len(line) > MAX_LINE_CHARS:
                result.reject("line_too_long", lineno, line)
                continue
            brace = line.find("{")
            if brace >= 0:
                close = line.rfind("}")
                if close < brace:
                    result.reject("malformed_line", lineno, line)
                    continue
                name = line[:brace]
                raw = line[brace + 1 : close]
                labels = cache.get(raw)
                if labels is None:
                    try:
                        labels = parse_labels(raw)
                    except LabelError:
                        result.reject("bad_labels", lineno, line)
                        continue
                    cache[raw] = labels
                rest = line[close + 1 :].split()
            else:
                parts = line.split()
                if not parts[0:1] or line[0].isspace():
                    if line.strip():
                        result.reject("malformed_line", lineno, line)
                    continue
                name, labels, rest = parts[0], _EMPTY, parts[1:]
            if name not in names:
                if not _NAME.match(name):
                    result.reject("bad_name", lineno, line)
                    continue
                names.add(name)
            if not rest or len(rest) > 2:
                result.reject("malformed_line", lineno, line)
                continue
            try:
                value = float(rest[0])
                ts = _timestamp_ms(rest[1], seconds) if len(rest) == 2 else None
            except ValueError:
                result.reject("bad_value", lineno, line)
                continue
            append((name, labels, value, ts))
        return result


def _timestamp_ms(text: str, seconds: bool) -> int:
    """A sample's timestamp in milliseconds. Prometheus' text format writes integer milliseconds; OpenMetrics
    (`seconds`: the page ends with `# EOF`) writes seconds, integer or float (`1700000000.123`); a decimal timestamp
    is seconds on any page. Each is read, not dropped with its sample."""
    if text.isdigit() or (text[:1] == "-" and text[1:].isdigit()):
        return int(text) * 1000 if seconds else int(text)
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"timestamp {text!r}")
    return round(value * 1000)


def parse(text: str) -> ParseResult:
    """One-shot parse without a persistent cache."""
    return PromTextParser().parse(text)
