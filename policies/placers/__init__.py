"""Placement policies, one per file behind `Placer` (base.py): FGD, best fit, dot product, random."""
from __future__ import annotations

from gpuledger.policies.placers.base import ClusterState, Placement, Placer, Task
from gpuledger.policies.placers.bestfit import BestFitPlacer
from gpuledger.policies.placers.dotprod import DotProductPlacer
from gpuledger.policies.placers.fgd import FgdPlacer
from gpuledger.policies.placers.random_fit import RandomPlacer

POLICIES = ("fgd", "bestfit", "dotprod", "random")


def make_placer(policy: str, seed: int = 42) -> Placer:
    """The placer named `policy` (one of POLICIES); `seed` drives the random one."""
    if policy == "fgd":
        return FgdPlacer()
    if policy == "bestfit":
        return BestFitPlacer()
    if policy == "dotprod":
        return DotProductPlacer()
    if policy == "random":
        return RandomPlacer(seed)
    raise ValueError(f"unknown placement policy {policy!r}; one of {', '.join(POLICIES)}")


__all__ = ["POLICIES", "make_placer", "ClusterState", "Placement", "Placer", "Task"]
