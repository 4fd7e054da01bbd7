"""How long does a what-if take on a 1,000-GPU cluster's week of jobs? Each scheduler model replays the week twice
(the quotas in force and a proposal), next to a baseline in the same process: reading the same job records from the
store and sorting them by submission in pandas.

Usage: python benchmarks/whatif.py [--gpus 1000] [--days 7] [--jobs N] [--models kueue,kai,slurm]

The store holds --jobs (default 25 per GPU) job records over the window, sized and timed like a busy cluster's
(1-16 GPUs, log-normal run times, ten teams, two GPU models; benchmarks/analytics.py's busy week), offered at about
the cluster's capacity so queues form. The teams' guarantees share the cluster by share; the proposal moves a
quarter of one team's guarantee to another. Goal (issue 25): a what-if under 10 s on this 2-core machine.

With --openb DIR (default ../shared/traces/openb/csv when it exists), the placement what-if is timed too: the
openb trace's scheduled pods (Alibaba cluster-trace-gpu-v2023, CC BY 4.0) arrive at their creation and leave after
their run on its 1,213 nodes, through each placer (--placers), next to the time reading the trace takes.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

from gpuledger.analytics.config import WHATIF_MODELS, Config, TeamConfig
from gpuledger.analytics.job_replay import replay_jobs
from gpuledger.analytics.store import Store
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.jobs.lifecycle import events_of, jobs_frame
from gpuledger.policies.placers import POLICIES
from gpuledger.policies.whatif import run_whatif
from gpuledger.policies.whatif.placement import compare_placers, openb_arrivals

MODELS = ("H100", "A100-80GB")


def week_of_jobs(store: Store, gpus: int, jobs: int, days: float, teams: list[str], end) -> None:
    """`jobs` records offered at about the cluster's capacity, with the waits a busy scheduler gave them."""
    rng = np.random.default_rng(25)
    start = end - timedelta(days=days)
    size = rng.choice([1, 2, 4, 8, 16], jobs, p=[0.5, 0.15, 0.15, 0.15, 0.05])
    # run times so that the GPU-hours asked are about the GPU-hours present
    run = rng.lognormal(8.5, 1.2, jobs)
    run *= gpus * days * 86400 / float((size * run).sum())
    submit = np.sort(rng.uniform(0, days * 86400, jobs))
    wait = rng.exponential(1200, jobs)
    records = []
    for i in range(jobs):
        sub = start + timedelta(seconds=float(submit[i]))
        began = sub + timedelta(seconds=float(wait[i]))
        ended = began + timedelta(seconds=float(run[i]))
        state = "pending" if began > end else "running" if ended > end else "completed"
        records.append({"job_id": f"bench:{i}", "team": teams[i % len(teams)], "gpu_model": MODELS[i % 2],
                        "gpus": int(size[i]), "submit_ts": sub, "start_ts": began if state != "pending" else None,
                        "end_ts": ended if state == "completed" else None, "state": state, "source": "bench"})
    frame = jobs_frame(records)
    store.record_jobs(frame, events_of(frame))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--jobs", type=int, help="job records over the window (default 25 per GPU)")
    parser.add_argument("--models", default=",".join(WHATIF_MODELS), help="scheduler models to time")
    shared = Path(__file__).resolve().parents[2] / "shared/traces/openb/csv"
    parser.add_argument("--openb", type=Path, default=shared if shared.exists() else None,
                        help="openb's csv folder for the placement what-if (default: ../shared/traces/openb/csv)")
    parser.add_argument("--placers", default=",".join(POLICIES), help="placers for the openb what-if")
    args = parser.parse_args(argv)
    jobs = args.jobs if args.jobs is not None else 25 * args.gpus
    teams = [f"team{i}" for i in range(10)]
    capacity = {m: args.gpus // len(MODELS) for m in MODELS}
    config = Config(teams={t: TeamConfig(share=1.0 + i % 3, guarantee={m: capacity[m] // len(teams) for m in MODELS})
                           for i, t in enumerate(teams)})
    end = utc_now().replace(microsecond=0)
    start = end - timedelta(days=args.days)
    with tempfile.TemporaryDirectory() as folder:
        store = Store(Path(folder) / "whatif.duckdb")
        store.upsert_teams(config.team_frame())
        store.set_team_quotas(config.quota_frame())
        print(f"{args.gpus:,} GPUs ({', '.join(f'{n} {m}' for m, n in capacity.items())}), {jobs:,} job records "
              f"over {args.days:g} days, {len(teams)} teams")
        week_of_jobs(store, args.gpus, jobs, args.days, teams, end)
        began = time.perf_counter()
        records = replay_jobs(store, start, end)
        records.sort_values(["submit_ts", "job_id"])
        baseline = time.perf_counter() - began
        print(f"baseline: read {len(records):,} job records and sort them: {baseline:.3f} s")
        move = max(1, capacity[MODELS[0]] // len(teams) // 4)
        edits = {teams[0]: {MODELS[0]: {"guarantee": capacity[MODELS[0]] // len(teams) + move}},
                 teams[1]: {MODELS[0]: {"guarantee": capacity[MODELS[0]] // len(teams) - move}}}
        print(f"proposal: {teams[0]} {MODELS[0]} +{move} GPUs, {teams[1]} -{move}")
        for model in args.models.split(","):
            times = []
            for _ in range(2):
                began = time.perf_counter()
                answer = run_whatif(store, config, start, end, model, edits, use_recommendations=False,
                                    capacity=capacity)
                times.append(time.perf_counter() - began)
            figures = answer.figures
            waits = " ".join(f"{c} p95 wait {figures[c]['all']['wait_p95_minutes']:,.0f} min" for c in figures)
            took = statistics.median(times)
            print(f"{model:>6}-like: what-if {took:.2f} s ({took / baseline:.1f}x the baseline; {answer.seconds:.2f} s "
                  f"replaying both configurations), {len(answer.workload.jobs):,} jobs; {waits}; utilisation "
                  f"{answer.utilisation['current']:.0%}; goal under 10 s: {'met' if max(times) < 10 else 'NOT met'}")
        store.close()
    if args.openb is not None:
        placement(args.openb, args.placers.split(","))
    return 0


def placement(data: Path, placers: list[str]) -> None:
    began = time.perf_counter()
    nodes, arrivals, workload, length = openb_arrivals(data)
    baseline = time.perf_counter() - began
    print(f"openb placement what-if: {len(arrivals):,} pods over {length / 86400:.0f} days on {len(nodes.names):,} "
          f"nodes; baseline: reading the trace {baseline:.2f} s")
    for result in compare_placers(nodes, arrivals, placers, workload, {}, length):
        print(f"{result['policy']:>8}: {result['seconds']:.2f} s ({result['seconds'] / baseline:.1f}x the baseline); "
              f"allocated {result['allocated_share']:.2%}, fragmented {result['fragmented_share']:.2%}, stranded "
              f"{result['stranded_gpu_hours']:,.0f} GPU-h (no rates for openb's models: unpriced), gang jobs started "
              f"earlier than the trace {result['gang_jobs_started_earlier']} of {result['gang_jobs']}")


if __name__ == "__main__":
    raise SystemExit(main())
