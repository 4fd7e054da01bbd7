"""The one small interface behind every server's reader: a table of which family names (old and new) feed which
canonical figure, with the scale to the canonical unit, read by one generic algorithm.

A server module (vllm.py, triton.py, ...) is only data: its `ServerReader` lists `Source` entries, in precedence
order. A renamed metric in a new version is one more entry; a config can add one at run time (`aliases`). Rules
the algorithm applies to every server, so no reader re-implements them:
- Names are matched with a trailing `_total` taken off (text format 0.0.4 writes a counter's TYPE line with it,
  OpenMetrics without), and a reader that owns a `prefix:` also matches `prefix_` (a pipeline that cannot carry
  `:` in names, e.g. OpenTelemetry, writes `vllm_prompt_tokens_total`).
- Series are aggregated on purpose: labels a reader names as identity (engine, model version, GPU, rank,
  container, the scrape's instance) stay apart in `instance`; every other label (finish reason, error kind,
  route) is summed over, which is what a counter or histogram means across it.
- Precedence: where two sources give the same figure and part for the same series (a deprecated name beside its
  replacement, a summary beside the counters it repeats), the earlier source wins and the later one is counted
  as `superseded`, never added: vLLM 0.10 writes both `vllm:gpu_cache_usage_perc` and `vllm:kv_cache_usage_perc`.
- Values are checked: a counter or histogram part that is negative, NaN or infinite is dropped and counted; a
  fraction above 1 is clamped to 1 and counted; a histogram whose buckets are not cumulative keeps its sum and
  count only; one cut before `+Inf` keeps its buckets and is counted.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from gpuledger.collector.apps.families import WITH_PARTS, Family, Series, note_example, show
from gpuledger.collector.apps.figures import FIGURES, FRACTIONS, SERVER_KINDS
from gpuledger.collector.errors import InputError

# where the series' Kubernetes pod and namespace are, in the order looked for: the scrape's target labels first
# (they name the server's own pod), then Prometheus' `exported_*` copies of a page's own labels
POD_LABELS = ("pod", "kubernetes_pod_name", "pod_name", "exported_pod")
NAMESPACE_LABELS = ("namespace", "kubernetes_namespace", "exported_namespace")
# identity labels every reader keeps: the scrape target (a federated or remote-read page mixes servers), the node
# and the container, and a GPU
COMMON_IDENTITY = ("instance", "job", "node", "container", "gpu", "gpu_uuid")


@dataclass(frozen=True, slots=True)
class AppRow:
    """One figure of one series, in the canonical unit (see reading.py for the fields)."""

    kind: str
    figure: str
    part: str
    le: float | None
    service: str
    instance: str
    namespace: str | None
    pod: str | None
    value: float
    ts_ms: int | None


@dataclass(frozen=True)
class Source:
    """One family name that feeds one figure.

    `scale` multiplies values into the figure's unit (a histogram's bucket bounds and sum too, never its count).
    `take`: "sum" or "count" of a histogram or summary family read as a counter figure (TGI's token histograms).
    `as_part`: "sum" or "count": a counter read as that part of a histogram figure (Triton's cumulative durations
    and request counts give a mean latency). `select`: label values a series must carry (those labels then leave
    the identity), e.g. TensorRT-LLM's `request_type="active"`. `note`: the versions and where it comes from.
    """

    family: str
    figure: str
    scale: float = 1.0
    take: str = ""
    as_part: str = ""
    select: tuple[tuple[str, str], ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        if self.figure not in FIGURES:
            raise ValueError(f"{self.family}: unknown figure {self.figure!r}; figures are {sorted(FIGURES)}")
        if self.take not in ("", "sum", "count") or self.as_part not in ("", "sum", "count"):
            raise ValueError(f"{self.family}: take/as_part must be '', 'sum' or 'count'")
        histogram = FIGURES[self.figure].type == "histogram"
        if (self.take and histogram) or (self.as_part and not histogram):
            raise ValueError(f"{self.family}: take= feeds a counter or gauge, as_part= a histogram figure")
        inverse = 1.0 / self.scale if self.scale else 0.0
        # a scale of 1e-6 or 0.01 divides by 1e6 or 100: 35 % is 0.35, not 35 * 0.01 = 0.35000000000000003
        object.__setattr__(self, "_divisor", inverse if self.scale < 1 and inverse == round(inverse) else 0.0)

    def apply(self, value: float) -> float:
        """A value in the exporter's unit, in the figure's."""
        divisor = self._divisor  # type: ignore[attr-defined]
        return value / divisor if divisor else value * self.scale


def base_name(name: str) -> str:
    """A family name as tables are keyed: without a trailing `_total`."""
    return name[:-6] if name.endswith("_total") else name


@dataclass
class ReadResult:
    """What one reader made of a page."""

    rows: list[AppRow] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    owned: set[str] = field(default_factory=set)  # the page's families this reader accounted for
    excluded: set[tuple] = field(default_factory=set)  # (family, series key) left out by the server's own rule

    def note(self, reason: str, example: str, count: int = 1) -> None:
        self.skipped[reason] += count
        note_example(self.examples, reason, example)


@dataclass
class ServerReader:
    """A server kind's reader: which families are its own, which feed which figure, how a series is identified."""

    kind: str
    sources: tuple[Source, ...]
    prefixes: tuple[str, ...] = ()  # family-name prefixes this server owns (its other families are counted)
    marks: tuple[str, ...] | None = None  # prefixes whose presence recognises the server (default: prefixes)
    mark_names: frozenset[str] = frozenset()  # read-past families whose presence alone recognises the server
    service_labels: tuple[str, ...] = ()  # the label naming the model / served model, first present wins
    identity_labels: tuple[str, ...] = ()  # labels kept apart in `instance`, beside COMMON_IDENTITY
    all_labels_identity: bool = False  # every label but service/pod/namespace is identity (free-form labels)
    label_renames: Mapping[str, str] = field(default_factory=dict)  # an old label name -> the current one
    pod_labels: tuple[str, ...] = POD_LABELS
    namespace_labels: tuple[str, ...] = NAMESPACE_LABELS
    known_unused: frozenset[str] = frozenset()  # its families read past on purpose (not `unknown_family`)
    colon_alias: bool = False  # also match `prefix_name` for a table's `prefix:name`

    def __post_init__(self) -> None:
        if self.kind not in SERVER_KINDS:
            raise ValueError(f"unknown server kind {self.kind!r}; kinds are {SERVER_KINDS}")
        self._identity = frozenset(COMMON_IDENTITY + self.identity_labels)
        self._table: dict[str, list[int]] = {}
        for index, source in enumerate(self.sources):
            self._table.setdefault(base_name(source.family), []).append(index)
        self._unused = frozenset(base_name(n) for n in self.known_unused | self.mark_names)
        self._marks = frozenset(base_name(n) for n in self.mark_names)

    # -- which families are this server's -----------------------------------------------------------------------
    def key(self, name: str) -> str | None:
        """The table key of a page's family name, or None when the name is not this server's."""
        base = base_name(name)
        if base in self._table or base in self._unused or base.startswith(self.prefixes):
            return base
        if self.colon_alias:
            for prefix in self.prefixes:
                if prefix.endswith(":") and base.startswith(prefix[:-1] + "_"):
                    alias = prefix + base[len(prefix):]
                    if alias in self._table or alias in self._unused:
                        return alias
        return None

    def recognises(self, families: Mapping[str, Family], extra: Iterable[str] = ()) -> bool:
        """Whether the page is (also) this server's: it has a family with one of its marks, a family of its table,
        or one a run-time alias names."""
        marks = self.prefixes if self.marks is None else self.marks
        extra = {base_name(n) for n in extra}
        for name in families:
            key = self.key(name)
            if key is None:
                if base_name(name) in extra:
                    return True
                continue
            if key in self._table or key.startswith(marks) or key in self._marks:
                return True
        return False

    def first_index(self, families: Mapping[str, Family]) -> int:
        """Where on the page this server's first family is (kinds are listed in page order)."""
        for index, name in enumerate(families):
            if self.key(name) is not None:
                return index
        return len(families)

    # -- identity -------------------------------------------------------------------------------------------------
    def identity(self, labels: Mapping[str, str], drop: frozenset[str] = frozenset()
                 ) -> tuple[str, str, str | None, str | None]:
        """(service, instance, namespace, pod) of a series' labels."""
        if self.label_renames:  # an old label name's value wins over a label already carrying the new name
            renamed = dict(labels)
            for old, new in self.label_renames.items():
                if old in labels:
                    renamed[new] = renamed.pop(old)
            labels = renamed
        service = next((labels[n] for n in self.service_labels if labels.get(n)), "")
        namespace = next((labels[n] for n in self.namespace_labels if labels.get(n)), None)
        pod = next((labels[n] for n in self.pod_labels if labels.get(n)), None)
        if self.all_labels_identity:
            skip = set(self.service_labels) | set(self.pod_labels) | set(self.namespace_labels) | drop
            parts = [f"{k}={v}" for k, v in labels.items() if v and k not in skip]
        else:
            ident = self._identity
            parts = [f"{k}={v}" for k, v in labels.items() if v and k in ident and k not in drop]
        parts.sort()
        return service, ",".join(parts), namespace, pod

    def excluded(self, service: str, labels: Mapping[str, str], options: Mapping[str, object]) -> str | None:
        """A reason to leave a series out (Triton's ensembles), or None; a server with such a rule overrides it."""
        return None

    # -- reading --------------------------------------------------------------------------------------------------
    def read(self, families: Mapping[str, Family], aliases: Mapping[str, str] | None = None,
             options: Mapping[str, object] | None = None) -> ReadResult:
        """Rows of the page's families this server owns. `aliases`: family name -> figure (or `figure*scale`),
        taught at run time; they rank after the built-in names."""
        options = options or {}
        sources = list(self.sources) + [alias_source(name, target) for name, target in (aliases or {}).items()]
        table: dict[str, list[int]] = {}
        for index, source in enumerate(sources):
            table.setdefault(base_name(source.family), []).append(index)
        alias_keys = {base_name(name) for name in (aliases or {})}
        by_key: dict[str, list[Family]] = {}
        result = ReadResult()
        for name, family in families.items():
            key = self.key(name)
            if key is None and base_name(name) in alias_keys:
                key = base_name(name)
            if key is not None:
                by_key.setdefault(key, []).append(family)
                result.owned.add(name)
        sums: dict[tuple, list] = {}  # (figure, part, le, service, instance, namespace, pod) -> [value, ts]
        claims: dict[tuple, int] = {}  # (figure, part, service, instance, namespace, pod) -> source index
        used: dict[str, set] = {}  # family -> keys of the series some source read
        for index, source in enumerate(sources):
            for family in by_key.get(base_name(source.family), ()):
                self._read_source(index, source, family, options, sums, claims, used, result)
        kind = self.kind
        for (figure, part, le, service, instance, namespace, pod), (value, ts) in sums.items():
            if figure in FRACTIONS and value > 1.0:
                result.note("fraction_above_1_clamped", f"{figure} {service} {instance} {value:g}")
                value = 1.0
            result.rows.append(AppRow(kind, figure, part, le, service, instance, namespace, pod, value, ts))
        for key, members in by_key.items():
            for family in members:
                seen = used.get(family.name)
                if seen is None:
                    if family.name.endswith("_created"):
                        reason = "created_timestamp"
                    elif key in table:
                        reason = "type_mismatch"
                    else:
                        reason = "unread_family" if key in self._unused else "unknown_family"
                    if family.samples:
                        result.note(reason, f"{family.name} ({family.type})", family.samples)
                    continue
                rest = sum(_lines(s) for k, s in family.series.items() if k not in seen)
                if rest:
                    result.note("unread_series", family.name, rest)
        return result

    def _read_source(self, index: int, source: Source, family: Family, options: Mapping[str, object],
                     sums: dict, claims: dict, used: dict, result: ReadResult) -> None:
        figure = source.figure
        histogram_figure = FIGURES[figure].type == "histogram"
        with_parts = family.type in WITH_PARTS
        if (histogram_figure and not source.as_part) or source.take:
            if not with_parts:
                return  # its samples are counted as type_mismatch if no other source reads the family
        elif with_parts:
            return
        select = source.select
        drop = frozenset(k for k, _ in select)
        seen = used.setdefault(family.name, set())
        counter_like = FIGURES[figure].type != "gauge"
        for series_key, series in family.series.items():
            labels = series.labels
            if select and any(labels.get(k) != v for k, v in select):
                continue
            seen.add(series_key)
            service, instance, namespace, pod = self.identity(labels, drop)
            why = self.excluded(service, labels, options)
            if why is not None:
                if (family.name, series_key) not in result.excluded:  # several sources may read one series
                    result.excluded.add((family.name, series_key))
                    result.note(why, show(family.name, labels), _lines(series))
                continue
            ident = (service, instance, namespace, pod)
            for part, le, value in self._parts(source, family, series, result):
                if not math.isfinite(value) or value < 0:
                    reason = "bad_counter_value" if counter_like else "bad_value"
                    result.note(reason, show(family.name, labels, value))
                    continue
                claim = (figure, part) + ident
                owner = claims.setdefault(claim, index)
                if owner != index:
                    result.note("superseded", f"{family.name} by an earlier name for {figure} ({service})")
                    continue
                slot = sums.get((figure, part, le) + ident)
                if slot is None:
                    sums[(figure, part, le) + ident] = [value, series.ts_ms]
                else:
                    slot[0] += value

    def _parts(self, source: Source, family: Family, series: Series, result: ReadResult
               ) -> list[tuple[str, float | None, float]]:
        """(part, le, value) of a series as the source reads it, scaled; histogram buckets checked."""
        apply = source.apply
        if source.as_part:
            if series.value is None:
                return []
            return [(source.as_part, None, apply(series.value) if source.as_part == "sum" else series.value)]
        if source.take:
            got = series.sum if source.take == "sum" else series.count
            return [] if got is None else [("value", None, apply(got) if source.take == "sum" else got)]
        if FIGURES[source.figure].type != "histogram":
            return [] if series.value is None else [("value", None, apply(series.value))]
        parts: list[tuple[str, float | None, float]] = []
        if series.quantiles:
            result.note("summary_quantile", f"{family.name} ({series.quantiles} quantile lines)", series.quantiles)
        if series.buckets:
            bounds = sorted(series.buckets)
            counts = [series.buckets[b] for b in bounds]
            if any(later < earlier for earlier, later in zip(counts, counts[1:])):
                result.note("histogram_not_cumulative", show(family.name, series.labels), len(bounds))
            else:
                if bounds[-1] != math.inf:
                    result.note("histogram_without_inf", show(family.name, series.labels))
                parts.extend(("bucket", apply(b) if b != math.inf else b, c) for b, c in zip(bounds, counts))
        if series.sum is not None:
            parts.append(("sum", None, apply(series.sum)))
        if series.count is not None:
            parts.append(("count", None, series.count))
        return parts


def _lines(series: Series) -> int:
    """How many sample lines a series had (for counting what was skipped)."""
    return ((series.value is not None) + len(series.buckets or ()) + (series.sum is not None)
            + (series.count is not None) + series.quantiles)


def alias_source(name: str, target: str) -> Source:
    """A run-time alias: `figure` or `figure*scale` (e.g. `queue_seconds*1e-6` for a microsecond counter)."""
    figure, _, scale = target.partition("*")
    figure = figure.strip()
    if figure not in FIGURES:
        raise InputError(f"alias {name!r} -> {target!r}: unknown figure {figure!r}; figures are {sorted(FIGURES)}")
    try:
        factor = float(scale) if scale else 1.0
    except ValueError as exc:
        raise InputError(f"alias {name!r} -> {target!r}: the scale after '*' must be a number") from exc
    if not (math.isfinite(factor) and factor > 0):
        raise InputError(f"alias {name!r} -> {target!r}: the scale must be a positive number")
    return Source(name, figure, factor, note="run-time alias")


__all__ = ["AppRow", "COMMON_IDENTITY", "NAMESPACE_LABELS", "POD_LABELS", "ReadResult", "ServerReader", "Source",
           "alias_source", "base_name"]
