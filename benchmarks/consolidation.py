"""How long consolidation advice takes on a large, fragmented cluster: the index (policies/consolidation.py
`consolidations`, one answer per job shape, the k + 1 best nodes per move) against the scan it replaced (every node
tried for every waiting job, every node scanned for every move), in the same process on the same layout.

Usage: python benchmarks/consolidation.py [--gpus 10000] [--waiting 2000] [--baseline-jobs 3] [--seed 7]

The layout: 8-GPU nodes of two models, each holding 1- to 4-GPU jobs with one or two GPUs free, so no node can
start a waiting 8-GPU gang and every node is a candidate to free (the worst case the 10,000-GPU benchmark of issue 46
met: its recommendation refresh sat in this loop for over six minutes). The scan is timed on --baseline-jobs waiting
jobs only (it takes seconds to minutes per job at this size) and its time per job is compared with the index's.
"""
from __future__ import annotations

import argparse
import random
import time
from datetime import datetime, timezone

import pandas as pd

from gpuledger.policies.consolidation import _freeing_moves, consolidations, layout

MODELS = ("H100", "A100")


def cluster(gpus: int, rng: random.Random) -> pd.DataFrame:
    """Per GPU and job what is held, as analytics/fragmentation.py holders answers."""
    rows = []
    for n in range(gpus // 8):
        node, model, left, g, k = f"node-{n:05d}", MODELS[n % 2], 8 - rng.randint(1, 2), 0, 0
        while g < left:
            size = min(rng.randint(1, 4), left - g)
            for gpu in range(g, g + size):
                rows.append((node, f"{node}-gpu{gpu}", model, f"j{n}-{k}", "team", 1.0, True))
            g, k = g + size, k + 1
        rows += [(node, f"{node}-gpu{gpu}", model, None, None, 0.0, False) for gpu in range(left, 8)]
    return pd.DataFrame(rows, columns=["node", "gpu_uuid", "gpu_model", "job_id", "team", "fraction", "allocated"])


def waiting(count: int, rng: random.Random) -> pd.DataFrame:
    return pd.DataFrame({"job_id": [f"w{i}" for i in range(count)], "team": ["nlp"] * count,
                         "gpu_model": [rng.choice(MODELS) for _ in range(count)],
                         "gpus": [rng.choice((4, 8)) if i % 3 else 8 for i in range(count)],
                         "waited_minutes": [30.0] * count})


def by_scan(pending: pd.DataFrame, held: pd.DataFrame) -> int:
    """The replaced loop: for each waiting job, every node of its model, and for each, a scan of every node per
    move. Returns the advice count."""
    free, model, jobs = layout(held)
    spans = held[held["job_id"].notna()].groupby("job_id")["node"].nunique()
    found = 0
    for job in pending.itertuples(index=False):
        need, wanted = int(job.gpus), [n for n in sorted(free) if model[n] == job.gpu_model]
        if any(len(free[n]) >= need for n in wanted):
            continue
        best = None
        for node in wanted:
            moves = _freeing_moves(node, need, free, jobs, spans)
            if moves is None:
                continue
            room = {n: len(g) for n, g in free.items() if n != node and model.get(n) == model[node]}
            where = {}
            for moved, gpus in sorted(moves, key=lambda m: -m[1]):
                target = max((n for n in sorted(room) if room[n] >= gpus), key=lambda n: room[n], default=None)
                if target is None:
                    where = None
                    break
                room[target] -= gpus
                where[moved] = target
            cost = (sum(g for _, g in moves), len(moves), node)
            if where is not None and (best is None or cost < best):
                best = cost
        found += best is not None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10000)
    parser.add_argument("--waiting", type=int, default=2000)
    parser.add_argument("--baseline-jobs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    held, pending = cluster(args.gpus, rng), waiting(args.waiting, rng)
    at = datetime.now(timezone.utc)
    t = time.perf_counter()
    advice = consolidations(pending, held, at)
    indexed = time.perf_counter() - t
    sample = pending.head(args.baseline_jobs)
    t = time.perf_counter()
    scanned = by_scan(sample, held)
    scan = time.perf_counter() - t
    mine = sum(1 for r in advice if r.job_id in set(sample["job_id"]))
    assert mine == scanned, (mine, scanned)  # the same jobs get advice either way
    print(f"{args.gpus:,} GPUs ({held['node'].nunique():,} nodes), {args.waiting:,} waiting gang jobs: "
          f"{len(advice):,} consolidation advice items")
    print(f"index: {indexed:.2f} s for all {args.waiting:,} jobs ({indexed / args.waiting * 1000:.2f} ms a job)")
    print(f"scan:  {scan:.2f} s for {len(sample)} jobs ({scan / len(sample) * 1000:.0f} ms a job)")
    print(f"ratio (scan / index, per waiting job): {scan / len(sample) / (indexed / args.waiting):,.0f}x; the scan "
          f"would take about {scan / len(sample) * args.waiting / 60:,.0f} min for every waiting job")


if __name__ == "__main__":
    main()
