"""What gpuledger would store from one /metrics page, whichever exporter wrote it: `check_page(text)`.

The page is read into metric families once (collector/apps/families.py) and every reader gpuledger has is asked
whether the page is (also) its own, by the families present, never by a file or host name: dcgm-exporter
(collector/dcgm_source.py), kube-state-metrics (jobs/kube_state.py), Kueue and KAI (jobs/kueue.py, jobs/kai.py),
and the inference servers and training jobs of collector/apps. One page can hold several kinds (a vLLM server
with TGI-compatible families, a federated page). The answer is JSON-serialisable: `gpuledger scrape` prints it,
and it is what a user checks a new exporter version against, like `promtool check metrics`.
"""
from __future__ import annotations

import gzip
import io
import logging
import math
import socket
import sys
import urllib.error
import urllib.request
import zlib
from collections import Counter
from contextlib import contextmanager
from datetime import date, datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, Collection, Iterator, Mapping

from gpuledger.collector.apps.families import FamilyPage, note_example, read_families
from gpuledger.collector.apps.figures import SERVER_KINDS
from gpuledger.collector.apps.reading import READERS, read_families_page
from gpuledger.collector.apps.rows import screened
from gpuledger.collector.errors import InputError

EXPORTER_KINDS = ("dcgm-exporter", "kube-state-metrics", "kueue", "kai")
KINDS = EXPORTER_KINDS + SERVER_KINDS
NOTHING = "not a page of any exporter gpuledger reads"
DCGM_INTERVAL_S = 30.0  # what a row's interval says; a single page has no interval of its own
MAX_PAGE_BYTES = 50 * 1024 * 1024  # far above any real exporter's page (a 8-GPU dcgm page is ~100 KB)
# the classic text format first: an exporter that also speaks OpenMetrics or protobuf answers with text
ACCEPT = "text/plain;version=0.0.4;q=1.0,text/plain;q=0.9,*/*;q=0.1"


@lru_cache(maxsize=4096)
def _is_dcgm(name: str) -> bool:
    from gpuledger.collector.dcgm_source import FIELD_COLUMNS, KNOWN_UNUSED, field_name  # pyarrow: when needed
    field = field_name(name)
    return field.startswith("DCGM_FI_") or field in FIELD_COLUMNS or field in KNOWN_UNUSED


def _is_kai(name: str) -> bool:
    from gpuledger.collector.jobs.kai import FAMILY
    return bool(FAMILY.match(name)) and not name.startswith("kueue_")


_READER_MODULE = {"dcgm-exporter": "gpuledger.collector.dcgm_source", "kube-state-metrics":
                  "gpuledger.collector.jobs.kube_state", "kueue": "gpuledger.collector.jobs.kueue",
                  "kai": "gpuledger.collector.jobs.kai"}
# which of a page's family names each exporter reads
_OWNS = {
    "dcgm-exporter": _is_dcgm,
    "kube-state-metrics": lambda name: name.startswith("kube_pod_"),
    "kueue": lambda name: name.startswith("kueue_") and not name.startswith("kueue_local_queue_"),
    "kai": _is_kai,
}


def check_page(text: str, aliases: Mapping[str, Mapping[str, str]] | None = None, *,
               ensembles: Collection[str] = (), at: datetime | None = None) -> dict[str, Any]:
    """{kind: [kinds recognised, in page order], rows: [what would be stored, one dict each, with its kind],
    skipped: {reason: count}, examples: [a few "reason: example" lines], costing: what stops a server's figures
    being costed (None when nothing does)}. `aliases` and `ensembles` as in
    read_page; `at`: the time rows of exporters without their own timestamps are stamped with (default now)."""
    at = at or datetime.now(timezone.utc)
    page = read_families(text)
    names = list(page.families)
    found: dict[str, int] = {}  # exporter kind -> index of its first family
    claimed: set[str] = set()
    for kind, owns in _OWNS.items():
        mine = [i for i, name in enumerate(names) if owns(name)]
        if mine and any(page.families[names[i]].samples for i in mine):
            found[kind] = mine[0]
            claimed.update(names[i] for i in mine)
    app = read_families_page(page, aliases, ensembles=ensembles, claimed=claimed)
    skipped = Counter(page.skipped)
    examples = list(page.examples)
    rows: list[dict[str, Any]] = []
    if app.kinds:
        for reason, count in (app.skipped - page.skipped).items():
            skipped[reason] += count
        for example in app.examples:
            if example not in examples:
                examples.append(example)
        # screened as a server screens them (collector/apps/rows.py): what scrape shows is what would be stored
        rows.extend(_app_row(row) for row in screened(app.rows, skipped))
    for kind in found:
        try:
            exporter_rows, why = _read_exporter(kind, page, at)
        except Exception as exc:  # noqa: BLE001 - a reader's bug on one page is reported, not the whole check lost
            reason = f"{kind}: reader_failed"
            skipped[reason] += sum(1 for s in page.samples if _OWNS[kind](s[0]))
            note_example(examples, reason, f"{type(exc).__name__}: {_one_line(exc)} (in {_READER_MODULE[kind]})")
            continue
        rows.extend(exporter_rows)
        for reason, count in why.items():
            skipped[f"{kind}: {reason}"] += count
            note_example(examples, f"{kind}: {reason}", f"counted by {_READER_MODULE[kind]}")
    order = {**found, **{kind: READERS[kind].first_index(page.families) for kind in app.kinds}}
    kinds = sorted(order, key=lambda k: (order[k], KINDS.index(k)))
    if not kinds and page.sample_count:
        skipped[NOTHING] += page.sample_count
        note_example(examples, NOTHING, f"{len(names)} families, none of {', '.join(KINDS)}")
    return {"kind": kinds, "rows": rows, "skipped": dict(skipped), "examples": examples, "costing": _costing(rows)}


def _costing(rows: list[dict[str, Any]]) -> str | None:
    """Whether an inference server's rows can be costed: its figures join the GPU cost by pod, so series naming no
    pod cannot be, and what to add says so (None when every server row names its pod, or there is none)."""
    served = [r for r in rows if r["kind"] in SERVER_KINDS]
    unplaced = sorted({r["service"] or "?" for r in served if not r.get("pod")})
    if not unplaced:
        return None
    return (f"{len(unplaced)} service(s) ({', '.join(unplaced[:5])}{', ...' if len(unplaced) > 5 else ''}) name no "
            "pod or namespace on this page, so their tokens cannot be joined to the GPU cost of the pods they run in: "
            "list the endpoint under [[apps.targets]] with its namespace and pod (or job_id for a Slurm job), or read "
            "it through Prometheus (serve --apps-from prometheus), which adds the namespace and pod labels")


def _app_row(row: Any) -> dict[str, Any]:
    return {"kind": row.kind, "figure": row.figure, "part": row.part,
            "le": None if row.le is None else ("+Inf" if row.le == math.inf else row.le),
            "service": row.service, "instance": row.instance, "namespace": row.namespace, "pod": row.pod,
            "value": row.value, "ts_ms": row.ts_ms}


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """A reader's warnings about the page are in `skipped` already: not repeated on the log."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _read_exporter(kind: str, page: FamilyPage, at: datetime) -> tuple[list[dict[str, Any]], Counter]:
    """Rows and skip counts of the exporter readers gpuledger has, fed the page's own samples (parsed once)."""
    owns = _OWNS[kind]
    samples = [s for s in page.samples if owns(s[0])]
    if kind == "dcgm-exporter":
        from gpuledger.collector.dcgm_source import DcgmPageConverter
        errors: Counter = Counter()
        with _quiet("gpuledger.collector.dcgm_source"):
            table = DcgmPageConverter().convert_samples(samples, at, DCGM_INTERVAL_S, errors)
        return [_jsonable_row(kind, r) for r in table.to_pylist()], errors
    if kind == "kube-state-metrics":
        from gpuledger.collector.jobs.kube_state import pods_as_jobs
        batch = pods_as_jobs(samples)  # GPU pods only, as `gpuledger import kube-state` stores them
        return [_jsonable_row(kind, r) for r in batch.jobs.to_dict("records")], batch.skipped
    from gpuledger.collector.jobs.kai import kai_rows
    from gpuledger.collector.jobs.kueue import kueue_rows
    queues = (kueue_rows if kind == "kueue" else kai_rows)(samples, at)
    return [_jsonable_row(kind, r) for r in queues.rows.to_dict("records")], queues.skipped


def _jsonable_row(kind: str, row: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": kind, **{k: _jsonable(v) for k, v in row.items()}}


def _jsonable(value: Any) -> Any:
    """A value json.dumps writes as standard JSON: instants as ISO 8601, NaN/NaT as null, infinities as strings."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return value if math.isfinite(value) else ("+Inf" if value > 0 else "-Inf")
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    try:  # pandas' Timestamp/NaT and numpy scalars
        import pandas as pd
        if value is pd.NaT:
            return None
        if isinstance(value, pd.Timestamp):
            return value.isoformat()
    except ImportError:  # pragma: no cover - pandas is a dependency
        pass
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return str(value)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def fetch_page(source: str, timeout_s: float = 10.0, max_bytes: int = MAX_PAGE_BYTES) -> str:
    """The text of a page: an http(s) URL fetched (with a timeout and a size cap), `-` for standard input, else a
    file. Anything that cannot be read is an InputError with a one-line message."""
    if source == "-":
        data = sys.stdin.buffer.read(max_bytes + 1)
    elif source.lower().startswith(("http://", "https://")):
        data = _fetch_url(source, timeout_s, max_bytes)
    elif "://" in source:
        raise InputError(f"{source}: only http:// and https:// URLs, a file or - (standard input) can be read")
    else:
        path = Path(source)
        if path.is_dir():
            raise InputError(f"{path} is a folder: give a /metrics URL, a file of a page, or - for standard input")
        try:
            if path.stat().st_size > max_bytes:
                raise InputError(f"{path} is larger than {max_bytes:,} bytes: not a /metrics page")
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise InputError(f"{path} not found: give a /metrics URL, a file of a page, or - for standard input") \
                from exc
        except OSError as exc:
            raise InputError(f"cannot read {path}: {_one_line(exc.strerror or exc)}") from exc
    if len(data) > max_bytes:
        raise InputError(f"{source}: the page is larger than {max_bytes:,} bytes; not read")
    return data.decode("utf-8", errors="replace")


def _fetch_url(url: str, timeout_s: float, max_bytes: int) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": ACCEPT, "User-Agent": "gpuledger-scrape"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - http(s) checked above
            data = response.read(max_bytes + 1)
            if response.headers.get("Content-Encoding", "").lower() == "gzip":  # read no more than the cap
                data = gzip.GzipFile(fileobj=io.BytesIO(data)).read(max_bytes + 1)
    except urllib.error.HTTPError as exc:
        raise InputError(f"{url}: HTTP {exc.code} {_one_line(exc.reason)}") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (socket.timeout, TimeoutError)):
            raise InputError(f"{url}: no answer within {timeout_s:g} s") from exc
        raise InputError(f"cannot reach {url}: {_one_line(exc.reason)}") from exc
    except (socket.timeout, TimeoutError) as exc:
        raise InputError(f"{url}: no answer within {timeout_s:g} s") from exc
    except (OSError, ValueError, EOFError, zlib.error) as exc:  # refused, reset, a bad URL, broken gzip
        raise InputError(f"cannot read {url}: {_one_line(exc)}") from exc
    return data


def summary(answer: Mapping[str, Any], source: str = "") -> list[str]:
    """check_page's answer for a human: the kinds, rows per kind and figure, skipped reasons with examples."""
    lines = [f"page: {source}"] if source else []
    kinds = answer["kind"]
    lines.append("kinds: " + (", ".join(kinds) if kinds else "none recognised (" + ", ".join(KINDS) + ")"))
    rows = answer["rows"]
    lines.append(f"rows: {len(rows):,}")
    groups: dict[tuple[str, str], Counter] = {}
    series: dict[tuple[str, str], set] = {}
    for row in rows:
        key = (row["kind"], row.get("figure") or row.get("field") or "-")
        groups.setdefault(key, Counter())[row.get("part") or "row"] += 1
        series.setdefault(key, set()).add((row.get("service"), row.get("instance"), row.get("pod")))
    for (kind, figure), parts in sorted(groups.items()):
        text = ", ".join(f"{n:,} {part}" for part, n in sorted(parts.items()))
        lines.append(f"  {kind:<18} {figure:<22} {text}  ({len(series[(kind, figure)]):,} series)")
    skipped = answer["skipped"]
    if answer.get("costing"):
        lines.append(f"cost: {answer['costing']}")
    lines.append(f"skipped: {sum(skipped.values()):,}" + ("" if skipped else " (nothing)"))
    for reason, count in sorted(skipped.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"  {reason:<40} {count:>8,}")
        for example in answer.get("examples", ()):
            if example.startswith(reason + ": "):
                lines.append(f"      e.g. {example[len(reason) + 2:]}")
    return lines


__all__ = ["EXPORTER_KINDS", "KINDS", "MAX_PAGE_BYTES", "NOTHING", "check_page", "fetch_page", "summary"]
