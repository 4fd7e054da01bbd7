"""Job lifecycle and scheduler queues read continuously from a Prometheus that already scrapes kube-state-metrics
and (where they run) Kueue or KAI: the convention OpenCost and KAI's own dashboards use, so gpuledger needs no
access to the Kubernetes API.

Pods: each kube-state-metrics family is read with `last_over_time(<family>[W])`, W the time since the previous
read (the first read: `since`, the backfill), so a pod that started, finished and was deleted between two reads
is still seen with its last phase, times and reasons; one query per family because Prometheus drops the metric
name from a function's result. The pods are then read exactly as a page is (kube_state.pods_as_jobs). Which pods
exist now is an instant query of `kube_pod_status_phase`: a pod stored as pending or running that is no longer
listed left the queue (deleted), and stops counting as queued demand.

Queues: Kueue's and KAI's families are read at the instant of each read (they are gauges and cumulative
histograms, so a snapshot per read is their history from the first read on; no backfill) and read as their pages
are (kueue.py, kai.py). A family Prometheus does not have gives no rows, never zeros.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pandas as pd
import requests

from gpuledger.collector.jobs.kai import kai_rows
from gpuledger.collector.jobs.kube_state import LEGACY_GPU_REQUESTS, NODE_LABELS, SOURCE as KUBERNETES, pods_as_jobs
from gpuledger.collector.jobs.kueue import kueue_rows
from gpuledger.collector.jobs.lifecycle import JobBatch
from gpuledger.collector.jobs.queues import QUEUE_COLUMNS
from gpuledger.collector.prometheus_source import query_prometheus

POD_FAMILIES = ("kube_pod_created", "kube_pod_status_scheduled_time", "kube_pod_start_time",
                "kube_pod_completion_time", "kube_pod_status_phase", "kube_pod_status_reason",
                "kube_pod_status_unschedulable", "kube_pod_container_status_restarts_total",
                "kube_pod_container_status_last_terminated_reason", "kube_pod_owner", "kube_pod_labels",
                "kube_pod_annotations",
                "kube_pod_info", 'kube_pod_container_resource_requests{resource="nvidia_com_gpu"}',
                LEGACY_GPU_REQUESTS, NODE_LABELS)
KUEUE_SELECTOR = ('{__name__=~"kueue_cluster_queue_(nominal_quota|borrowing_limit|lending_limit|resource_usage|'
                  'resource_reservation)|kueue_pending_workloads|kueue_admitted_active_workloads|'
                  'kueue_admission_wait_time_seconds_(bucket|sum|count)|kueue_evicted_workloads_total"}')
KAI_SELECTOR = '{__name__=~"(.+_)?queue_(deserved_gpus|allocated_gpus|fair_share_gpu|info)"}'


@dataclass
class LifecycleRead:
    """One read: the pods as jobs, the pods listed now (job ids), the queue rows, when it was taken."""
    jobs: JobBatch
    listed_now: list[str]
    queues: pd.DataFrame
    at: datetime
    skipped: Counter
    missing: list[str]  # what Prometheus did not have (no kube-state-metrics pod series, ...), said, never guessed


class PrometheusLifecycle:
    """Reads pods (kube-state-metrics) and queues (Kueue, KAI) from Prometheus' HTTP API, read after read."""

    source_name = KUBERNETES

    def __init__(self, url: str, team_label: str | None = "team", since: timedelta = timedelta(days=7),
                 class_label: str | None = None, timeout_s: float = 60.0,
                 session: requests.Session | None = None, clock: Callable[[], datetime] | None = None) -> None:
        self.url = url.rstrip("/")
        self.name = f"prometheus-jobs:{self.url}"
        self.team_label = team_label
        self.class_label = class_label
        self.timeout_s = timeout_s
        self.session = session or requests.Session()
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self.since = since
        self.last_read: datetime | None = None

    def read(self) -> LifecycleRead:
        at = self.clock()
        window = self.since if self.last_read is None else (at - self.last_read) + timedelta(minutes=1)
        seconds = max(1, math.ceil(window.total_seconds()))
        samples: list[tuple[str, dict[str, str], float, Any]] = []
        for family in POD_FAMILIES:
            name = family.split("{", 1)[0]
            samples += _samples(self._query(f"last_over_time({family}[{seconds}s])", at), name)
        jobs = pods_as_jobs(samples, self.team_label, class_label=self.class_label)
        missing = [] if samples else ["kube-state-metrics (no kube_pod_* series in Prometheus: no pod lifecycle)"]
        listed = sorted({f"{s[1].get('namespace', '')}/{s[1]['pod']}"
                         for s in _samples(self._query("kube_pod_status_phase", at), "kube_pod_status_phase")
                         if s[1].get("pod")})
        skipped: Counter = Counter()
        kueue = kueue_rows(_samples(self._query(KUEUE_SELECTOR, at)), at, skipped)
        kai = kai_rows(_samples(self._query(KAI_SELECTOR, at)), at, skipped)
        frames = [f for f in (kueue.rows, kai.rows) if len(f)]
        if not frames:
            missing.append("Kueue and KAI metrics (no kueue_* or queue_*_gpus series: the quotas in force are not "
                           "known)")
        queues = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(QUEUE_COLUMNS))
        self.last_read = at
        return LifecycleRead(jobs, listed, queues, at, skipped, missing)

    def _query(self, query: str, at: datetime) -> list[dict[str, Any]]:
        return query_prometheus(self.session, self.url, query, at, self.timeout_s)


def _samples(series: list[dict[str, Any]], name: str | None = None) -> list[tuple[str, dict[str, str], float, Any]]:
    """An instant vector as (family, labels, value, None), the shape a parsed page gives; `name` for a function's
    result, which has lost its metric name."""
    out = []
    for one in series:
        labels = dict(one.get("metric", {}))
        family = labels.pop("__name__", None) or name or ""
        try:
            value = float(one["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        out.append((family, labels, value, None))
    return out
