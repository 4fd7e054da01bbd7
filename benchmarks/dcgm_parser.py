"""Throughput of our dcgm-exporter page parser against prometheus_client's parser, same pages, same process.

Usage: python benchmarks/dcgm_parser.py [--nodes N] [--seconds S]
Prints samples/s for both parsers (text -> list of samples) and for our full page -> Arrow
table path, and the ratio. The page is rendered from the simulator with dcgm-exporter's
label layout (pod labels included), one node of 8 GPUs per page.
"""
from __future__ import annotations

import argparse
import time
from datetime import datetime, timezone

from prometheus_client.parser import text_string_to_metric_families

from gpuledger.collector.dcgm_render import render_page
from gpuledger.collector.dcgm_source import DcgmPageConverter
from gpuledger.collector.prom_text import PromTextParser
from gpuledger.collector.simulator import default_simulator


def rate(fn, seconds: float) -> tuple[float, int]:
    """Samples per second of fn() over at least `seconds` (fn returns a sample count)."""
    count = runs = 0
    start = time.perf_counter()
    while True:
        count += fn()
        runs += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and runs >= 3:
            return count / elapsed, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement (default 3)")
    args = parser.parse_args()
    sim = default_simulator(days=1)
    table = sim.frame([datetime.now(timezone.utc).timestamp()], 30.0)
    page = render_page(table.slice(0, 8))  # one dcgm-exporter page = one 8-GPU node
    lines = sum(1 for line in page.splitlines() if line and not line.startswith("#"))
    print(f"page: {len(page):,} bytes, {lines} samples, 8 GPUs")

    def baseline() -> int:
        return sum(len(family.samples) for family in text_string_to_metric_families(page))

    ours = PromTextParser()

    def fast() -> int:
        return len(ours.parse(page).samples)

    def cold() -> int:  # first scrape of an exporter: nothing cached yet
        return len(PromTextParser().parse(page).samples)

    converter = DcgmPageConverter()
    now = datetime.now(timezone.utc)

    def full() -> int:
        converter.convert(page, now, 30.0)
        return lines

    assert baseline() == fast() == lines, "parsers disagree on the sample count"
    base_rate, _ = rate(baseline, args.seconds)
    fast_rate, _ = rate(fast, args.seconds)
    cold_rate, _ = rate(cold, args.seconds)
    full_rate, _ = rate(full, args.seconds)
    print(f"prometheus_client parser : {base_rate:12,.0f} samples/s")
    print(f"gpuledger parser         : {fast_rate:12,.0f} samples/s  ({fast_rate / base_rate:.1f}x)")
    print(f"gpuledger parser, cold   : {cold_rate:12,.0f} samples/s  ({cold_rate / base_rate:.1f}x)")
    print(f"gpuledger page -> Arrow  : {full_rate:12,.0f} samples/s  ({full_rate / base_rate:.1f}x)")


if __name__ == "__main__":
    main()
