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

from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.fragmentation import holders
from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import pending_jobs
from gpuledger.policies.recommendation import Recommendation

FULL = 0.999  # a GPU counts as free when no job holds any of it


def _job_teams(held: pd.DataFrame, jobs: list[str]) -> dict[str, str | None]:
    """Each named job's team (None when no team is known), kept in the evidence as `job_teams` so the advice
    can be shown to a team without naming other teams' jobs (analytics/team_scope.py)."""
    teams = held[held["job_id"].isin(jobs)].groupby("job_id")["team"].first()
    return {job: (str(teams[job]) if job in teams.index and pd.notna(teams[job]) else None) for job in jobs}


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


def _fits_elsewhere(moves: list[tuple[str, int]], free: dict[str, set[str]], model: dict[str, str], node: str,
                    gpu_model: str) -> dict[str, str] | None:
    """Where each moved job (job, GPUs) goes: nodes of the same model, most free GPUs first; None if one does not
    fit."""
    room = {n: len(g) for n, g in free.items() if n != node and model.get(n) == gpu_model}
    placed = {}
    for job, gpus in sorted(moves, key=lambda m: -m[1]):
        target = max((n for n in sorted(room) if room[n] >= gpus), key=lambda n: room[n], default=None)
        if target is None:
            return None
        room[target] -= gpus
        placed[job] = target
    return placed


def consolidate_advice(store: Store, config: Config, at: datetime, latest: datetime) -> list[Recommendation]:
    """Moves that free a node's GPUs for each waiting gang job that no node can take now."""
    waiting = pending_jobs(store, at, config.quota.pending_min_wait_minutes)
    waiting = waiting[waiting["gpus"].fillna(0) >= 2]
    if waiting.empty:
        return []
    held = holders(store, latest + timedelta(microseconds=1))
    if held.empty:
        return []
    free, model, jobs = layout(held)
    spans = held[held["job_id"].notna()].groupby("job_id")["node"].nunique()
    out = []
    for pending in waiting.itertuples(index=False):
        need = int(pending.gpus)
        wanted = [n for n in sorted(free) if pending.gpu_model in (None, model[n]) or pd.isna(pending.gpu_model)]
        if any(len(free[n]) >= need for n in wanted):
            continue  # it fits somewhere now: the scheduler's to place, not a layout problem
        best = None
        for node in wanted:
            size = len(free[node]) + sum(len(g) for g in jobs.get(node, {}).values())
            if size < need:
                continue
            # a GPU time-sliced by several jobs is freed only once all of them move: sole holders are tried first
            held_by: dict[str, set[str]] = {}
            for j, g in jobs.get(node, {}).items():
                for gpu in g:
                    held_by.setdefault(gpu, set()).add(j)
            movable = sorted(((j, g) for j, g in jobs.get(node, {}).items() if spans.get(j, 1) == 1),
                             key=lambda jg: (len(jg[1]), any(len(held_by[g]) > 1 for g in jg[1]), jg[0]))
            freed, moves, moved = set(free[node]), [], set()
            for job, gpus in movable:
                if len(freed) >= need:
                    break
                moves.append((job, len(gpus)))
                moved.add(job)
                freed |= {g for g in gpus if held_by[g] <= moved}
            if len(freed) < need:
                continue
            where = _fits_elsewhere(moves, free, model, node, model[node])
            if where is None:
                continue
            cost = (sum(g for _, g in moves), len(moves), node)
            if best is None or cost < best[0]:
                best = (cost, node, moves, where, len(free[node]))
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
                                    **_job_teams(held, [j for j, _ in moves])}},
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
        target = next((n for n in sorted(free, key=lambda n: (n != node, n)) if model[n] == model[node] and free[n]),
                      None)
        for job in sensitive:
            slo = missed.get(str(job.job_id))
            measured = (f"; it missed its SLO ({', '.join(slo['slo_missed'])}: "
                        + ", ".join(f"{k} {slo['measured'][k]:.3g}s over {slo['slo'][k]:g}s" for k in slo["slo_missed"]
                                    if slo["measured"].get(k) is not None) + ")") if slo else ""
            out.append(Recommendation(
                kind="separate", team=str(job.team), gpu_model=model[node], job_id=str(job.job_id),
                action={"from_gpu": gpu, "node": node, "to_node": target},
                evidence={"shares_gpu_with": others, "share_held": float(job.fraction),
                          "free_gpus_of_model": sum(len(free[n]) for n in free if model[n] == model[node]),
                          "latency_sensitive": list(config.placement.latency_sensitive), "at": latest,
                          **({"free_gpus_on_target": len(free[target])} if target else {}),
                          "job_teams": _job_teams(held, [str(job.job_id), *others]),
                          **({"measured_latency": slo} if slo else {})},
                reason=(f"{job.job_id} is latency-sensitive and shares GPU {gpu} on {node} with "
                        f"{', '.join(others)}{measured}; "
                        + (f"a free {model[node]} GPU on {target} would give it one of its own" if target
                           else f"no {model[node]} GPU is free now"))))
    return out
