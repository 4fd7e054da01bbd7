"""Read inference servers' /metrics pages from a list of endpoints (`[[apps.targets]]` in the config).

Why a list: a site points gpuledger at its vLLM, Triton, TGI or SGLang servers the way it points Prometheus at
them. One server down must not stop the others: a target that cannot be read is named in the read's errors and the
rest are stored; the read fails as a whole (SourceError, retried next interval) only when no target answered. A page
is read as `gpuledger scrape` reads one (page_check.fetch_page: a timeout, and at most 50 MB: an endpoint that
streams without end cannot exhaust the server's memory).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Sequence

from gpuledger.collector.errors import InputError
from gpuledger.collector.page_check import fetch_page
from gpuledger.collector.source import SourceError

# where `serve --apps-from` reads inference servers' metrics: the config's targets, a Prometheus, or nowhere
APP_SOURCES = ("config", "prometheus", "none")


@dataclass(frozen=True)
class PageRead:
    """One page as fetched, with the pod or job the target says it serves."""
    text: str
    target: str
    namespace: str | None = None
    pod: str | None = None
    job_id: str | None = None
    at: datetime | None = None  # when it was read, where not at the read's instant (a scrape read from Prometheus)


@dataclass
class AppRead:
    at: datetime
    pages: list[PageRead] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # targets that could not be read, and why


class TargetsSource:
    """The configured endpoints, read one after the other each interval."""

    def __init__(self, targets: Sequence, timeout_s: float = 5.0) -> None:
        self.targets = list(targets)
        self.name = f"apps:{len(self.targets)} target(s)"
        self.timeout_s = timeout_s

    def read(self) -> AppRead:
        read = AppRead(at=datetime.now(timezone.utc))
        for target in self.targets:
            try:
                text = fetch_page(target.url, self.timeout_s)
            except InputError as exc:  # unreachable, refused, too big: one line naming the URL
                read.errors.append(str(exc))
                continue
            read.pages.append(PageRead(text, target.url, target.namespace, target.pod, target.job_id))
        if self.targets and not read.pages:
            raise SourceError(f"no inference server answered: {'; '.join(read.errors[:3])}")
        return read
