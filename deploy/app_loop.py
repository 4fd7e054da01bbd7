"""Read inference servers' own metrics on an interval (collector/apps) and store them for analytics/inference.py.

A read's pages go through the readers (vLLM, Triton, TGI, SGLang, the training convention), are attributed to
their pods and teams (collector/apps/rows.py) and stored in one write. What the readers skipped is counted and said
in the log and on /healthz; a target that cannot be read is named there too, and the others are stored. A read
that fails as a whole is retried on the next interval (PollingLoop), never stopping the server.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from datetime import datetime
from typing import Mapping, Protocol, Sequence

import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.collector.apps import read_page
from gpuledger.collector.apps.rows import APP_COLUMNS, page_rows
from gpuledger.collector.apps.targets import AppRead
from gpuledger.collector.attribution import Attributor
from gpuledger.deploy.collect_loop import PollingLoop

log = logging.getLogger(__name__)


class AppSource(Protocol):
    name: str

    def read(self) -> AppRead: ...


def store_read(store: Store, read: AppRead, attributor: Attributor,
               aliases: Mapping[str, Mapping[str, str]] | None = None,
               ensembles: Sequence[str] = ()) -> tuple[int, Counter, list[str]]:
    """One read's pages, parsed, attributed and stored: (rows stored, what was skipped by reason, kinds seen).
    `ensembles`: Triton models to leave out as ensembles though their names do not say so."""
    frames, skipped, kinds = [], Counter(), []
    for fetched in read.pages:
        parsed = read_page(fetched.text, aliases=aliases, ensembles=ensembles)
        skipped.update(parsed.skipped)
        if not parsed.kinds:
            skipped["not_an_inference_page"] += 1
            continue
        kinds += [k for k in parsed.kinds if k not in kinds]
        frames.append(page_rows(parsed.rows, fetched.at or read.at, fetched.target, attributor, fetched.namespace,
                                fetched.pod, fetched.job_id, skipped))
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=APP_COLUMNS)
    return store.record_app_samples(rows), skipped, kinds


class AppLoop(PollingLoop):
    silence = "no inference metrics read from"
    failing = "reading inference metrics from"

    def __init__(self, source: AppSource, store: Store, attributor: Attributor, interval_s: float = 30.0,
                 aliases: Mapping[str, Mapping[str, str]] | None = None, ensembles: Sequence[str] = ()) -> None:
        super().__init__(f"apps-{source.name}", source.name, interval_s)
        self.source, self.store, self.attributor, self.aliases = source, store, attributor, aliases
        self.ensembles = tuple(ensembles)
        self.reads = 0
        self.skipped: Counter = Counter()  # what the last read skipped, by reason
        self.unreachable: list[str] = []  # targets the last read could not read

    def read_once(self, at: datetime | None = None) -> int:
        read = self.source.read() if at is None else self.source.read(at)  # type: ignore[call-arg]
        rows, skipped, kinds = store_read(self.store, read, self.attributor, self.aliases, self.ensembles)
        if self.reads == 0 or read.errors != self.unreachable:
            log.info("%s: %d page(s) of %s, %d row(s) stored%s%s", self.source.name, len(read.pages),
                     ", ".join(kinds) or "no known server", rows, f"; skipped {dict(skipped)}" if skipped else "",
                     f"; unreachable: {'; '.join(read.errors)}" if read.errors else "")
        self.skipped, self.unreachable = skipped, read.errors
        self.reads += 1
        self.succeeded()
        return rows

    poll = read_once

    def wait_s(self) -> float:
        # a source reading history (Prometheus) says so: read the next chunk at once
        return 0 if getattr(self.source, "catching_up", False) and not self.last_error else self.interval_s

    def state(self) -> dict:
        """For /healthz: the source, reads so far, what the last read skipped and could not reach."""
        return {"source": self.source.name, "reads": self.reads, "failures": self.failures,
                "last_error": self.last_error, "skipped": dict(self.skipped), "unreachable": list(self.unreachable),
                "seconds_since_read": None if self.last_success is None
                else round(time.monotonic() - self.last_success, 1)}
