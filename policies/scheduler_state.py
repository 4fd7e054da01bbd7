"""gpuledger's quota plan beside the quotas the schedulers actually run (analytics/queues.py): for every queue the
plan would write (the Kueue and KAI emitters' names: a ClusterQueue per team with a flavor per GPU model; a KAI
queue per team and a leaf `<team>-<model>`), the quota in force, what the plan says, the difference, and what the
queue holds and has waiting. A queue the scheduler runs that the plan does not know, and a planned queue the
scheduler does not have, are listed too (`status`), so drift is seen before an export is applied. Each team's whole
queue is a row too (flavor null): KAI's parent queue, or a ClusterQueue's flavors summed. Slurm (`gpuledger import
sacctmgr`): an account per team with a GrpTRES limit per GPU type (the site's type names), compared with the plan's
limit, since Slurm has no guarantee.
"""
from __future__ import annotations

from datetime import datetime

import pandas as pd

from gpuledger.analytics.queues import scheduler_queues
from gpuledger.analytics.store import Store
from gpuledger.policies.quota_plan import QuotaPlan, gres_type, k8s_name

# how a queue's quota compares: the closed set of the comparison's `status`
COMPARISON_STATUSES = ("matches", "differs", "not_in_scheduler", "not_in_plan", "unlimited")
COLUMNS = ["scheduler", "queue", "flavor", "team", "gpu_model", "quota_in_force_gpus", "planned_gpus",
           "difference_gpus", "usage_gpus", "pending_workloads", "status", "read_at"]


def _planned(plan: QuotaPlan, scheduler: str) -> dict[tuple[str, str | None], tuple[str, str | None, float]]:
    """(queue, flavor) -> (team, GPU model or None for a team's whole queue, planned guarantee), as the emitter for
    `scheduler` names them."""
    out: dict[tuple[str, str | None], tuple[str, str | None, float]] = {}
    if scheduler == "slurm":  # an account per team, a GrpTRES limit per GPU type; Slurm has no guarantee
        for team in plan.teams:
            for model in team.models():
                kind = plan.gres[model][0] if model in plan.gres else gres_type(model)
                out[(team.team, kind)] = (team.team, model, float(plan.limit_of(team, model)))
        return out
    for team in plan.teams:
        for model in team.models():
            guarantee = float(team.guarantee.get(model, 0.0))
            if scheduler == "kueue":
                out[(k8s_name(team.team), k8s_name(model))] = (team.team, model, guarantee)
            else:
                out[(f"{k8s_name(team.team)}-{k8s_name(model)}", None)] = (team.team, model, guarantee)
        out[(k8s_name(team.team), None)] = (team.team, None, team.total_guarantee())  # the team's whole queue
    return out


def _with_queue_totals(running: pd.DataFrame) -> pd.DataFrame:
    """Kueue publishes quotas and usage per flavor but waiting workloads per ClusterQueue: the queue's own row
    (no flavor) gets its flavors' quota and usage summed, so it compares with the team's whole guarantee; a queue
    whose flavors publish nothing keeps null."""
    flavored = running[running["flavor"].notna()]
    if flavored.empty:
        return running
    running = running.copy()
    sums = flavored.groupby("queue")[["quota_gpus", "usage_gpus"]].sum(min_count=1)
    whole = running["flavor"].isna() & running["queue"].isin(sums.index)
    for column in ("quota_gpus", "usage_gpus"):
        running.loc[whole, column] = running.loc[whole, column].fillna(running.loc[whole, "queue"].map(sums[column]))
    missing = sorted(set(flavored["queue"]) - set(running.loc[running["flavor"].isna(), "queue"]))
    if missing:  # flavors but no queue-level figure: add the queue's row of totals
        totals = sums.loc[missing].reset_index()
        totals["scheduler"] = running["scheduler"].iloc[0]
        totals["read_at"] = flavored["read_at"].max()
        totals["unlimited"] = False
        running = pd.concat([running, totals], ignore_index=True)
    return running


def compare_with_scheduler(store: Store, plan: QuotaPlan, at: datetime) -> pd.DataFrame:
    """One row per queue of either side (COLUMNS); schedulers with no read give no rows."""
    queues = scheduler_queues(store, at)
    rows = []
    for scheduler, running in queues.groupby("scheduler"):
        figure = "limit_gpus" if scheduler == "slurm" else "quota_gpus"  # what the plan's number compares with
        if scheduler == "slurm":  # an account's share is no limit: only its GrpTRES GPU limits compare
            running = running[running["limit_gpus"].notna()]
        else:
            running = _with_queue_totals(running)
        planned = _planned(plan, scheduler)
        seen = set()
        for q in running.itertuples(index=False):
            key = (q.queue, q.flavor if isinstance(q.flavor, str) else None)
            seen.add(key)
            team, model, want = planned.get(key, (None, None, None))
            have = None if pd.isna(getattr(q, figure)) else float(getattr(q, figure))
            if bool(q.unlimited):
                status = "unlimited"
            elif want is None:
                status = "not_in_plan"
            else:
                status = "matches" if have is not None and abs(have - want) < 1e-9 else "differs"
            rows.append({"scheduler": scheduler, "queue": q.queue, "flavor": key[1], "team": team, "gpu_model": model,
                         "quota_in_force_gpus": have, "planned_gpus": want,
                         "difference_gpus": want - have if want is not None and have is not None else None,
                         "usage_gpus": None if pd.isna(q.usage_gpus) else float(q.usage_gpus),
                         "pending_workloads": None if pd.isna(q.pending_workloads) else float(q.pending_workloads),
                         "status": status, "read_at": q.read_at})
        read_at = running["read_at"].max()
        for key, (team, model, want) in sorted(planned.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            if key not in seen:
                rows.append({"scheduler": scheduler, "queue": key[0], "flavor": key[1], "team": team,
                             "gpu_model": model, "quota_in_force_gpus": None, "planned_gpus": want,
                             "difference_gpus": None, "usage_gpus": None, "pending_workloads": None,
                             "status": "not_in_scheduler", "read_at": read_at})
    return pd.DataFrame(rows, columns=COLUMNS)
