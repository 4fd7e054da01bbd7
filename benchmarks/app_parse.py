"""Time to read an inference server's /metrics page: collector/apps read_page against prometheus_client's parser.

Usage: python benchmarks/app_parse.py [--models N] [--engines N] [--repeats R]
The page is written by prometheus_client itself (so it has what a real vLLM page has: every histogram bucket,
`_created` gauges, `model_name`/`engine` labels) with vLLM's V1 families and bucket bounds (vllm/v1/metrics/
loggers.py): by default 10 models x 7 engines x 29 series = 2,030 series, as a federated page of several vLLM
servers would carry. Both readers run on the same text in the same process, several times; the best and median
times are printed with the ratio. prometheus_client only parses (text -> families); read_page also groups the
series, maps them to figures, checks them and builds the rows, so the comparison is conservative.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.collector.apps import read_page
from gpuledger.collector.prom_text import PromTextParser

TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
           960.0, 1920.0, 7680.0)
TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
STEP_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REASONS = ("stop", "length", "abort", "error", "repetition")


def vllm_page(models: int, engines: int, seed: int = 7) -> tuple[str, int]:
    """(page text, number of series) of `models` x `engines` vLLM engines with some traffic observed."""
    rng = random.Random(seed)
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    gauges = [Gauge(n, n, labels, registry=registry) for n in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc")]
    counters = [Counter(n, n, labels, registry=registry) for n in (
        "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions", "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits")]
    success = Counter("vllm:request_success", "finished requests", labels + ["finished_reason"], registry=registry)
    histograms = [Histogram(n, n, labels, buckets=b, registry=registry) for n, b in (
        ("vllm:time_to_first_token_seconds", TTFT), ("vllm:inter_token_latency_seconds", ITL),
        ("vllm:time_per_output_token_seconds", ITL), ("vllm:request_time_per_output_token_seconds", ITL),
        ("vllm:e2e_request_latency_seconds", REQUEST), ("vllm:request_queue_time_seconds", REQUEST),
        ("vllm:request_inference_time_seconds", REQUEST), ("vllm:request_prefill_time_seconds", REQUEST),
        ("vllm:request_decode_time_seconds", REQUEST), ("vllm:request_prompt_tokens", TOKENS),
        ("vllm:request_generation_tokens", TOKENS), ("vllm:iteration_tokens_total", STEP_TOKENS),
        ("vllm:request_max_num_generation_tokens", TOKENS), ("vllm:request_params_n", (1, 2, 5, 10, 20)),
        ("vllm:request_params_max_tokens", TOKENS))]
    series = 0
    for m in range(models):
        for e in range(engines):
            values = (f"org/model-{m}-7B-Instruct", str(e))
            for gauge in gauges:
                gauge.labels(*values).set(rng.random())
            for counter in counters:
                counter.labels(*values).inc(rng.randint(0, 10**6))
            for reason in REASONS:
                success.labels(*values, reason).inc(rng.randint(0, 1000))
            for histogram in histograms:
                child = histogram.labels(*values)
                for _ in range(20):
                    child.observe(rng.lognormvariate(0, 1.5))
            series += len(gauges) + len(counters) + len(REASONS) + len(histograms)
    return generate_latest(registry).decode(), series


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(best, median) seconds of fn() over `repeats` runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=10, help="served models on the page (default 10)")
    parser.add_argument("--engines", type=int, default=7, help="engines per model (default 7)")
    parser.add_argument("--repeats", type=int, default=7, help="runs of each reader (default 7)")
    args = parser.parse_args()
    page, series = vllm_page(args.models, args.engines)
    lines = sum(1 for line in page.splitlines() if line and not line.startswith("#"))
    print(f"page: {len(page):,} bytes, {lines:,} sample lines, {series:,} series "
          f"({args.models} models x {args.engines} engines)")

    def baseline() -> int:
        return sum(len(family.samples) for family in text_string_to_metric_families(page))

    def cold() -> int:
        return len(read_page(page).rows)

    warm_parser = PromTextParser()

    def warm() -> int:  # a scrape loop keeps one parser per endpoint: repeated label sets are parsed once
        return len(read_page(page, parser=warm_parser).rows)

    rows = cold()
    assert rows > 0 and baseline() >= lines - 10, "nothing read"
    base_best, base_median = timed(baseline, args.repeats)
    cold_best, cold_median = timed(cold, args.repeats)
    warm_best, warm_median = timed(warm, args.repeats)
    print(f"rows: {rows:,} (figures of the page's series in canonical units)")
    print(f"prometheus_client text_string_to_metric_families : best {base_best * 1e3:8.1f} ms  "
          f"median {base_median * 1e3:8.1f} ms")
    print(f"gpuledger read_page, new parser                   : best {cold_best * 1e3:8.1f} ms  "
          f"median {cold_median * 1e3:8.1f} ms  ({base_median / cold_median:.1f}x faster)")
    print(f"gpuledger read_page, parser kept across scrapes   : best {warm_best * 1e3:8.1f} ms  "
          f"median {warm_median * 1e3:8.1f} ms  ({base_median / warm_median:.1f}x faster)")


if __name__ == "__main__":
    main()
