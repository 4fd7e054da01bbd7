"""vLLM /metrics pages for the simulated cluster's inference services, so the demo shows cost per million tokens.

Why a page and not rows: the demo's services go through the same reader (collector/apps) a real vLLM server's page
does, so what a new user sees a minute after `gpuledger demo` is what the parsers make of a page in vLLM's format
(the current family names: `vllm:kv_cache_usage_perc`, `vllm:inter_token_latency_seconds`, an `engine` label).

Each serving job of the simulator (its `vllm-serve` jobs and the showcase's `llm-serving`, time-sliced with batch
work) serves one model. Its counters grow with its load from the job's start; a few restart half way (their counters
reset, as a restarted server's do). Latencies are log-normal around a median set by the job: the time-sliced one is
several times slower and misses the demo's SLO; the others meet it, most with room to spare.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable

from gpuledger.collector.apps.targets import AppRead, PageRead

# vLLM's own bucket bounds for these histograms (vllm/engine/metrics.py, v0.7 to v0.10)
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3")
PROMPT_TOKENS, OUTPUT_TOKENS = 620.0, 180.0  # per request, mean
SIGMA = 0.45  # log-normal spread of every latency
RESTART_SHARE = 0.2  # of the services, restarted half way through


@dataclass(frozen=True)
class Service:
    """One simulated vLLM server: the pod it runs in, what it serves and how fast."""
    namespace: str
    pod: str
    job_id: str
    model: str
    start: float  # epoch seconds
    end: float
    requests_per_s: float
    ttft_median_s: float
    tpot_median_s: float
    restarts_at: float | None  # epoch seconds of a restart (counters reset), or None

    @property
    def target(self) -> str:
        return f"http://{self.pod}.{self.namespace}:8000/metrics"


def _draw(key: str, what: str) -> float:
    return int(hashlib.sha256(f"{key}\0{what}".encode()).hexdigest()[:8], 16) / 2 ** 32


def service_of(job_id: str, namespace: str, pod: str, start: float, end: float, util_pct: float,
               shared: bool) -> Service:
    """The service a serving job runs, fixed by its id: load from its utilisation, slower when time-sliced."""
    load = max(util_pct, 5.0) / 80.0
    slow = 6.0 if shared else 1.0 + 2.5 * _draw(job_id, "slow") ** 3  # most fast, a few several times slower
    restart = start + (end - start) / 2 if _draw(job_id, "restart") < RESTART_SHARE else None
    return Service(namespace=namespace, pod=pod, job_id=job_id, model=MODELS[int(_draw(job_id, "model") * 3)],
                   start=start, end=end, requests_per_s=(0.5 + 5.5 * _draw(job_id, "rate")) * load,
                   ttft_median_s=0.06 * slow, tpot_median_s=0.018 * slow, restarts_at=restart)


def _cdf(bound: float, median: float) -> float:
    """The share of log-normal observations at or under `bound`."""
    return 0.5 * (1.0 + math.erf((math.log(bound) - math.log(median)) / (SIGMA * math.sqrt(2.0))))


def _histogram(name: str, labels: str, bounds: Iterable[float], median: float, count: float) -> list[str]:
    lines = [f"# HELP {name} Histogram of {name.split(':')[1]}.", f"# TYPE {name} histogram"]
    for bound in bounds:
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {math.floor(count * _cdf(bound, median))}')
    mean = median * math.exp(SIGMA ** 2 / 2)
    lines += [f'{name}_bucket{{{labels},le="+Inf"}} {math.floor(count)}',
              f"{name}_count{{{labels}}} {math.floor(count)}", f"{name}_sum{{{labels}}} {math.floor(count) * mean:.6f}"]
    return lines


def page(service: Service, at: float) -> str | None:
    """The service's /metrics page at epoch `at`, or None when it does not run then."""
    if not service.start <= at < service.end:
        return None
    since = service.restarts_at if service.restarts_at is not None and at >= service.restarts_at else service.start
    requests = service.requests_per_s * (at - since)
    labels = f'engine="0",model_name="{service.model}"'
    waiting = max(0.0, service.requests_per_s * (service.ttft_median_s - 0.1))
    # the KV cache holds the requests in flight: more of it the more requests and the slower they decode
    kv = min(0.95, 0.04 + 0.025 * service.requests_per_s * service.tpot_median_s / 0.018)
    e2e = service.ttft_median_s + OUTPUT_TOKENS * service.tpot_median_s
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {service.requests_per_s * e2e:.1f}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {waiting:.1f}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {kv:.4f}",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{labels}}} {math.floor(requests * PROMPT_TOKENS)}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {math.floor(requests * OUTPUT_TOKENS)}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} {math.floor(requests * 0.9)}',
        f'vllm:request_success_total{{{labels},finished_reason="length"}} {math.floor(requests * 0.1)}',
    ]
    lines += _histogram("vllm:time_to_first_token_seconds", labels, TTFT_BOUNDS, service.ttft_median_s, requests)
    lines += _histogram("vllm:inter_token_latency_seconds", labels, TPOT_BOUNDS, service.tpot_median_s,
                        requests * OUTPUT_TOKENS)
    lines += _histogram("vllm:e2e_request_latency_seconds", labels, E2E_BOUNDS, e2e, requests)
    return "\n".join(lines) + "\n"


class SimulatedApps:
    """The simulator's services as an app source: their pages at the wall-clock instant of each read."""

    def __init__(self, services: list[Service], clock: Callable[[], datetime] | None = None) -> None:
        self.services = services
        self.name = "apps:simulator"
        self.clock = clock or (lambda: datetime.now(timezone.utc))

    def read(self, at: datetime | None = None) -> AppRead:
        at = at or self.clock()
        read = AppRead(at=at)
        for service in self.services:
            text = page(service, at.timestamp())
            if text is not None:
                read.pages.append(PageRead(text, service.target, service.namespace, service.pod, service.job_id))
        return read
