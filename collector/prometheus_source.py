"""Read dcgm-exporter's series back from a Prometheus that already scrapes them: history first, then as it comes.

Most clusters run dcgm-exporter under Prometheus already, so gpuledger can start with the history Prometheus holds
(`--since 30d`) instead of an empty store, and keep following without a second scrape of every exporter.

Why raw samples and not `query_range`: a range query resamples every series onto a step grid, repeating the last
value for up to five minutes (Prometheus' lookback), so a missed scrape would be billed as if it had happened and
timestamps would move to the grid. An instant query of a range selector (`{...}[3600s]` at `time`) returns the
samples Prometheus stored, each at its scrape's instant: the rows are then exactly those a direct scrape of the
exporter would have stored at that instant, gaps included. History is read in chunks of `chunk` from a cursor
that only moves forward; samples at or before the cursor are skipped (a range selector includes both ends), so a
sample is read once. The cursor starts after the newest sample this source already stored (resume) or `since`
ago, and stops `settle_s` short of now so a scrape still being appended is read on the next pass, not missed.

Team labels and shared-GPU requests come from kube-state-metrics when Prometheus has it: `kube_pod_labels`
(`label_<team_label>`) and `kube_pod_container_resource_requests` for HAMi's `nvidia.com/gpucores` (per cent of a
GPU) and `nvidia.com/gpumem` (MiB). What each container of a shared GPU measurably used comes from HAMi's vGPU
monitor where Prometheus scrapes it (collector/apps/hami.py ContainerUse): read over the same stretch, each
instant's rows get the use of that instant, so a sharer carries its own utilisation and memory. The nodes'
topology (NVLink islands, P2P status) is what each node's newest page read says, as a direct scrape's would be.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pyarrow as pa
import requests

from gpuledger.collector.apps.hami import USE_FAMILIES, ContainerUse
from gpuledger.collector.attribution import Attributor
from gpuledger.collector.dcgm_source import DcgmPageConverter, PodFacts, with_use
from gpuledger.collector.metrics import SAMPLES_READ, SCRAPE_ERRORS, SCRAPE_SECONDS
from gpuledger.collector.samples import SAMPLE_SCHEMA
from gpuledger.collector.source import Source, SourceError
from gpuledger.collector.topology import NodeTopology

log = logging.getLogger(__name__)

# every dcgm-exporter generation: current names, 1.x names (lower case)
DCGM_SELECTOR = '{__name__=~"DCGM_FI_.*|dcgm_.*"}'
SOURCE = "prometheus"  # the rows' source column: where a restarted server resumes from
POD_LABELS = "kube_pod_labels"
POD_REQUESTS = 'kube_pod_container_resource_requests{resource=~"nvidia_com_gpucores|nvidia_com_gpumem"}'
HAMI_SELECTOR = '{__name__=~"' + "|".join(USE_FAMILIES) + '"}'


class PrometheusSource(Source):
    """Source that reads dcgm-exporter series from Prometheus' HTTP API: backfill, then follow."""

    def __init__(self, url: str, interval_s: float = 30.0, since: timedelta = timedelta(days=30),
                 chunk: timedelta = timedelta(hours=1),
                 attributor: Attributor | None = None, team_label: str = "team", settle_s: float | None = None,
                 timeout_s: float = 60.0, session: requests.Session | None = None,
                 clock: Callable[[], datetime] | None = None) -> None:
        """`interval_s`: Prometheus' scrape interval for the exporters (each sample stands for that long). History
        is read from `since` ago, or after what this source stored before (`resume_after`)."""
        self.url = url.rstrip("/")
        self.name = f"prometheus:{self.url}"
        self.interval_s = interval_s
        self.chunk = chunk
        self.team_label = team_label
        # a scrape is stored by the end of its timeout, at most the interval: read that (and clock skew) behind now
        self.settle = timedelta(seconds=interval_s + 5.0 if settle_s is None else settle_s)
        self.timeout_s = timeout_s
        self.session = session or requests.Session()
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self.cursor = self.clock() - since  # samples after it are still to read
        self.converter = DcgmPageConverter(attributor, source=SOURCE)
        self.topologies: dict[str, NodeTopology] = {}  # per node, as its newest page read says
        self.catching_up = True  # more history is waiting: the collect loop reads again at once
        self.source_name = SOURCE

    def resume_after(self, newest: datetime | None) -> None:
        """Carry on after the newest sample this source stored before (a restart), if that is later than `since`."""
        if newest is not None and newest > self.cursor:
            log.info("prometheus: resuming after %s, the newest sample stored from it", newest.isoformat())
            self.cursor = newest

    def collect(self) -> pa.Table:
        """The next chunk of samples after the cursor (history), or those since the last read (following)."""
        until = min(self.cursor + self.chunk, self.clock() - self.settle)
        if until <= self.cursor:
            self.catching_up = False
            return SAMPLE_SCHEMA.empty_table()
        started = time.perf_counter()
        try:
            series = self._query(f"{DCGM_SELECTOR}[{_seconds(until - self.cursor)}s]", until)
            facts = self._pod_facts(until)
            lookback = max(2 * self.interval_s, 60.0)  # a monitor sample this much older still stands for an instant
            span = _seconds(until - self.cursor) + int(lookback)
            use = ContainerUse([(s["metric"].get("__name__", ""), s["metric"], s.get("values", ()))
                                for s in self._query(f"{HAMI_SELECTOR}[{span}s]", until)], lookback)
        finally:
            SCRAPE_SECONDS.labels(source="prometheus").observe(time.perf_counter() - started)
        table = self._rows(series, self.cursor, until, facts, use)
        self.cursor = until
        self.catching_up = self.clock() - self.settle - until > timedelta(seconds=self.interval_s)
        SAMPLES_READ.labels(source="prometheus").inc(table.num_rows)
        return table

    def _rows(self, series: list[dict[str, Any]], after: datetime, until: datetime,
              facts: dict[tuple[str | None, str | None], PodFacts] | None = None,
              use: ContainerUse | None = None) -> pa.Table:
        """Regroup the series' samples by scrape instant and convert each instant's like one exporter page, with
        the pods' facts and, where HAMi's monitor measured it, each pod's use at that instant."""
        lo, hi = after.timestamp(), until.timestamp()
        by_instant: dict[float, list[tuple[str, dict[str, str], float, None]]] = defaultdict(list)
        for one in series:
            labels = dict(one["metric"])
            name = labels.pop("__name__", "")
            for ts, value in one.get("values", ()):
                if lo < ts <= hi:
                    by_instant[ts].append((name, labels, float(value), None))
        tables = []
        for ts, samples in sorted(by_instant.items()):
            self.converter.pods = with_use(facts or {}, use.at(ts) if use else {})
            tables.append(self.converter.convert_samples(samples, datetime.fromtimestamp(ts, timezone.utc),
                                                         self.interval_s))
            # each exporter is scraped at an instant of its own, so an instant holds one node's page: the pages of
            # the chunk's last two intervals hold every live node's newest (older ones are not worth the work in
            # a backfill of weeks)
            if ts > hi - 2 * self.interval_s:
                self.topologies.update((t.node, t) for t in self.converter.topology.topologies())
        tables = [t for t in tables if t.num_rows]
        return pa.concat_tables(tables) if tables else SAMPLE_SCHEMA.empty_table()

    def topology(self) -> list[NodeTopology]:
        """Each node's topology as the newest of its pages read says (collector/dcgm_topology.py): what the
        exporters report now, once the backfill has reached now."""
        return [self.topologies[node] for node in sorted(self.topologies)]

    def _pod_facts(self, at: datetime) -> dict[tuple[str | None, str | None], PodFacts]:
        """Team labels and shared-GPU requests per pod, from kube-state-metrics (none when Prometheus lacks it)."""
        teams: dict[tuple[str, str], str] = {}
        for one in self._query(POD_LABELS, at, instant=True):
            labels = one["metric"]
            team = labels.get(f"label_{self.team_label}")
            if team and labels.get("pod"):
                teams[(labels.get("namespace", ""), labels["pod"])] = team
        cores: dict[tuple[str, str], float] = defaultdict(float)
        memory: dict[tuple[str, str], float] = defaultdict(float)
        for one in self._query(POD_REQUESTS, at, instant=True):
            labels = one["metric"]
            key = (labels.get("namespace", ""), labels.get("pod", ""))
            value = float(one["value"][1])
            if labels.get("resource") == "nvidia_com_gpucores":
                cores[key] += value
            else:
                memory[key] += value
        return {key: PodFacts(team=teams.get(key), gpu_share=cores[key] / 100.0 if key in cores else None,
                              gpu_mem_mib=memory.get(key))
                for key in set(teams) | set(cores) | set(memory)}

    def _query(self, query: str, at: datetime, instant: bool = False) -> list[dict[str, Any]]:
        """One instant query; the result's series (a matrix for a range selector, a vector otherwise)."""
        return query_prometheus(self.session, self.url, query, at, self.timeout_s)


def query_prometheus(session: requests.Session, url: str, query: str, at: datetime,
                     timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """One instant query of Prometheus' HTTP API at `at`: the result's series (a matrix for a range selector, a
    vector otherwise). Unreachable, refused or malformed: SourceError, counted by reason."""
    try:
        response = session.get(f"{url}/api/v1/query", params={"query": query, "time": at.timestamp()},
                               timeout=timeout_s)
        body = response.json()
    except (requests.RequestException, ValueError) as exc:
        SCRAPE_ERRORS.labels(source="prometheus", reason=type(exc).__name__).inc()
        raise SourceError(f"cannot query Prometheus at {url}: {exc}") from exc
    if response.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
        SCRAPE_ERRORS.labels(source="prometheus", reason=f"http_{response.status_code}").inc()
        error = body.get("error") if isinstance(body, dict) else None
        raise SourceError(f"Prometheus at {url} refused {query!r}: {error or response.text[:200]}")
    try:
        return list(body["data"]["result"])
    except (KeyError, TypeError) as exc:
        raise SourceError(f"Prometheus at {url} answered {query!r} without a result") from exc


def _seconds(span: timedelta) -> int:
    """A range selector's length: whole seconds, rounded up, at least one."""
    return max(1, int(-(-span.total_seconds() // 1)))


__all__ = ["PrometheusSource", "DCGM_SELECTOR", "query_prometheus"]
