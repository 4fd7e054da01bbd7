"""Per-team and per-node gauges on the server's /metrics, for Grafana: what the cluster does over the last hour.

Also the GPU health events stored, per node and kind (a counter), and the fragmented GPUs (FGD). Computed from the
store when Prometheus scrapes, at most once per `cache_s` (the fairshare factor reads the algorithm's whole
memory), so a 15 s scrape interval costs one evaluation a minute. Series are labelled
`team` (including `unattributed` and `__idle__`, the idle capacity) or `node`.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Callable, Iterator

import pandas as pd
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuledger.analytics.budgets import budget_status
from gpuledger.analytics import fragmentation as frag
from gpuledger.analytics.config import Config
from gpuledger.analytics.health import health_totals
from gpuledger.analytics.store import Store
from gpuledger.analytics.inference import service_table, team_inference
from gpuledger.analytics.usage import node_gauges, team_gauges
from gpuledger.analytics.windows import utc_now
from gpuledger.analytics.workloads import workload_summary
from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED
from gpuledger.policies.fairshare import fairshare_at

WINDOW = timedelta(hours=1)
TEAM_GAUGES = (
    ("allocated_gpus", "gpuledger_team_allocated_gpus", "GPUs held by the team's jobs (idle capacity: free GPUs), "
                                                        "average over the last hour"),
    ("busy_gpus", "gpuledger_team_busy_gpus", "GPUs held and busy (at or over the idle threshold), last hour"),
    ("idle_gpus", "gpuledger_team_idle_gpus", "GPUs held but idle, average over the last hour"),
    ("cost_usd_per_hour", "gpuledger_team_cost_usd_per_hour", "Cost at the rate card, USD per hour, last hour"),
    # profiling means over the held GPU-seconds that read them: no series where no GPU of the team reports the field
    ("sm_active", "gpuledger_team_sm_active_ratio", "SM active of the team's GPUs (0..1), last hour; GPU_UTIL high "
                                                    "with this low is busy but starved"),
    ("sm_occupancy", "gpuledger_team_sm_occupancy_ratio", "SM occupancy of the team's GPUs (0..1), last hour"),
    ("tensor_active", "gpuledger_team_tensor_active_ratio", "Tensor pipes active on the team's GPUs (0..1), last "
                                                            "hour"),
    ("dram_active", "gpuledger_team_dram_active_ratio", "DRAM active on the team's GPUs (0..1), last hour"),
)
NODE_GAUGES = (
    ("gpus", "gpuledger_node_gpus", "GPUs present (MIG instances as fractions), average over the last hour"),
    ("allocated_gpus", "gpuledger_node_allocated_gpus", "GPUs held by jobs, average over the last hour"),
    ("busy_gpus", "gpuledger_node_busy_gpus", "GPUs held and busy, average over the last hour"),
)
# per team and GPU model, from the schedulers' job records (analytics/workloads.py): the queue now and the last hour
QUEUE_GAUGES = (
    ("pending_jobs", "gpuledger_team_pending_jobs", "Jobs waiting in the scheduler's queue now"),
    ("pending_gpus", "gpuledger_team_pending_gpus", "GPUs the waiting jobs ask for"),
    ("longest_pending_minutes", "gpuledger_team_longest_wait_minutes", "Longest wait so far of a waiting job, "
                                                                       "minutes"),
    ("wait_p95_minutes", "gpuledger_team_queue_wait_p95_minutes", "95th percentile queue wait of the jobs that "
                                                                  "started in the last hour, minutes"),
    ("lost_gpu_hours", "gpuledger_team_lost_gpu_hours", "GPU-hours of jobs that failed or were preempted, timed out, "
                                                        "ran out of memory or lost their node, last hour"),
    ("gang_jobs_waiting", "gpuledger_team_gang_jobs_waiting", "Waiting jobs of several GPUs or pods that must start "
                                                              "together"),
    ("gang_gpus_waiting", "gpuledger_team_gang_gpus_waiting", "GPUs those gang jobs wait for, all at once"),
)
# per inference service (server kind, model served, team) over the last hour (analytics/inference.py)
SERVICE_GAUGES = (
    ("cost_per_million_tokens", "gpuledger_service_cost_per_million_tokens_usd", "GPU cost of the service's pods "
                                                                                 "per million prompt + generated "
                                                                                 "tokens, USD, last hour"),
    ("cost_per_thousand_requests", "gpuledger_service_cost_per_thousand_requests_usd", "GPU cost per thousand "
                                                                                       "requests, USD, last hour"),
    ("generation_tokens_per_s", "gpuledger_service_generation_tokens_per_second", "Tokens generated per second, "
                                                                                  "last hour"),
    ("requests_per_s", "gpuledger_service_requests_per_second", "Requests finished per second, last hour"),
    ("ttft_p95_s", "gpuledger_service_ttft_p95_seconds", "Time to first token, 95th percentile, last hour"),
    ("tpot_p95_s", "gpuledger_service_tpot_p95_seconds", "Time per output token, 95th percentile, last hour"),
    ("e2e_p95_s", "gpuledger_service_e2e_p95_seconds", "End-to-end request latency, 95th percentile, last hour"),
    ("slo_missed_now", "gpuledger_service_slo_missed", "1 when the service missed its latency objective over the "
                                                       "last hour, 0 when it met it; no series without an SLO"),
)
TEAM_INFERENCE_GAUGES = (
    ("cost_per_million_tokens", "gpuledger_team_cost_per_million_tokens_usd", "GPU cost of the team's inference "
                                                                              "services per million tokens, USD, "
                                                                              "last hour"),
)
# per team with a budget, in the ledger period in progress (analytics/budgets.py); the shipped alerting rules
# (deploy/prometheus/gpuledger-alerts.yml) compare these
BUDGET_GAUGES = (
    ("budget_usd", "gpuledger_team_budget_usd", "The team's budget for the ledger period in progress, USD"),
    ("spend_usd", "gpuledger_team_period_spend_usd", "The team's cost so far in the ledger period in progress, USD"),
    ("forecast_usd", "gpuledger_team_period_forecast_usd", "The team's cost forecast at the period's end, USD (no "
                                                           "series without a day of history)"),
)
FAIRSHARE = "gpuledger_team_fairshare"
# how many team label values the gauges carry: the configured teams and the bill's buckets always, then other teams
# up to this many in all; the rest are one team "other" (sums where the figure adds up across teams, the largest
# where it is a longest wait, no series where it is a ratio or a percentile). One agent push of 5,000 team names
# took /metrics from 274 to 20,270 series.
MAX_TEAM_LABELS = 200
OTHER = "other"
ADDITIVE = {"allocated_gpus", "busy_gpus", "idle_gpus", "cost_usd_per_hour", "pending_jobs", "pending_gpus",
            "lost_gpu_hours", "gang_jobs_waiting", "gang_gpus_waiting"}
LARGEST = {"longest_pending_minutes"}
HEALTH_EVENTS = "gpuledger_gpu_health_events"  # a counter: exposed with _total
NODE_FRAGMENTED, CLUSTER_FRAGMENTED = "gpuledger_node_fragmented_gpus", "gpuledger_cluster_fragmented_gpus"
# the families not built from a table of gauges above: (name, kind, labels, help), listed once for the reference
OTHER_FAMILIES = (
    (FAIRSHARE, "gauge", ("team",), "Fairshare factor (by [fairshare] algorithm), 0..1, higher = more deserving"),
    (HEALTH_EVENTS, "counter", ("node", "kind"), "GPU health events stored (XID, throttling starts, ECC and row-remap "
                                                 "increases), per node and kind"),
    (NODE_FRAGMENTED, "gauge", ("node",), "Idle GPU the typical job of the last week cannot use (FGD), GPUs"),
    (CLUSTER_FRAGMENTED, "gauge", (), "Idle GPU the typical job of the last week cannot use (FGD), GPUs, whole "
                                      "cluster"),
)
HELP = {name: doc for name, _, _, doc in OTHER_FAMILIES}


class StoreGauges(Collector):
    def __init__(self, store: Store, config: Config, cache_s: float = 60.0,
                 clock: Callable[[], datetime] = utc_now) -> None:
        self.store = store
        self.clock = clock  # "now": the hour the gauges describe ends here
        self.config = config
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._cached: tuple[float, list[GaugeMetricFamily | CounterMetricFamily]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] >= self.cache_s:
                self._cached = (time.monotonic(), self._families())
            families = self._cached[1]
        yield from families

    def _families(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        end = self.clock()
        idle = self.config.waste.idle_util_pct
        teams = team_gauges(self.store, end - WINDOW, end, idle)
        queues = workload_summary(self.store, end - WINDOW, end, end)
        allowed = self._allowed(pd.concat([teams["team"], queues["team"]]))
        families = _gauges(bounded(teams, ["team"], allowed), "team", TEAM_GAUGES)
        families += _gauges(node_gauges(self.store, end - WINDOW, end, idle), "node", NODE_GAUGES)
        families += _gauges(bounded(queues, ["team", "gpu_model"], allowed), ("team", "gpu_model"), QUEUE_GAUGES)
        fair = GaugeMetricFamily(FAIRSHARE, f"Fairshare factor ({self.config.fairshare.algorithm}), 0..1, higher = "
                                            "more deserving", labels=["team"])
        for team, row in fairshare_at(self.store, self.config, end).iterrows():
            if str(team) in allowed:  # a factor of "other" would mean nothing
                fair.add_metric([str(team)], float(row["fairshare"]))
        families.append(fair)
        health = CounterMetricFamily(HEALTH_EVENTS, HELP[HEALTH_EVENTS], labels=["node", "kind"])
        for node, kind, events in health_totals(self.store).itertuples(index=False):
            health.add_metric([str(node), str(kind)], float(events))
        families.append(health)
        families += _fragmentation(self.store, end)
        services = service_table(self.store, end - WINDOW, end, self.config.slo)
        if not services.empty:
            services["slo_missed_now"] = services["slo_status"].map({"missed": 1.0, "met": 0.0})
        else:
            services = services.assign(**{c: pd.Series(dtype=float) for c, _, _ in SERVICE_GAUGES},
                                       kind=pd.Series(dtype=object), service=pd.Series(dtype=object),
                                       team=pd.Series(dtype=object))
        families += _gauges(services, ("kind", "service", "team"), SERVICE_GAUGES)
        families += _gauges(team_inference(services), "team", TEAM_INFERENCE_GAUGES)
        budgets = pd.DataFrame(budget_status(self.store, self.config, end),
                               columns=["team", *[column for column, _, _ in BUDGET_GAUGES]])
        families += _gauges(budgets, "team", BUDGET_GAUGES)
        return families


    def _allowed(self, seen: pd.Series) -> set[str]:
        """The team label values the gauges carry (MAX_TEAM_LABELS)."""
        always = set(self.config.teams) | {UNATTRIBUTED, IDLE_CAPACITY} | set(self.config.budgets)
        others = sorted(set(seen.dropna().astype(str)) - always)
        return always | set(others[:max(0, MAX_TEAM_LABELS - len(always))])


def bounded(frame: pd.DataFrame, labels: list[str], allowed: set[str]) -> pd.DataFrame:
    """`frame` (a row per label set, `labels[0]` the team) with the teams not `allowed` folded into one team
    `other`: ADDITIVE columns summed, LARGEST columns their largest, every other column left out of it."""
    if frame.empty or frame[labels[0]].isin(allowed).all():
        return frame
    outside = ~frame[labels[0]].isin(allowed)
    rest = frame[outside].assign(**{labels[0]: OTHER})
    numbers = [c for c in frame.columns if c not in labels]
    agg = {c: ("sum" if c in ADDITIVE else "max") for c in numbers if c in ADDITIVE or c in LARGEST}
    folded = rest.groupby(labels, as_index=False).agg(agg) if agg else rest[labels].drop_duplicates()
    return pd.concat([frame[~outside], folded.reindex(columns=frame.columns)], ignore_index=True)


def _fragmentation(store: Store, end: datetime) -> list[GaugeMetricFamily]:
    """Fragmented GPUs (FGD) at the newest samples, per node and in all, against the last week's jobs; nothing
    before there is data."""
    _, nodes, workload = frag.current_state(store, end, days=7)
    if workload is None or not nodes.names:
        return []
    report = frag.node_report(nodes, workload)
    per_node = GaugeMetricFamily(NODE_FRAGMENTED, HELP[NODE_FRAGMENTED], labels=["node"])
    for node, value in zip(report["node"], report["fragmented_gpus"]):
        per_node.add_metric([str(node)], float(value))
    cluster = GaugeMetricFamily(CLUSTER_FRAGMENTED, HELP[CLUSTER_FRAGMENTED])
    cluster.add_metric([], float(report["fragmented_gpus"].sum()))
    return [per_node, cluster]


def _gauges(frame: pd.DataFrame, label: str | tuple[str, ...],
            specs: tuple[tuple[str, str, str], ...]) -> list[GaugeMetricFamily]:
    """One gauge family per (column, name, help), a series per row labelled by the frame's `label` column(s)."""
    labels = [label] if isinstance(label, str) else list(label)
    families = []
    for column, name, doc in specs:
        family = GaugeMetricFamily(name, doc, labels=labels)
        for keys, value in zip(frame[labels].itertuples(index=False), frame[column]):
            if pd.notna(value):  # no reading: no series (unknown is not zero, and NaN is not a reading)
                family.add_metric([str(k) for k in keys], float(value))
        families.append(family)
    return families
