"""Placement advice from the cluster's layout: consolidate to make room for a waiting gang job, separate a
latency-sensitive job from the work sharing its GPU. Both join the recommendation stream with quota, reclaim and
resize advice (same evidence, storage and decisions).

Consolidate: a multi-GPU job has waited, and no node of its model has that many GPUs free, yet on some node the
GPUs it needs are held by a few small jobs that fit elsewhere. The advice names the node, the jobs to move and
where each fits, and the GPUs that frees; the node chosen is the one that moves the fewest GPUs (then jobs, then
the lowest name).

Separate: a latency-sensitive job (a team or namespace listed in `[placement] latency_sensitive`) sharing a GPU
with other work gets advice to move to a GPU of its own.

Co-locate advice (a job spread over nodes) is policies/colocation.py's, on the same layout.
"""
from __future__ import annotations

import heapq
from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.fragmentation import holders
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import pending_jobs
from gpuledger.policies.recommendation import Recommendation

FULL = 0.999  # a GPU counts as free when no job holds any of it


def job_teams(held: pd.DataFrame) -> dict[str, str | None]:
    """Each holding job's team (None when no team is known), once per layout: kept in the evidence as `job_teams`
    so the advice can be shown to a team without naming other teams' jobs (analytics/team_scope.py)."""
    teams = held[held["job_id"].notna()].groupby("job_id")["team"].first()
    return {str(job): (str(team) if pd.notna(team) else None) for job, team in teams.items()}


def layout(held: pd.DataFrame) -> tuple[dict[str, set[str]], dict[str, str], dict[str, dict[str, set[str]]]]:
    """(free GPUs per node, model per node, per node each job's GPUs there)."""
    jobs_rows = held[held["allocated"] & held["job_id"].notna()]
    used = jobs_rows.groupby(["node", "gpu_uuid"])["fraction"].sum()
    free: dict[str, set[str]] = {}
    model: dict[str, str] = {}
    for (node, gpu), gpu_model in held.groupby(["node", "gpu_uuid"])["gpu_model"].first().items():
        model[node] = gpu_model
        free.setdefault(node, set())
        if used.get((node, gpu), 0.0) < 1 - FULL:
            free[node].add(gpu)
    jobs: dict[str, dict[str, set[str]]] = {}
    for row in jobs_rows.itertuples(index=False):
        jobs.setdefault(row.node, {}).setdefault(row.job_id, set()).add(row.gpu_uuid)
    return free, model, jobs


class Room:
    """Free GPUs per node of each model, most first (then the lowest name), built once per layout: where moved jobs
    fit is then found among the few best nodes, not by a scan of every node for every move of every node tried for
    every waiting job (at 10,000 GPUs that scan never finished, issue 46)."""

    def __init__(self, free: dict[str, set[str]], model: dict[str, str]) -> None:
        self.ranked: dict[str, list[tuple[int, str]]] = {}
        for node, gpus in free.items():
            self.ranked.setdefault(model[node], []).append((-len(gpus), node))
        for nodes in self.ranked.values():
            nodes.sort()

    def fits(self, moves: list[tuple[str, int]], node: str, gpu_model: str) -> dict[str, str] | None:
        """Where each moved job (job, GPUs) goes: nodes of the same model other than `node`, most free GPUs first
        (then the lowest name), largest job first; None if one does not fit. With k moves only the k + 1 best nodes
        can receive one: one of them is never reduced, and every node after it has no more room than it."""
        order = sorted(moves, key=lambda m: -m[1])
        best: list[tuple[int, str]] = []
        for entry in self.ranked.get(gpu_model, []):
            if entry[1] != node:
                best.append(entry)
                if len(best) > len(order):
                    break
        placed = {}
        for job, gpus in order:  # `best` is sorted, so it is a heap
            if not best or -best[0][0] < gpus:
                return None
            room, target = heapq.heappop(best)
            placed[job] = target
            heapq.heappush(best, (room + gpus, target))
        return placed


def _freeing_moves(node: str, need: int, free: dict[str, set[str]], jobs: dict[str, dict[str, set[str]]],
                   spans: pd.Series) -> list[tuple[str, int]] | None:
    """The jobs to move off `node` (smallest first) to free `need` GPUs there, or None when moving every job that
    runs on this node only does not."""
    here = jobs.get(node, {})
    if len(free[node]) + sum(len(g) for g in here.values()) < need:
        return None
    # a GPU time-sliced by several jobs is freed only once all of them move: sole holders are tried first
    held_by: dict[str, set[str]] = {}
    for j, g in here.items():
        for gpu in g:
            held_by.setdefault(gpu, set()).add(j)
    movable = sorted(((j, g) for j, g in here.items() if spans.get(j, 1) == 1),
                     key=lambda jg: (len(jg[1]), any(len(held_by[g]) > 1 for g in jg[1]), jg[0]))
    freed, moves, moved = set(free[node]), [], set()
    for job, gpus in movable:
        if len(freed) >= need:
            break
        moves.append((job, len(gpus)))
        moved.add(job)
        freed |= {g for g in gpus if held_by[g] <= moved}
    return moves if len(freed) >= need else None


def consolidate_advice(store: Store, config: Config, at: datetime, latest: datetime) -> list[Recommendation]:
    """Moves that free a node's GPUs for each waiting gang job that no node can take now. The layout does not change
    between waiting jobs, so the best move is worked out once per job shape (GPU model and GPUs asked) and each job
    of that shape gets it."""
    waiting = pending_jobs(store, at, config.quota.pending_min_wait_minutes)
    waiting = waiting[waiting["gpus"].fillna(0) >= 2]
    if waiting.empty:
        return []
    held = holders(store, latest + timedelta(microseconds=1))
    if held.empty:
        return []
    return consolidations(waiting, held, latest)


def consolidations(waiting: pd.DataFrame, held: pd.DataFrame, latest: datetime) -> list[Recommendation]:
    """consolidate_advice on its inputs: the waiting gang jobs (job_id, team, gpu_model, gpus, waited_minutes) and
    what each GPU's jobs hold as of `latest` (analytics/fragmentation.py holders)."""
    free, model, jobs = layout(held)
    room, team_of = Room(free, model), job_teams(held)
    spans = held[held["job_id"].notna()].groupby("job_id")["node"].nunique()
    shapes: dict[tuple[str | None, int], tuple[list[str], tuple | None]] = {}

    def shape(gpu_model: str | None, need: int) -> tuple[list[str], tuple | None]:
        """(the nodes such a job may use, the best (cost, node, moves, where, free GPUs there) or None)."""
        wanted = [n for n in sorted(free) if gpu_model is None or model[n] == gpu_model]
        if any(len(free[n]) >= need for n in wanted):
            return wanted, None  # it fits somewhere now: the scheduler's to place, not a layout problem
        best = None
        for node in wanted:
            moves = _freeing_moves(node, need, free, jobs, spans)
            if moves is None:
                continue
            cost = (sum(g for _, g in moves), len(moves), node)
            if best is not None and cost >= best[0]:
                continue  # no cheaper than the best found: where it would go does not matter
            where = room.fits(moves, node, model[node])
            if where is not None:
                best = (cost, node, moves, where, len(free[node]))
        return wanted, best

    out = []
    for pending in waiting.itertuples(index=False):
        need = int(pending.gpus)
        key = (None if pending.gpu_model is None or pd.isna(pending.gpu_model) else str(pending.gpu_model), need)
        if key not in shapes:
            shapes[key] = shape(*key)
        wanted, best = shapes[key]
        if best is None:
            continue
        (moved_gpus, _, _), node, moves, where, free_now = best
        out.append(Recommendation(
            kind="consolidate", team=str(pending.team), gpu_model=model[node], job_id=str(pending.job_id),
            action={"node": node, "frees_gpus": need,
                    "move": [{"job_id": j, "gpus": g, "to_node": where[j]} for j, g in moves]},
            evidence={"waiting_job": str(pending.job_id), "gpus_needed": need,
                      "waited_minutes": float(pending.waited_minutes), "free_gpus_on_node": free_now,
                      "most_free_gpus_on_any_node": max((len(free[n]) for n in wanted), default=0),
                      "gpus_moved": moved_gpus, "at": latest,
                      # what the moves land on, so competing advice is seen as such (policies/alternatives.py)
                      "free_gpus_on_targets": {n: len(free[n]) for n in sorted(set(where.values()))},
                      "job_teams": {str(pending.job_id): str(pending.team),
                                    **{j: team_of.get(j) for j, _ in moves}}},
            reason=(f"{pending.job_id} has waited {pending.waited_minutes:.0f} min for {need} GPUs, and no "
                    f"{model[node]} node has {need} free; moving {len(moves)} job(s) ({moved_gpus} GPU(s)) off "
                    f"{node} frees {need} there")))
    return out


def _latency_sensitive(job: str, team: str | None, names: tuple[str, ...]) -> bool:
    """A job of a latency-sensitive team or namespace (the part of its id before '/')."""
    wanted = {n.lower() for n in names}
    return (team or "").lower() in wanted or job.split("/", 1)[0].lower() in wanted


def separate_advice(store: Store, config: Config, at: datetime, latest: datetime,
                    missed: dict[str, dict] | None = None) -> list[Recommendation]:
    """Latency-sensitive jobs sharing a GPU with other work: move them to a GPU of their own (a free one of the
    same model, when there is one). Latency-sensitive: named so by the config (`[placement] latency_sensitive`),
    or measured so: serving a service that missed its SLO (`missed`, policies/inference_advice.py missed_slos),
    whose latency then is the advice's evidence."""
    missed = missed or {}
    held = holders(store, latest + timedelta(microseconds=1))
    running = held[held["allocated"] & held["job_id"].notna()]
    if running.empty:
        return []
    free, model, _ = layout(held)
    team_of = job_teams(held)
    free_nodes: dict[str, list[str]] = {}  # per model, the nodes with a free GPU, by name
    for n in sorted(free):
        if free[n]:
            free_nodes.setdefault(model[n], []).append(n)
    free_of_model = {m: sum(len(free[n]) for n in nodes) for m, nodes in free_nodes.items()}
    out = []
    for (node, gpu), sharers in running.groupby(["node", "gpu_uuid"]):
        if sharers["job_id"].nunique() < 2:
            continue
        sensitive = [r for r in sharers.itertuples(index=False)
                     if _latency_sensitive(str(r.job_id), r.team, config.placement.latency_sensitive)
                     or str(r.job_id) in missed]
        others = sorted({str(j) for j in sharers["job_id"]} - {str(r.job_id) for r in sensitive})
        if not sensitive or not others:
            continue
        # a free GPU on the same node first, else on the lowest-named node of the model with one
        target = node if free[node] else next(iter(free_nodes.get(model[node], [])), None)
        for job in sensitive:
            slo = missed.get(str(job.job_id))
            measured = (f"; it missed its SLO ({', '.join(slo['slo_missed'])}: "
                        + ", ".join(f"{k} {slo['measured'][k]:.3g}s over {slo['slo'][k]:g}s" for k in slo["slo_missed"]
                                    if slo["measured"].get(k) is not None) + ")") if slo else ""
            out.append(Recommendation(
                kind="separate", team=str(job.team), gpu_model=model[node], job_id=str(job.job_id),
                action={"from_gpu": gpu, "node": node, "to_node": target},
                evidence={"shares_gpu_with": others, "share_held": float(job.fraction),
                          "free_gpus_of_model": free_of_model.get(model[node], 0),
                          "latency_sensitive": list(config.placement.latency_sensitive), "at": latest,
                          **({"free_gpus_on_target": len(free[target])} if target else {}),
                          "job_teams": {j: team_of.get(j) for j in [str(job.job_id), *others]},
                          **({"measured_latency": slo} if slo else {})},
                reason=(f"{job.job_id} is latency-sensitive and shares GPU {gpu} on {node} with "
                        f"{', '.join(others)}{measured}; "
                        + (f"a free {model[node]} GPU on {target} would give it one of its own" if target
                           else f"no {model[node]} GPU is free now"))))
    return out
