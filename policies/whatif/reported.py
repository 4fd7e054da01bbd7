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
- Slurm: per account named like a team (the Slurm emitter's names), the limit is GrpTRES `gres/gpu:<type>`
  (`gpuledger import sacctmgr`, collector/jobs/sacctmgr.py) for the one GPU model of that type (the types the
  site's sacct names, `QuotaPlan.gres`, else the model in lower case); an untyped `gres/gpu` limit only where the
  team has one model. Slurm has no guarantee, so guarantees stay the config's. Fairshare replaces the shares only
  when every team's account reports a number (shares are relative: half from Slurm and half from the config would
  be neither).
A read older than `max_age` before the instant is not the scheduler's present state and is not taken; the source
of every number taken says so (`TeamPlan.source`: "reported by kueue at ..."), and the config holds wherever nothing
was read.
"""
from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.queues import scheduler_queues
from gpuledger.analytics.store import Store
from gpuledger.analytics.config import Config
from gpuledger.policies.quota_plan import QuotaPlan, gres_type, k8s_name, site_gres

REPORTED = "reported by"  # how a number taken from the scheduler is marked in TeamPlan.source
READ_MAX_AGE = timedelta(hours=1)  # an older read is not the scheduler's present state (a server reads every minute)


def _number(value: object) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _advised(source: str) -> bool:
    """A number an open recommendation set (a proposal's): the advice stands over what runs now."""
    return source.startswith("recommendation ") and not source.endswith("(applied)")


def with_reported(store: Store, plan: QuotaPlan, at: datetime, max_age: timedelta,
                  config: Config | None = None) -> QuotaPlan:
    """`plan` with each (team, GPU model) the scheduler reports a quota for, as of its latest read at or before
    `at` and no older than `max_age`, set from that read (in place, and returned); a number open advice set is
    kept (the proposal is that advice over what runs). `config` names Slurm's GPU types where sacct does not
    (`[slurm_gres]`)."""
    queues = scheduler_queues(store, at)
    if queues.empty:
        return plan
    models = {k8s_name(m): m for t in plan.teams for m in t.models()} | {k8s_name(m): m for m in plan.capacity}
    teams = {k8s_name(t.team): t for t in plan.teams}
    fresh = pd.to_datetime(queues["read_at"], utc=True) >= pd.Timestamp(at) - max_age
    slurm = queues[fresh & (queues["scheduler"] == "slurm")]
    if len(slurm):
        if not plan.gres:  # the types the site's sacct records name each model by (quota_plan.py `site_gres`)
            plan.gres = site_gres(store, config or Config(), plan, at)
        _slurm_limits(plan, slurm)
    for q in queues[fresh & (queues["scheduler"] != "slurm")].itertuples(index=False):
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


def _slurm_limits(plan: QuotaPlan, accounts: pd.DataFrame) -> None:
    """Slurm's GrpTRES GPU limits and Fairshare shares (scheduler_queues rows of scheduler `slurm`) into `plan`."""
    by_name = {t.team: t for t in plan.teams}
    for team in plan.teams:
        models = team.models() or sorted(plan.capacity)
        of_type: dict[str, list[str]] = {}
        for model in models:
            of_type.setdefault(plan.gres[model][0] if model in plan.gres else gres_type(model), []).append(model)
        for q in accounts[(accounts["queue"] == team.team) & accounts["limit_gpus"].notna()].itertuples(index=False):
            flavor = q.flavor if isinstance(q.flavor, str) else None
            matched = of_type.get(flavor, []) if flavor is not None else models
            if len(matched) != 1 or _advised(team.source.get(matched[0], "")):
                continue  # a type of several models (or none of this team's), or an untyped limit over several
            team.limit[matched[0]] = float(q.limit_gpus)
            team.source[matched[0]] = f"{REPORTED} slurm at {pd.Timestamp(q.read_at):%Y-%m-%d %H:%M} UTC"
    shares = accounts[accounts["flavor"].isna() & accounts["fairshare_shares"].notna()]
    reported = {q.queue: (float(q.fairshare_shares), q.read_at) for q in shares.itertuples(index=False)
                if q.queue in by_name}
    if plan.teams and set(reported) == set(by_name):
        for name, (share, read_at) in reported.items():
            by_name[name].share = share
            by_name[name].share_source = f"{REPORTED} slurm at {pd.Timestamp(read_at):%Y-%m-%d %H:%M} UTC"


def reported_notes(plan: QuotaPlan) -> list[str]:
    """The replay's note on where its quotas in force come from: the pairs the scheduler reported, in words."""
    taken = sorted(f"{t.team} {m}" for t in plan.teams for m, s in t.source.items() if s.startswith(REPORTED))
    notes = []
    if taken:
        notes.append(f"quotas in force as the scheduler reports them for {', '.join(taken)}; the config's [teams] "
                     "numbers for the rest")
    if plan.teams and all(t.share_source.startswith(REPORTED) for t in plan.teams):
        notes.append(f"shares as Slurm's Fairshare ({plan.teams[0].share_source}): "
                     + ", ".join(f"{t.team} {t.share:g}" for t in plan.teams))
    return notes
