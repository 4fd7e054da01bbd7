"""How long do the analytics take on a big store? Every dashboard endpoint, the recommender and the weekly report,
next to one plain DuckDB aggregate scan of the same raw rows.

Usage: python benchmarks/analytics.py [--gpus 1000] [--days 7] [--interval 10] [--calls 20] [--db FILE|ducklake:...]

A store of --gpus simulated GPUs (8-GPU H100 nodes, the simulator's workload) × --days at --interval seconds is
built with the store's bulk append (the rows ingest would store). A real API server runs on 127.0.0.1 over it,
and each endpoint the dashboard calls is requested --calls times over HTTP (p50 and p95 reported); the
recommender's evaluation and the weekly report run in process. The baseline, in the same run, is DuckDB's own
`SELECT team, gpu_model, sum(interval_s * gpu_fraction) ... GROUP BY ALL` over every raw row.

The simulated cluster's serving jobs run vLLM servers whose pages are read every 5 minutes over the window (issue
23), so /v1/inference and the report's inference section are measured on a week of them; /v1/efficiency reads the
profiling rollups every sample carries.

With --jobs N (default 25 per GPU), the scheduler's tables are sized like a busy cluster's week (issue 22): N job
records over the window from a Slurm-like source (waits, runs, outcomes, gangs, what waits now, with their events)
and a Kueue and a KAI read every 5 minutes for a queue per team and GPU model, so /v1/workloads, its queue page and
the report's queue section are measured at that size too.

Goals (issue 10): the weekly report plus recommendations at most 2x the baseline scan, and every dashboard
endpoint under 1 s (p95) at 1,000 GPUs. The server's peak RSS is printed too.

--backlog (issue 26): the store is left unfolded (a new one is built without its fold; a reused one is taken as
it is, e.g. one whose fold a crash interrupted), and the server starts over it as after a restart: while it folds
the backlog in steps, every dashboard endpoint and the probes are requested round after round until it has caught
up, and their p50, p95 and worst latency (beside the scan) and answers (200, or 503 "catching up") are printed,
with the catch-up's length and rate. Goal: every endpoint under 1 s p95 throughout.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import requests

from gpuledger.analytics.config import Config, QuotaConfig
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.lake import is_lake
from gpuledger.analytics.windows import iso_week, utc_now
from gpuledger.collector.jobs.kai import kai_rows
from gpuledger.collector.jobs.kueue import kueue_rows
from gpuledger.collector.jobs.lifecycle import events_of, jobs_frame
from gpuledger.collector.apps.simulated import SimulatedApps
from gpuledger.collector.simulator import cluster_of
from gpuledger.deploy.app_loop import store_read
from gpuledger.deploy.demo import DEMO_SLOS
from gpuledger.deploy.server import ApiServer, weekly_report
from gpuledger.policies.recommender import evaluate

# what the dashboard asks for on one redraw (dashboard/app.py), with its default 7-day window
DASHBOARD = (
    ("/healthz", {}),
    ("/v1/cluster/utilization", {"days": 7, "bucket_minutes": 60}),
    ("/v1/costs", {"days": 7}),
    ("/v1/waste", {"days": 7, "limit": 100}),
    ("/v1/fairshare", {"days": 7}),
    ("/v1/recommendations", {}),
    ("/v1/recommendations/history", {"limit": 200}),
    ("/v1/nodes", {}),
    ("/v1/workloads", {"days": 7}),
    ("/v1/workloads/queues", {"days": 7}),
    ("/v1/efficiency", {"days": 7}),
    ("/v1/inference", {"days": 7}),
)


def build(target: str, gpus: int, days: float, interval_s: float,
          lake_data: str | None = None) -> tuple[Store, int, float, object]:
    now = utc_now().replace(minute=0, second=0, microsecond=0)
    sim = cluster_of(max(1, gpus // 8), days=days, now=now)
    store = Store(target, lake_data=lake_data if is_lake(target) else None)
    store._folded_at = float("inf")  # the load is timed alone; folding is timed by fold()
    store.set_rates(Config().rates)
    store.upsert_teams(sim.team_frame())
    store.set_team_quotas(sim.quota_frame())
    rows, started = 0, time.perf_counter()
    for table in sim.history(now - timedelta(days=days), now, step_s=interval_s, chunk_s=3600.0):
        rows += store.append_samples(table)
    store.upsert_jobs(sim.jobs_frame(now))
    store.checkpoint_if_due(min_wal_bytes=0)
    return store, rows, time.perf_counter() - started, sim


def busy_week(store: Store, teams: list[str], models: list[str], jobs: int, days: float, now: datetime) -> int:
    """`jobs` scheduler job records over the window, and Kueue and KAI reads every 5 minutes: what a busy
    cluster's week leaves in jobs, job_events and queue_metrics. Returns the rows stored in all."""
    rng = np.random.default_rng(22)
    start = now - timedelta(days=days)
    submit = np.sort(rng.uniform(0, days * 86400, jobs))
    wait = rng.exponential(1200, jobs) * np.where(rng.random(jobs) < 0.1, 20, 1)
    run = rng.lognormal(8.5, 1.2, jobs)
    gpus = rng.choice([1, 2, 4, 8, 16], jobs, p=[0.5, 0.15, 0.15, 0.15, 0.05])
    outcome = rng.choice(["completed", "failed", "timeout", "cancelled", "preempted", "out_of_memory"], jobs,
                         p=[0.8, 0.08, 0.04, 0.04, 0.02, 0.02])
    names = ["pretrain", "finetune", "vllm-serve", "jupyter", "bash", "eval-sweep"]
    records = []
    for i in range(jobs):
        sub = start + timedelta(seconds=float(submit[i]))
        began = sub + timedelta(seconds=float(wait[i]))
        ended = began + timedelta(seconds=float(run[i]))
        state = "pending" if began > now else "running" if ended > now else outcome[i]
        records.append({"job_id": f"bench:{i}", "team": teams[i % len(teams)], "user": f"u{i % 97}",
                        "gpu_model": models[i % len(models)], "gpus": int(gpus[i]), "submit_ts": sub,
                        "eligible_ts": sub, "start_ts": began if state != "pending" else None,
                        "end_ts": ended if state not in ("pending", "running") else None, "state": state,
                        "partition": "gpu", "restarts": int(rng.random() < 0.03),
                        "pending_reason": "Resources" if state == "pending" else None,
                        "name": names[i % len(names)], "source": "bench"})
    frame = jobs_frame(records)
    store.record_jobs(frame, events_of(frame))
    stored = len(frame) + store.scalar("SELECT count(*) FROM job_events")
    read, reads = start, []
    while read <= now:
        samples = []
        for t, team in enumerate(teams):
            for model in models:
                labels = {"cohort": "all", "cluster_queue": team, "flavor": model.lower(),
                          "resource": "nvidia.com/gpu"}
                samples += [("kueue_cluster_queue_nominal_quota", labels, 8.0, None),
                            ("kueue_cluster_queue_borrowing_limit", labels, 8.0, None),
                            ("kueue_cluster_queue_resource_usage", labels, float(t % 9), None)]
            queue = {"cluster_queue": team}
            samples += [("kueue_pending_workloads", {**queue, "status": "active"}, float(t % 4), None),
                        ("kueue_admitted_active_workloads", queue, 3.0, None),
                        ("kueue_admission_wait_time_seconds_count", queue, (read - start).total_seconds() / 60,
                         None),
                        ("kueue_admission_wait_time_seconds_sum", queue, (read - start).total_seconds() * 5, None)]
            samples += [("kueue_admission_wait_time_seconds_bucket", {**queue, "le": le},
                         (read - start).total_seconds() / 60 * share, None)
                        for le, share in (("1", 0.1), ("10", 0.4), ("80", 0.7), ("640", 0.95), ("+Inf", 1.0))]
            samples += [("kai_queue_deserved_gpus", {"queue_name": team}, 16.0, None),
                        ("kai_queue_allocated_gpus", {"queue_name": team}, float(t % 7), None)]
        reads += [kueue_rows(samples, read).rows, kai_rows(samples, read).rows]
        read += timedelta(minutes=5)
    return stored + store.record_queue_metrics(pd.concat(reads, ignore_index=True))


APP_READ_S = 300.0  # the inference services' pages: one read every 5 minutes over the window


def inference_week(store: Store, sim, days: float, now: datetime) -> tuple[int, int]:
    """The simulated cluster's serving jobs as vLLM servers (collector/apps/simulated.py), their pages read every
    APP_READ_S over the window through the same readers and store as a live server: (pages, rows stored)."""
    source = SimulatedApps(sim.services())
    attributor = Config().attributor()
    pages = rows = 0
    t = now - timedelta(days=days)
    while t < now:
        read = source.read(t)
        rows += store_read(store, read, attributor)[0]
        pages += len(read.pages)
        t += timedelta(seconds=APP_READ_S)
    return pages, rows


def fold(store: Store) -> float:
    """Fold whatever the bulk load left unfolded (a server does this every minute as samples arrive)."""
    began = time.perf_counter()
    store.fold()
    store.checkpoint_if_due(min_wal_bytes=0)
    return time.perf_counter() - began


def reset_peak_rss() -> None:
    """Linux: restart the peak-RSS mark (VmHWM), so the figure excludes building the store."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_rss_mib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn, repeat: int = 1) -> list[float]:
    out = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        out.append(time.perf_counter() - began)
    return out


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


PROBES = (("/livez", {}), ("/readyz", {}))


def during_catch_up(store: Store, url: str, scan: float, limit_s: float = 3600.0) -> None:
    """Rounds of every dashboard endpoint and probe while the server folds the backlog, until it has caught up
    (or `limit_s`): latency per endpoint and the answers' statuses, as a table, beside the scan."""
    lag = store.fold_lag()[1]
    print(f"backlog: {lag.total_seconds() / 60 if lag else 0:,.0f} minutes unfolded; requesting every endpoint "
          "until the server has caught up...", flush=True)
    times: dict[str, list[float]] = {path: [] for path, _ in DASHBOARD + PROBES}
    answers: dict[str, dict[int, int]] = {path: {} for path in times}
    began = time.perf_counter()
    rounds = 0
    while time.perf_counter() - began < limit_s:
        for path, params in DASHBOARD + PROBES:
            start = time.perf_counter()
            status = requests.get(url + path, params=params, timeout=600).status_code
            times[path].append(time.perf_counter() - start)
            answers[path][status] = answers[path].get(status, 0) + 1
        rounds += 1
        if requests.get(url + "/readyz", timeout=600).status_code == 200:
            break
    took = time.perf_counter() - began
    lag = store.fold_lag()[1]
    print(f"caught up in {took:.0f} s ({rounds} rounds; {lag.total_seconds() / 60 if lag else 0:.1f} minutes "
          f"behind at the end)\n")
    print(f"{'while folding':<40} {'p50 s':>8} {'p95 s':>8} {'worst s':>8} {'x scan':>8}  answers")
    for path, values in times.items():
        said = ", ".join(f"{n} x {status}" for status, n in sorted(answers[path].items()))
        print(f"{'GET ' + path:<40} {statistics.median(values):>8.3f} {p95(values):>8.3f} {max(values):>8.3f} "
              f"{max(values) / scan:>8.1f}  {said}")
    worst = max(p95(values) for values in times.values())
    print(f"\nworst p95 while folding: {worst:.3f} s (goal < 1 s); the scan: {scan:.3f} s\n", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--calls", type=int, default=20, help="requests per dashboard endpoint")
    parser.add_argument("--db", help="keep the store in this file, or a DuckLake catalog (ducklake:postgres:...); "
                                     "an existing one is reused as it is (measure again without rebuilding)")
    parser.add_argument("--lake-data", help="DuckLake only: the folder for a new lake's Parquet files")
    parser.add_argument("--jobs", type=int, help="scheduler job records over the window (default 25 per GPU); 0: "
                                                 "only the simulator's jobs")
    parser.add_argument("--backlog", action="store_true",
                        help="measure the endpoints while the server folds an unfolded backlog (see above)")
    args = parser.parse_args(argv)
    # the demo's latency objectives for the simulated vLLM services: the recommender's inference advice runs too
    config = Config(quota=QuotaConfig(window_days=min(14.0, args.days)), slo=dict(DEMO_SLOS))
    with tempfile.TemporaryDirectory() as tmp:
        lake = bool(args.db) and is_lake(args.db)
        target = args.db or str(Path(tmp) / "bench.duckdb")
        existing = Store(target, lake_data=args.lake_data) if lake else None
        if (existing is not None and existing.sample_count()) or (not lake and Path(target).exists()):
            store = existing or Store(target)
            rows = store.scalar("SELECT count(*) FROM samples")
            print(f"reusing {args.db}: {rows:,} samples", flush=True)
            fold_s = 0.0
        else:
            if existing is not None:
                existing.close()
            print(f"building {args.gpus} GPUs x {args.days:g} days at {args.interval:g} s"
                  f"{' on DuckLake' if lake else ''}...", flush=True)
            store, rows, build_s, sim = build(target, args.gpus, args.days, args.interval, args.lake_data)
            print(f"  {rows:,} samples in {build_s:.0f} s ({rows / build_s:,.0f} rows/s)")
            began = time.perf_counter()
            pages, app_rows = inference_week(store, sim, args.days, utc_now().replace(minute=0, second=0,
                                                                                        microsecond=0))
            print(f"  inference services: {len(sim.services()):,} vLLM servers, {pages:,} pages read every "
                  f"{APP_READ_S / 60:g} min: {app_rows:,} rows in {time.perf_counter() - began:.0f} s")
            jobs = 25 * args.gpus if args.jobs is None else args.jobs
            if jobs:
                teams = list(store.team_table()["team"])
                models = sorted(store.query("SELECT DISTINCT gpu_model FROM samples WHERE gpu_model IS NOT NULL")
                                ["gpu_model"])
                began = time.perf_counter()
                extra = busy_week(store, teams, models, jobs, args.days, utc_now())
                print(f"  scheduler tables: {jobs:,} job records, their events and a Kueue/KAI read every 5 "
                      f"minutes: {extra:,} rows in {time.perf_counter() - began:.0f} s")
            fold_s = 0.0 if args.backlog else fold(store)
        minute_rows = store.scalar("SELECT count(*) FROM usage_minute")
        hour_rows = store.scalar("SELECT count(*) FROM usage_hour")
        folded = f" folded in {fold_s:.0f} s ({rows / fold_s:,.0f} rows/s)" if fold_s else " (reused as stored)"
        print(f"  rollups{folded}: {minute_rows:,} minute rows "
              f"({rows / max(minute_rows, 1):.1f}x fewer), {hour_rows:,} hour rows ({rows / max(hour_rows, 1):.0f}x "
              f"fewer)\n")
        scan = min(timed(lambda: store.query(
            "SELECT team, gpu_model, sum(interval_s * gpu_fraction) / 3600.0 AS gpu_hours, "
            "sum(interval_s * gpu_fraction * coalesce(util_pct, 0)) AS used FROM samples GROUP BY ALL"), 3))
        print(f"baseline: one DuckDB aggregate scan of all {rows:,} rows: {scan:.3f} s\n")
        reset_peak_rss()  # from here on: what serving and the analytics take, not building the store
        server = ApiServer(store, config, port=0, open_reads=True)
        url = server.start()
        try:
            if args.backlog:
                during_catch_up(store, url, scan)
            print(f"{'what':<40} {'p50 s':>8} {'p95 s':>8} {'x scan':>8}")
            for path, params in DASHBOARD:
                times = timed(lambda: requests.get(url + path, params=params, timeout=600).raise_for_status(),
                              args.calls)
                print(f"{'GET ' + path:<40} {statistics.median(times):>8.3f} {p95(times):>8.3f} "
                      f"{p95(times) / scan:>8.1f}", flush=True)
        finally:
            server.stop()
        recommend = min(timed(lambda: evaluate(store, config), 2))
        week = iso_week("current")[2]
        report = min(timed(lambda: weekly_report(store, config, Path(tmp) / "reports", week), 2))
        print(f"{'recommender (evaluate)':<40} {recommend:>8.3f} {'':>8} {recommend / scan:>8.1f}")
        print(f"{'weekly report (' + week + ')':<40} {report:>8.3f} {'':>8} {report / scan:>8.1f}")
        print(f"\nreport + recommendations: {(report + recommend) / scan:.1f}x the scan (goal <= 2x); "
              f"peak RSS while serving and analysing (server in this process): {peak_rss_mib():,.0f} MiB")
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
