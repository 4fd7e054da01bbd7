"""The quotas in force as the scheduler reports them, over the config's: what a replay of the record starts from.

Why: a what-if replays the history under the quotas in force and first checks that the replay gives the record
back (backtest.py). If the config's `[teams]` guarantees are not what the scheduler runs (someone edited a
ClusterQueue, the config was never updated), the replay is of a history that never happened. Where the product reads
the scheduler's queues (collector/jobs/kueue.py and kai.py, into `queue_metrics`), those numbers are taken:

- Kueue: per ClusterQueue named like a team and flavor named like a GPU model (the emitters' names,
  policies/scheduler_state.py), the guarantee is `kueue_cluster_queue_nominal_quota` and the limit that plus
  `kueue_cluster_queue_borrowing_limit` where published (no borrowing limit: the config's limit stays);
- KAI: per leaf queue `<team>-<model>`, the guarantee is the deserved quota (`queue_deserved_gpus`); KAI's
  "unlimited" (a negative quota) leaves the config's number.
A read older than `max_age` before the instant is not the scheduler's present state and is not taken; the source
of every number taken says so (`TeamPlan.source`: "reported by kueue at ..."), and the config holds wherever nothing
was read. Slurm association limits are not read (`import sacct` carries jobs, not `sacctmgr` limits).
"""
from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.queues import scheduler_queues
from gpuledger.analytics.store import Store
from gpuledger.policies.quota_plan import QuotaPlan, k8s_name

REPORTED = "reported by"  # how a number taken from the scheduler is marked in TeamPlan.source
READ_MAX_AGE = timedelta(hours=1)  # an older read is not the scheduler's present state (a server reads every minute)


def _number(value: object) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _advised(source: str) -> bool:
    """A number an open recommendation set (a proposal's): the advice stands over what runs now."""
    return source.startswith("recommendation ") and not source.endswith("(applied)")


def with_reported(store: Store, plan: QuotaPlan, at: datetime, max_age: timedelta) -> QuotaPlan:
    """`plan` with each (team, GPU model) the scheduler reports a quota for, as of its latest read at or before
    `at` and no older than `max_age`, set from that read (in place, and returned); a number open advice set is
    kept (the proposal is that advice over what runs)."""
    queues = scheduler_queues(store, at)
    if queues.empty:
        return plan
    models = {k8s_name(m): m for t in plan.teams for m in t.models()} | {k8s_name(m): m for m in plan.capacity}
    teams = {k8s_name(t.team): t for t in plan.teams}
    fresh = pd.to_datetime(queues["read_at"], utc=True) >= pd.Timestamp(at) - max_age
    for q in queues[fresh].itertuples(index=False):
        if bool(q.unlimited):
            continue
        if q.scheduler == "kueue":
            team, model = teams.get(q.queue), models.get(q.flavor) if isinstance(q.flavor, str) else None
        else:  # KAI's leaf queue per team and model
            team_name, _, model_name = str(q.queue).rpartition("-")
            team, model = teams.get(team_name), models.get(model_name)
        quota = _number(q.quota_gpus)
        if team is None or model is None or quota is None or _advised(team.source.get(model, "")):
            continue
        borrow = _number(q.borrowing_limit_gpus)
        team.guarantee[model] = quota
        if borrow is not None:
            team.limit[model] = quota + borrow
        team.source[model] = f"{REPORTED} {q.scheduler} at {pd.Timestamp(q.read_at):%Y-%m-%d %H:%M} UTC"
    return plan


def reported_notes(plan: QuotaPlan) -> list[str]:
    """The replay's note on where its quotas in force come from: the pairs the scheduler reported, in words."""
    taken = sorted(f"{t.team} {m}" for t in plan.teams for m, s in t.source.items() if s.startswith(REPORTED))
    if not taken:
        return []
    return [f"quotas in force as the scheduler reports them for {', '.join(taken)}; the config's [teams] numbers "
            f"for the rest"]
