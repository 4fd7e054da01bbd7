"""A /metrics page as metric families: which series belong to which family, of which type, with which parts.

The sample lines are parsed by the fast PromTextParser (collector/prom_text.py), which skips every `#` line; the
`# TYPE` and `# HELP` lines are read here in a pass of their own over the whole page first, so that:
- a family's type comes from its TYPE line, never from its name's suffix (`vllm:iteration_tokens_total` is a
  histogram, `Device_memory_desc_of_container` is typed a counter and `X_created` is typed a gauge);
- a sample may come before its TYPE line, and a TYPE line may have no samples (both happen in pasted pages);
- `_bucket`, `_sum`, `_count`, `_total` and `_created` samples are grouped under their family; a page with no
  TYPE line at all still groups `X_bucket{le}` with `X_sum`/`X_count` (a histogram) and `X{quantile}` with them
  (a summary), since that is the only way those names are written;
- OpenMetrics exemplars after a sample (`# {trace_id="..."} 0.4`) are taken off, the sample kept;
- `le` and `quantile` are read from any float spelling (`+Inf`, `Inf`, `1e3`, `1.0`, `1`), so buckets written by
  prometheus_client, the Go and Rust clients and Triton's prometheus-cpp all land on the same bound;
- `_created` series (prometheus_client writes one per counter, histogram and summary, as a gauge holding a unix
  time) are dropped and counted: summed or read as a value they would look like 1.7e9 requests.
Nothing here is fatal: a bad line, a bad bound or a duplicated sample is counted by reason, with a few examples.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from gpuledger.collector.prom_text import PromTextParser

# the types a TYPE line may give (OpenMetrics adds the last four; `unknown` is its spelling of `untyped`)
TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset",
                   "gaugehistogram"})
HISTOGRAMS = frozenset({"histogram", "gaugehistogram"})
WITH_PARTS = HISTOGRAMS | {"summary"}  # families whose series have buckets or quantiles, a sum and a count
# created timestamps are written for these; a `*_created` family whose base is none of them (kube-state-metrics'
# kube_pod_created, or a page excerpt without the base) is kept as a family, and a reader that owns it drops it
HAS_CREATED = frozenset({"counter", "histogram", "summary", "gaugehistogram"})
EXAMPLES_PER_REASON = 3
MAX_EXAMPLES = 40

# anchored on the `#` (a literal the regex engine finds fast) rather than on a line start; the match is then
# checked to start a line (normalise() has taken any indent off)
_META = re.compile(r"#[ \t]*(TYPE|HELP)[ \t]+(\S+)[ \t]*([^\n]*)")
# the suffixes a sample name can carry beyond its family's name, and the part each one is
_SUFFIXES = (("_bucket", "bucket"), ("_sum", "sum"), ("_count", "count"), ("_total", "value"),
             ("_created", "created"), ("_gsum", "sum"), ("_gcount", "count"))


def parse_bound(text: str | None) -> float | None:
    """A bucket bound or quantile from any float spelling (`+Inf`, `1e3`, `1.0`, ` 5 `); None when it is none."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


@dataclass
class Series:
    """One labelled series of a family: its labels without `le`/`quantile`, and what the page gave for it."""

    labels: Mapping[str, str]
    value: float | None = None  # a counter's, gauge's or untyped family's sample
    buckets: dict[float, float] | None = None  # le -> cumulative count, as read (not checked yet)
    sum: float | None = None
    count: float | None = None
    quantiles: int = 0  # summary quantile lines seen (kept out of rows: they cannot be aggregated)
    ts_ms: int | None = None  # the first timestamp a sample of the series carried


@dataclass
class Family:
    """A metric family: its name as the TYPE line (or the samples) give it, its type and its series."""

    name: str
    type: str  # the TYPE line's; for a family with none, `untyped`, or histogram/summary read off its samples
    typed: bool  # whether a TYPE line said so
    help: str = ""
    series: dict[Any, Series] = field(default_factory=dict)
    samples: int = 0  # sample lines that fed it


@dataclass
class FamilyPage:
    """A page read into families, with what could not be read counted by reason."""

    families: dict[str, Family]  # in the order the page first names them
    samples: list[tuple[str, Mapping[str, str], float, int | None]]  # as PromTextParser gives them
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def note(self, reason: str, example: str, count: int = 1) -> None:
        """Count `count` things skipped for `reason` and keep a few examples of each reason for a human."""
        self.skipped[reason] += count
        note_example(self.examples, reason, example)

    @property
    def sample_count(self) -> int:
        return len(self.samples)


def note_example(examples: list[str], reason: str, example: str) -> None:
    """Keep `reason: example` if the reason has fewer than EXAMPLES_PER_REASON examples and the list is not full."""
    if len(examples) >= MAX_EXAMPLES:
        return
    prefix = reason + ": "
    if sum(1 for e in examples if e.startswith(prefix)) < EXAMPLES_PER_REASON:
        examples.append(prefix + example[:160])


def show(name: str, labels: Mapping[str, str], value: float | None = None) -> str:
    """A sample as a short line of exposition text, for examples."""
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    text = f"{name}{{{inner}}}" if inner else name
    return text if value is None else f"{text} {value:g}"


def normalise(text: str) -> str:
    """The page as the parser reads it: a byte-order mark, CR line ends and an indent a doc or a paste added to every
    line (a code block in reST, a quoted issue) are taken off, which the parser would otherwise count as bad lines."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\n " in text or "\n\t" in text or text[:1] in (" ", "\t"):
        text = "\n".join(line.strip() for line in text.split("\n"))
    if " # {" in text:  # OpenMetrics exemplars (`... 3 # {trace_id="ab"} 0.4`): the sample is what comes before
        text = "\n".join(line.split(" # {", 1)[0] if " # {" in line and line[:1] != "#" else line
                         for line in text.split("\n"))
    return text


def _metadata(text: str, page: FamilyPage) -> tuple[dict[str, str], dict[str, str]]:
    """TYPE and HELP by family name; the first TYPE line of a family wins and a second one that disagrees is
    counted."""
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    for match in _META.finditer(text):
        start = match.start()
        if start and text[start - 1] != "\n":  # a `#` inside a line (a label value), not a comment line
            continue
        kind, name, rest = match.group(1), match.group(2), match.group(3).rstrip()
        if kind == "HELP":
            helps.setdefault(name, rest)
            continue
        declared = rest.split()[0].lower() if rest.split() else ""
        if declared not in TYPES:
            page.note("bad_type_line", match.group(0).strip())
            continue
        if name in types and types[name] != declared:
            page.note("conflicting_type_lines", match.group(0).strip())
            continue
        types[name] = declared
    return types, helps


def _resolve(name: str, labels: Mapping[str, str], types: Mapping[str, str]) -> tuple[str | None, str]:
    """(family, part) of a sample by its name; family None when no TYPE line covers it (decided later)."""
    declared = types.get(name)
    if declared is not None:
        if name.endswith("_created") and declared in ("gauge", "untyped", "unknown"):
            base = name[: -len("_created")]
            base_type = types.get(base) or types.get(base + "_total")
            if base_type in HAS_CREATED:  # prometheus_client's created gauge of a counter, histogram or summary
                return name, "created"
        if declared in HISTOGRAMS and "le" in labels:
            return name, "bucket"  # Triton's docs show buckets under the bare family name
        if declared == "summary" and "quantile" in labels:
            return name, "quantile"
        return name, "value"
    for suffix, part in _SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            base_type = types.get(base)
            if base_type is None:
                continue
            if (part == "bucket" and base_type in HISTOGRAMS) \
                    or (part in ("sum", "count") and base_type in WITH_PARTS) \
                    or (part == "value" and base_type == "counter") \
                    or (part == "created" and base_type in HAS_CREATED):
                return base, part
    return None, ""


def read_families(text: str, parser: PromTextParser | None = None) -> FamilyPage:
    """The page's metric families; `parser` (kept across scrapes of one exporter) makes repeated label sets free."""
    text = normalise(text)
    parsed = (parser or PromTextParser()).parse(text)
    page = FamilyPage(families={}, samples=parsed.samples)
    for reason, count in parsed.errors.items():
        page.skipped[f"page_{reason}"] += count
    for example in parsed.examples:  # "line N: kind: 'text'"
        where, _, rest = example.partition(": ")
        kind, _, line = rest.partition(": ")
        note_example(page.examples, f"page_{kind}", f"{where}: {line}")
    types, helps = _metadata(text, page)
    families = page.families
    for name, declared in types.items():  # TYPE lines with no samples are families too (with no series)
        families[name] = Family(name, declared, True, helps.get(name, ""))
    resolved: dict[str, tuple[str | None, str]] = {}
    deferred: list[tuple[str, Mapping[str, str], float, int | None]] = []
    for sample in parsed.samples:
        name, labels = sample[0], sample[1]
        found = resolved.get(name)
        if found is None:
            found = _resolve(name, labels, types)
            if types.get(name) not in WITH_PARTS:  # a typed histogram's or summary's part depends on the labels
                resolved[name] = found
        family_name, part = found
        if family_name is None:  # no TYPE line covers it: read its shape off the name and labels
            if "le" in labels:  # a bucket (Triton's docs write them without the `_bucket` suffix)
                family_name = name[: -len("_bucket")] if name.endswith("_bucket") else name
                part = "bucket"
                _family(families, family_name, "histogram", helps)
            elif "quantile" in labels:
                family_name, part = name, "quantile"
                _family(families, family_name, "summary", helps)
            elif name.endswith(("_sum", "_count")):
                deferred.append(sample)  # a histogram's or summary's part if its buckets or quantiles show up
                continue
            else:
                family_name, part = name, "value"
                _family(families, family_name, "untyped", helps)
        _add(page, families[family_name], part, sample)
    for sample in deferred:
        name = sample[0]
        base, _, suffix = name.rpartition("_")
        family = families.get(base)
        if family is not None and family.type in WITH_PARTS:
            _add(page, family, suffix, sample)
        else:
            _add(page, _family(families, name, "untyped", helps), "value", sample)
    return page


def _family(families: dict[str, Family], name: str, type_: str, helps: Mapping[str, str]) -> Family:
    family = families.get(name)
    if family is None:
        family = families[name] = Family(name, type_, False, helps.get(name, ""))
    return family


def _add(page: FamilyPage, family: Family, part: str, sample: tuple[str, Mapping[str, str], float, int | None]) -> None:
    """Put one sample into its family's series (the hot loop of a page: plain dict and frozenset work only)."""
    name, labels, value, ts = sample
    if part == "value":
        key = frozenset(labels.items())
        series = family.series.get(key)
        if series is None:
            family.series[key] = Series(labels, value, ts_ms=ts)
        elif series.value is None:
            series.value = value
        else:
            page.note("duplicate_sample", show(name, labels, value))
            return
        family.samples += 1
        return
    if part == "created":
        page.note("created_timestamp", show(name, labels, value))
        return
    if part in ("bucket", "quantile"):
        own = dict(labels)
        text = own.pop("le" if part == "bucket" else "quantile")
        bound = parse_bound(text)
        if bound is None:
            page.note("bad_le" if part == "bucket" else "bad_quantile", show(name, labels, value))
            return
        key = frozenset(own.items())
    else:
        own = labels
        key = frozenset(labels.items())
    series = family.series.get(key)
    if series is None:
        series = family.series[key] = Series(own, ts_ms=ts)
    elif series.ts_ms is None:
        series.ts_ms = ts
    if part == "bucket":
        if series.buckets is None:
            series.buckets = {bound: value}
        elif bound in series.buckets:
            page.note("duplicate_sample", show(name, labels, value))
            return
        else:
            series.buckets[bound] = value
    elif part == "quantile":
        series.quantiles += 1
    elif getattr(series, part) is not None:  # sum or count
        page.note("duplicate_sample", show(name, labels, value))
        return
    else:
        setattr(series, part, value)
    family.samples += 1


__all__ = ["Family", "FamilyPage", "HISTOGRAMS", "Series", "TYPES", "WITH_PARTS", "normalise", "parse_bound",
           "read_families", "show"]
