"""Render every dashboard page of the demo in headless Chromium and print how long each takes, next to one plain
API call in the same run (`GET /v1/costs`, what the header needs); optionally save a screenshot of every page and
of the weekly report (admin and team pages).

    python benchmarks/dashboard.py [--days 14] [--screenshots docs/screenshots]

It builds the demo's simulated store (48 GPUs, `--days` of history at 60 s) in a temporary folder, serves the API
and the dashboard on free ports of 127.0.0.1, and drives Debian's Chromium (/usr/bin/chromium) with Playwright.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import time
from pathlib import Path

import requests

from gpuledger.analytics.config import Config
from gpuledger.deploy.dashboard_proc import start_dashboard
from gpuledger.deploy.demo import DEMO_SLOS, build_demo_store
from gpuledger.deploy.server import ApiServer

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
# tab -> a text that shows once the page has rendered
PAGES = {"Overview": "Cost per day by team", "Teams": "Cost by GPU model", "Jobs": "Search job id",
         "Workloads": "Scheduler and telemetry: where they disagree", "Inference": "Services against their SLOs",
         "Cost & waste": "Waste per team", "Fairshare": "Fairshare factor per team",
         "Recommendations": "Decision history", "GPU health": "GPU health events", "Nodes": "Fragmentation: idle GPU"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=14.0, help="days of simulated history (default 14)")
    parser.add_argument("--screenshots", type=Path, help="save a PNG of every page into this folder")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(slo=dict(DEMO_SLOS))  # as `gpuledger demo` runs it
        store, _ = build_demo_store(Path(tmp) / "demo.duckdb", config, args.days, 7, 60.0, echo=lambda _: None)
        api = ApiServer(store, config, port=0, token="bench", open_reads=True)
        url = api.start()
        baseline = []
        for _ in range(5):
            began = time.perf_counter()
            requests.get(f"{url}/v1/costs", params={"days": 7}, timeout=60).raise_for_status()
            baseline.append(time.perf_counter() - began)
        base = statistics.median(baseline)
        proc, dash = start_dashboard(url, port=free_port(), token="bench")
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                page = browser.new_page(viewport={"width": 1440, "height": 1000})
                began = time.perf_counter()
                page.goto(dash)
                page.get_by_text("Cluster utilization over time").wait_for(timeout=120_000)
                first = time.perf_counter() - began
                print(f"baseline GET /v1/costs: {base * 1000:.0f} ms (median of 5)")
                print(f"{'page':16} {'s':>6} {'x baseline':>11}")
                print(f"{'first load':16} {first:6.2f} {first / base:11.1f}")
                for tab, text in PAGES.items():
                    began = time.perf_counter()
                    page.get_by_role("tab", name=tab).click()
                    page.get_by_text(text).first.wait_for(state="visible", timeout=60_000)
                    took = time.perf_counter() - began
                    print(f"{tab:16} {took:6.2f} {took / base:11.1f}")
                    if args.screenshots:  # the whole page: its run over, its charts drawn
                        page.get_by_test_id("stStatusWidget").wait_for(state="hidden", timeout=60_000)
                        page.wait_for_timeout(1_500)
                        args.screenshots.mkdir(parents=True, exist_ok=True)
                        page.screenshot(path=str(args.screenshots / f"{tab.split()[0].lower()}.png"),
                                        full_page=True)
                page.get_by_role("tab", name="Overview").click()
                page.get_by_text(PAGES["Overview"]).first.wait_for(state="visible", timeout=60_000)
                total = page.get_by_test_id("stMetricValue").first
                shown = total.inner_text()
                slider = page.get_by_role("slider").first
                slider.focus()
                began = time.perf_counter()
                slider.press("ArrowLeft")  # 7 -> 6 days: the page redraws with a smaller total
                while total.inner_text() == shown and time.perf_counter() - began < 60:
                    time.sleep(0.02)
                page.get_by_test_id("stStatusWidget").wait_for(state="hidden", timeout=60_000)  # the run is over
                redraw = time.perf_counter() - began
                print(f"{'window change':16} {redraw:6.2f} {redraw / base:11.1f}")
                if args.screenshots:  # and the weekly report, as a team lead and an admin open it
                    from gpuledger.deploy.server import weekly_report
                    files = weekly_report(store, config, Path(tmp) / "reports", "current")
                    for name, path in (("report", files.html), ("report-team", files.team_pages.get("nlp"))):
                        if path:
                            page.goto(path.resolve().as_uri())
                            page.screenshot(path=str(args.screenshots / f"{name}.png"), full_page=True)
                browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=20)
            api.stop()
            store.close()


if __name__ == "__main__":
    main()
