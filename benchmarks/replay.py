"""Replay Alibaba's openb trace (cluster-trace-gpu-v2023, CC BY 4.0) through each placement policy over several
seeds, and print the final GPU allocation and the fragmentation at 80% arrived load next to the FGD paper's figures
(Weng et al., USENIX ATC '23; the means over 10 seeds of the authors' simulator, its
experiments/analysis/expected_results), with the time one replay takes.

    python benchmarks/replay.py --data ../shared/traces/openb/csv [--seeds 10] [--policies fgd,random]
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from gpuledger.policies.openb_placement import load_nodes, load_tasks
from gpuledger.policies.placers import POLICIES
from gpuledger.policies.replay import replay

# policy -> (final allocation %, fragmentation % of capacity at 80% arrived), default pod list, inflation 1.3
PAPER = {"fgd": (95.39, 5.97), "bestfit": (93.08, 8.29), "dotprod": (90.85, 10.09), "random": (87.47, 15.92)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/traces/openb/csv")
    parser.add_argument("--seeds", type=int, default=10, help="seeds 42, 43, ... (default 10, as the paper)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    args = parser.parse_args()
    nodes, tasks = load_nodes(args.data), load_tasks(args.data)
    print(f"openb/default: {len(nodes.names)} nodes, {int(nodes.gpu_count.sum())} GPUs, {len(tasks)} tasks, "
          f"inflated to 130%; {args.seeds} seeds per policy")
    print(f"{'policy':8} {'alloc %':>8} {'paper':>6} {'diff':>6} {'frag@80 %':>10} {'paper':>6} {'diff':>6} "
          f"{'s/replay':>9}")
    for policy in args.policies.split(","):
        runs = [replay(nodes, tasks, policy, seed=42 + k) for k in range(args.seeds)]
        alloc = statistics.mean(r.final_allocation_pct for r in runs)
        frag = statistics.mean(r.at(80)[1] for r in runs)
        paper_alloc, paper_frag = PAPER[policy]
        print(f"{policy:8} {alloc:8.2f} {paper_alloc:6.2f} {alloc - paper_alloc:+6.2f} {frag:10.2f} "
              f"{paper_frag:6.2f} {frag - paper_frag:+6.2f} {statistics.mean(r.seconds for r in runs):9.1f}")


if __name__ == "__main__":
    main()
