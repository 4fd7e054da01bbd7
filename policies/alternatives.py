"""Advice that competes for the same GPUs or jobs: one group of alternatives, best first, and a savings total
that counts what can be had together once.

Why: placement advice is made one job at a time. On a busy node a consolidation (empty the node for a waiting gang
job), a co-location (move a spread job's GPUs onto it) and a separation (give a latency-sensitive job a free GPU of
its own there) can all want the same free GPUs, and a resize and a consolidation can both move the same job. Each
is right on its own; together they cannot all be done, and their dollars must not be added up.

What an advice claims (read from its action and evidence, one reader per kind in `CLAIMS`):
- the jobs it changes: the job it is about, a consolidation's waiting job and the jobs it moves (a reclaim of
  GPUs no job holds: those GPUs);
- the free GPUs it needs, per node: a consolidation's moves land on other nodes, a co-location fills the target
  island's free GPUs, a separation takes one;
- the nodes it clears: only a consolidation stored before it recorded the node's free GPUs (taken as wanting the
  node whole); otherwise a consolidation takes every GPU free on its node, beside those its moves leave.
Quota advice claims a guarantee, not GPUs at an instant: one GPU model's quota changes are one proposal replayed
together (policies/whatif/effects.py), never alternatives to each other, so they belong to no group.

Two advice are in one group when they change the same job, when one clears a node the other needs or clears, or
when they need free GPUs of a node that cannot give all its takers what they want (the node's free GPUs as the
advice recorded them; not recorded: only as many as the largest taker asks, so grouping errs towards
alternatives). GPUs another
advice would give back are not counted as room. The group is ranked by dollars per week (unpriced last), and the
savings total counts, per group, the most valuable set of its advice that can all be done together.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from gpuledger.policies.recommendation import OPEN, PREVIEW

EXACT_UP_TO = 14  # a group this small is searched exhaustively for its best set; a larger one greedily by rank
EFFECT = "effect_usd_per_week"


@dataclass(frozen=True)
class Claim:
    """What one advice needs to be done: jobs it changes, free GPUs per node, nodes it empties."""
    jobs: frozenset[str] = frozenset()
    takes: dict[str, int] = field(default_factory=dict)
    clears: frozenset[str] = frozenset()
    free: dict[str, int] = field(default_factory=dict)  # free GPUs per node, as the advice saw them

    def as_dict(self) -> dict[str, Any]:
        """The claim as evidence a team may read: nodes and GPU counts (no job names; those are in the advice)."""
        return {"free_gpus_taken": dict(sorted(self.takes.items())), "wants_whole_nodes": sorted(self.clears),
                "free_gpus_seen": {n: self.free[n] for n in sorted(self.free) if n in self.takes or n in self.clears},
                "jobs_changed": len(self.jobs)}


def _count(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _job(rec: dict[str, Any]) -> frozenset[str]:
    return frozenset({str(rec["job_id"])}) if rec.get("job_id") else frozenset()


def _reclaim(rec: dict[str, Any]) -> Claim:
    # a workload of no job is known by the GPUs it holds
    gpus = (rec.get("action") or {}).get("reclaim_gpus") or []
    return Claim(jobs=_job(rec) or frozenset(f"gpu:{g}" for g in gpus))


def _own_job(rec: dict[str, Any]) -> Claim:
    return Claim(jobs=_job(rec))


def _consolidate(rec: dict[str, Any]) -> Claim:
    action, evidence = rec.get("action") or {}, rec.get("evidence") or {}
    moves = action.get("move") or []
    takes: dict[str, int] = {}
    for move in moves:
        takes[str(move["to_node"])] = takes.get(str(move["to_node"]), 0) + int(move.get("gpus") or 0)
    free = {str(n): c for n, v in (evidence.get("free_gpus_on_targets") or {}).items()
            if (c := _count(v)) is not None}
    node = str(action.get("node"))
    waiting = evidence.get("waiting_job") or rec.get("job_id")
    here = _count(evidence.get("free_gpus_on_node"))
    if here is None:  # stored before it was recorded: the node is taken as wanted whole
        return Claim(jobs=frozenset({str(waiting)} | {str(m["job_id"]) for m in moves}), takes=takes,
                     clears=frozenset({node}), free=free)
    # the waiting job takes every GPU free on the node, beside those the moved jobs leave
    takes[node] = takes.get(node, 0) + here
    free[node] = here
    return Claim(jobs=frozenset({str(waiting)} | {str(m["job_id"]) for m in moves}), takes=takes, free=free)


def _colocate(rec: dict[str, Any]) -> Claim:
    action, evidence = rec.get("action") or {}, rec.get("evidence") or {}
    node = action.get("node")
    if not node:
        return _own_job(rec)
    need = max((_count(action.get("gpus")) or 0) - (_count(evidence.get("target_own_gpus")) or 0), 0)
    free = _count(evidence.get("free_gpus_on_target"))
    return Claim(jobs=_job(rec), takes={str(node): need} if need else {},
                 free={str(node): free} if free is not None else {})


def _separate(rec: dict[str, Any]) -> Claim:
    action, evidence = rec.get("action") or {}, rec.get("evidence") or {}
    node = action.get("to_node")
    free = _count(evidence.get("free_gpus_on_target"))
    return Claim(jobs=_job(rec), takes={str(node): 1} if node else {},
                 free={str(node): free} if node and free is not None else {})


# one reader per kind of advice that claims GPUs or jobs (policies/recommendation.py KINDS, quota aside)
CLAIMS: dict[str, Callable[[dict[str, Any]], Claim]] = {
    "reclaim": _reclaim, "resize": _own_job, "efficiency": _own_job, "consolidate": _consolidate,
    "colocate": _colocate, "separate": _separate,
}


def _usd(rec: dict[str, Any]) -> float | None:
    value = (rec.get("evidence") or {}).get(EFFECT)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def _free(claims: list[Claim], node: str) -> int:
    """A node's free GPUs as every advice that saw it recorded them (the fewest). None recorded (advice stored
    before it said): as many as the largest one asks, so each advice stands alone but no two share the node."""
    seen = [c.free[node] for c in claims if node in c.free]
    return min(seen) if seen else max(c.takes.get(node, 0) for c in claims)


def together(claims: list[Claim]) -> bool:
    """Whether these advice can all be done: no job changed twice, no cleared node taken or cleared again, and
    no node asked for more free GPUs than it has."""
    jobs: set[str] = set()
    for claim in claims:
        if jobs & claim.jobs:
            return False
        jobs |= claim.jobs
    for a, b in combinations(claims, 2):
        if a.clears & (set(b.takes) | b.clears) or b.clears & set(a.takes):
            return False
    nodes = {n for c in claims for n in c.takes}
    return all(sum(c.takes.get(n, 0) for c in claims) <= _free(claims, n) for n in nodes)


def _groups(claims: list[Claim]) -> list[list[int]]:
    """Indexes of `claims` in groups (connected: a pair that cannot be done together, or every taker of a node
    that cannot give them all what they want)."""
    parent = list(range(len(claims)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(i: int, j: int) -> None:
        parent[root(i)] = root(j)

    for i, j in combinations(range(len(claims)), 2):
        if not together([claims[i], claims[j]]):
            join(i, j)
    for node in {n for c in claims for n in c.takes}:
        takers = [i for i, c in enumerate(claims) if c.takes.get(node)]
        if sum(claims[i].takes[node] for i in takers) > _free([claims[i] for i in takers], node):
            for i in takers[1:]:
                join(i, takers[0])
    out: dict[int, list[int]] = {}
    for i in range(len(claims)):
        out.setdefault(root(i), []).append(i)
    return list(out.values())


def _best_set(members: list[int], claims: list[Claim], value: list[float]) -> set[int]:
    """The most valuable set of a group's advice that can all be done (ties: the one holding the better-ranked
    advice); `members` come best first."""
    if len(members) > EXACT_UP_TO:
        chosen: list[int] = []
        for i in members:
            if together([claims[j] for j in chosen + [i]]):
                chosen.append(i)
        return set(chosen)
    best: tuple[tuple, list[int]] = ((-1.0,), [])

    def search(k: int, chosen: list[int], worth: float) -> None:
        nonlocal best
        if k == len(members):
            key = (round(worth, 6), *(-p for p in sorted(members.index(i) for i in chosen)))
            if key > best[0]:
                best = (key, list(chosen))
            return
        i = members[k]
        if together([claims[j] for j in chosen + [i]]):
            search(k + 1, chosen + [i], worth + value[i])
        search(k + 1, chosen, worth)

    search(0, [], 0.0)
    return set(best[1])


def annotate(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`recs` (Recommendation.to_dict() forms) with `alternatives` on each open placement advice: its group, its
    rank in it, the advice it cannot be done with, whether the savings total counts it, and what it claims.
    Advice that is not open (insufficient_data, held_back), and quota advice, gets `alternatives: None`."""
    out = [dict(r, alternatives=None) for r in recs]
    open_ = [i for i, r in enumerate(out) if r.get("status") in OPEN + (PREVIEW,) and r.get("kind") in CLAIMS]
    claims = [CLAIMS[out[i]["kind"]](out[i]) for i in open_]
    value = [(_usd(out[i]) or 0.0) for i in open_]
    for members in _groups(claims):
        members.sort(key=lambda k: (_usd(out[open_[k]]) is None, -(value[k]), out[open_[k]]["id"]))
        ids = [out[open_[k]]["id"] for k in members]
        group = "alt-" + hashlib.sha1(",".join(sorted(ids)).encode()).hexdigest()[:10]
        best = _best_set(members, claims, value)
        for rank, k in enumerate(members, start=1):
            rivals = [out[open_[j]]["id"] for j in members if j != k and not together([claims[k], claims[j]])]
            out[open_[k]]["alternatives"] = {
                "group": group, "rank": rank, "of": len(members), "competes_with": rivals,
                "counted": k in best and _usd(out[open_[k]]) is not None, "claims": claims[k].as_dict()}
    return out


def potential_savings(shown: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The savings total of annotated advice as shown (all of it, or a team's or one kind's part): the dollars
    per week of the advice counted in its group. Unknown (None) when advice is shown but none of it is priced."""
    placed = [r for r in shown if r.get("alternatives")]
    priced = [r for r in placed if _usd(r) is not None]
    counted = [r for r in priced if r["alternatives"]["counted"]]
    return {
        "usd_per_week": round(sum(_usd(r) or 0.0 for r in counted), 2) if priced or not placed else None,
        "groups": len({r["alternatives"]["group"] for r in placed}), "advice": len(placed), "priced": len(priced),
        "counted": [r["id"] for r in counted],
        "left_out": [r["id"] for r in priced if not r["alternatives"]["counted"]],
        "basis": ("per group of alternatives, the most valuable set of its advice that can all be done together, "
                  "counted once, at each advice's effect_usd_per_week: upper bounds (a reclaim or resize prices "
                  "a whole week of the freed GPUs at the rate card, however long they were idle so far; colocate "
                  "assumes no communication overlaps compute); quota advice "
                  "is judged by waits, not dollars, and is not in the total"
                  + ("" if priced or not placed else "; no advice shown prices its effect, so no total is stated")),
    }
