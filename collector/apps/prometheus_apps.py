"""Inference servers' metrics read from a Prometheus that already scrapes them (the usual Kubernetes set-up: vLLM,
Triton, TGI and SGLang pods carry scrape annotations), so gpuledger needs no route to each pod.

How: each read asks for the raw samples of the servers' families since the previous read (a range selector at the
read's instant, the first read `since` back, in chunks), with the scrape's own timestamps. Prometheus keeps the
families' types in its metadata API; the samples of one scrape (one target, one timestamp) are written back as the
page that scrape read, with its `# TYPE` lines, and go through the same readers a page read directly does. So a
figure read through Prometheus is the figure read from the pages, scrape for scrape: the same increases, resets
and quantiles (tests/test_inference_prometheus.py holds them equal on a real Prometheus).
"""
from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import requests

from gpuledger.collector.apps.targets import AppRead, PageRead
from gpuledger.collector.prometheus_source import query_prometheus
from gpuledger.collector.source import SourceError

# the families of every server gpuledger reads (collector/apps), by the prefixes their names start with
SERVER_SELECTOR = '{__name__=~"vllm:.+|nv_inference_.+|nv_gpu_.+|tgi_.+|sglang:.+|sglang_.+|gpuledger_train_.+"}'
TARGET_LABELS = ("job", "instance")  # what Prometheus adds to name the scrape target


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _line(labels: dict[str, str], value: str) -> str:
    name = labels["__name__"]
    rest = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}} {value}"


class PrometheusApps:
    """Reads the inference servers' families from Prometheus' HTTP API, read after read."""

    def __init__(self, url: str, since: timedelta = timedelta(hours=6), chunk: timedelta = timedelta(hours=1),
                 timeout_s: float = 60.0, session: requests.Session | None = None,
                 clock: Callable[[], datetime] | None = None, settle_s: float = 15.0) -> None:
        """`since`: how far back the first read goes; `settle_s`: how far behind now reads stay, so a scrape still
        being written when a read is taken is read by the next one instead of lost."""
        self.url = url.rstrip("/")
        self.name = f"apps:prometheus:{self.url}"
        self.chunk = chunk
        self.timeout_s = timeout_s
        self.session = session or requests.Session()
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self.cursor = self.clock() - since  # scrapes after it are still to read
        self.types: dict[str, str] = {}
        self.settle = timedelta(seconds=settle_s)
        self.catching_up = True  # more history is waiting: the loop reads again at once

    def read(self) -> AppRead:
        """The scrapes in (cursor, cursor + chunk], at most up to now, as pages."""
        now = self.clock() - self.settle
        at = min(now, self.cursor + self.chunk)
        if at <= self.cursor:
            self.catching_up = False
            return AppRead(at=now)
        span = max(1, math.ceil((at - self.cursor).total_seconds()))
        series = query_prometheus(self.session, self.url, f"{SERVER_SELECTOR}[{span}s]", at, self.timeout_s)
        self._learn_types({s["metric"].get("__name__", "") for s in series})
        scrapes: dict[tuple, list[str]] = defaultdict(list)
        names: dict[tuple, set[str]] = defaultdict(set)
        after = self.cursor.timestamp()
        for s in series:
            labels = s.get("metric", {})
            target = tuple(labels.get(k, "") for k in TARGET_LABELS)
            for ts, value in s.get("values", []):
                if float(ts) <= after:
                    continue
                key = (target, float(ts))
                scrapes[key].append(_line(labels, value))
                names[key].add(labels.get("__name__", ""))
        read = AppRead(at=at)
        for (target, ts), lines in sorted(scrapes.items(), key=lambda kv: kv[0][1]):
            types = [f"# TYPE {family} {kind}" for family, kind in sorted(self.types.items())
                     if any(n == family or n.startswith(family + "_") for n in names[(target, ts)])]
            read.pages.append(PageRead("\n".join(types + lines) + "\n", f"{target[0]}/{target[1]}",
                                       at=datetime.fromtimestamp(ts, tz=timezone.utc)))
        self.cursor = at
        self.catching_up = at < now
        return read

    def _learn_types(self, names: set[str]) -> None:
        """The `# TYPE` of every family named, from Prometheus' metadata API (asked again for names not known)."""
        if all(any(n == f or n.startswith(f + "_") for f in self.types) for n in names if n):
            return
        try:
            response = self.session.get(f"{self.url}/api/v1/metadata", timeout=self.timeout_s)
            body: Any = response.json()
            for family, entries in body.get("data", {}).items():
                if entries and isinstance(entries, list) and isinstance(entries[0], dict):
                    self.types[family] = str(entries[0].get("type", "untyped"))
        except (requests.RequestException, ValueError, AttributeError) as exc:
            raise SourceError(f"cannot read the metric types from Prometheus at {self.url}: {exc}") from exc
