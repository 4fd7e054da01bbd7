"""How stable is quota advice? Replay the demo cluster hour by hour and count the changes a scheduler would see.

Usage: python benchmarks/recommend_stability.py [--replay-days 14] [--history-days 14] [--seed 7]

The demo's simulated 48-GPU cluster (six teams, five GPU models) is generated for --history-days of policy
window plus --replay-days, at 5-minute samples, into a real DuckDB file. Then, for every hour of the replay,
the scheduler's job records as they stood at that hour are loaded and the recommender refreshes (quota advice
only). The operator applies every proposed quota change at once, the most eager adoption there is, so each
stored recommendation is a change the scheduler would make.

Printed per team: quota changes per week (goal: at most one on stationary demand), and how far each
guarantee in force was from the team's realised p95 busy GPUs in the following 24 hours, as the mean absolute
and the mean signed difference in GPUs (per GPU model, averaged over models and hours). The same replay with
the stability rules off (no cool-down, no step bound, no minimum change) runs in the same process as the
baseline (no cool-down, no step bound; changes under one GPU and 10% are still not advised, as before the
stability rules), and the ratio of changes is printed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from gpuledger.analytics.config import Config, QuotaConfig
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import hourly_demand
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.simulator import default_simulator
from gpuledger.policies.quota import current_quotas, evaluate_quotas
from gpuledger.policies.recommender import Evaluation, decide, refresh


def build(path: Path, days: float, seed: int, end) -> tuple[Store, object]:
    sim = default_simulator(days=days, seed=seed, now=end, future_days=1)
    store = Store(path)
    store.set_rates(Config().rates)
    store.upsert_teams(sim.team_frame())
    store.set_team_quotas(sim.quota_frame())
    for table in sim.history(end - timedelta(days=days), end, step_s=300):
        store.append_samples(table)
    return store, sim


def replay(store: Store, sim, config: Config, start, hours: int) -> dict:
    """Refresh every hour from `start`, applying each proposal; per team: changes, and (guarantee, hour) per model."""
    changes: dict[str, int] = defaultdict(int)
    guarantees: list[tuple] = []  # (hour, team, model, guarantee in force)
    seconds = []
    for k in range(hours):
        at = start + timedelta(hours=k)
        store.upsert_jobs(sim.jobs_frame(at))
        began = time.perf_counter()
        evaluation = Evaluation(at, at - timedelta(days=config.quota.window_days), evaluate_quotas(store, config, at))
        for rec in refresh(store, config, at, evaluation):
            if rec.kind == "quota" and rec.created == at:
                decide(store, rec.id, "applied", by="benchmark", now=at)
                changes[rec.team] += 1
        seconds.append(time.perf_counter() - began)
        guarantees += [(at, team, model, g) for (team, model), (g, _, _) in current_quotas(store).items()
                       if g is not None]
    return {"changes": changes, "guarantees": guarantees, "seconds": seconds}


def distances(store: Store, config: Config, guarantees: list[tuple], end) -> dict[str, tuple[float, float]]:
    """Per team: mean |guarantee - realised p95 busy over the next 24 h| and the mean signed difference."""
    demand = hourly_demand(store, guarantees[0][0], end, config.waste.idle_util_pct)
    demand["busy"] = (demand["allocated_gpus"] - demand["idle_gpus"]).clip(lower=0)
    busy = {key: frame.set_index("hour")["busy"] for key, frame in demand.groupby(["team", "gpu_model"])}
    gaps: dict[str, list[float]] = defaultdict(list)
    for at, team, model, guarantee in guarantees:
        if at + timedelta(hours=24) > end:
            continue
        series = busy.get((team, model))
        window = series[(series.index >= at) & (series.index < at + timedelta(hours=24))] if series is not None else []
        realised = float(window.quantile(0.95)) if len(window) else 0.0
        gaps[team].append(guarantee - realised)
    return {team: (statistics.fmean(abs(g) for g in values), statistics.fmean(values)) for team, values in gaps.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replay-days", type=float, default=14.0)
    parser.add_argument("--history-days", type=float, default=14.0, help="history before the replay (policy window)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    end = utc_now().replace(minute=0, second=0, microsecond=0)
    hours = int(args.replay_days * 24)
    start = end - timedelta(hours=hours)
    policy = Config(quota=QuotaConfig(window_days=args.history_days))
    # no cool-down, no step bound
    unstable = replace(policy, quota=replace(policy.quota, cooldown_hours=0, max_change=10.0))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in (("gpuledger policy", policy), ("baseline: no stability rules", unstable)):
            print(f"{name}: building {args.history_days + args.replay_days:g} days of the demo cluster...", flush=True)
            store, sim = build(Path(tmp) / f"{len(results)}.duckdb", args.history_days + args.replay_days,
                               args.seed, end)
            results[name] = replay(store, sim, config, start, hours)
            results[name]["distance"] = distances(store, config, results[name]["guarantees"], end)
            store.close()
    weeks = args.replay_days / 7.0
    ours, base = results["gpuledger policy"], results["baseline: no stability rules"]
    teams = sorted(set(ours["distance"]) | set(ours["changes"]))
    print(f"\nReplay of {hours} hours ({weeks:g} weeks), operator applies every proposal at once.")
    print(f"{'team':<10} {'changes/week':>12} {'baseline':>9} {'|g - p95| GPUs':>15} {'g - p95 GPUs':>13}")
    for team in teams:
        mean_abs, mean_signed = ours["distance"].get(team, (float("nan"), float("nan")))
        print(f"{team:<10} {ours['changes'][team] / weeks:>12.2f} {base['changes'][team] / weeks:>9.2f} "
              f"{mean_abs:>15.2f} {mean_signed:>13.2f}")
    total, total_base = sum(ours["changes"].values()), sum(base["changes"].values())
    worst = max((ours["changes"][t] / weeks for t in teams), default=0.0)
    print(f"\nquota changes: {total} vs {total_base} without stability rules "
          f"({total / total_base if total_base else float('nan'):.2f}x); most for one team: {worst:.2f}/week "
          f"(goal <= 1 per team and GPU model per week: changes counted per team over all its models)")
    print(f"evaluation + refresh per hour: median {statistics.median(ours['seconds']) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
