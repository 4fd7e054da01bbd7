"""Budgets per team and ledger period (spend, forecast), and the alerts the server raised."""
from __future__ import annotations

import json

from fastapi import APIRouter, Path, Query, Request

from gpuledger.analytics.budgets import budget_status
from gpuledger.analytics.records import records
from gpuledger.analytics.store.access import require_team
from gpuledger.analytics.store.alerts import alerts, set_budget
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import InputError
from gpuledger.deploy.api.access import AdminCaller, ReadCaller, audit_of
from gpuledger.deploy.api.deps import CaughtUp, ConfigDep, StoreDep
from gpuledger.deploy.api.models import Alert, BudgetRequest, BudgetStatus

router = APIRouter(tags=["budgets"], dependencies=[CaughtUp])  # deps.caught_up


@router.get("/v1/budgets", response_model=list[BudgetStatus])
def budgets(caller: ReadCaller, store: StoreDep, config: ConfigDep) -> list[dict]:
    """Per team with a budget, in the ledger period in progress: the budget and where it comes from, the spend so
    far, the forecast at the period's end (null without a day of history) and what it rests on."""
    return caller.visible(budget_status(store, config, utc_now()), shared=False)


@router.put("/v1/budgets/{team}", response_model=BudgetStatus)
def put_budget(body: BudgetRequest, request: Request, caller: AdminCaller, store: StoreDep, config: ConfigDep,
               team: str = Path(..., max_length=253)) -> dict:
    """Set a team's budget per ledger period (over the config's); audited. The team must be known (404)."""
    if team not in config.teams:
        require_team(store, team)
    if round(body.usd, 2) != body.usd:
        raise InputError(f"usd must be in whole cents, got {body.usd!r}")
    request.state.audit = {"team": team, "usd": body.usd}
    set_budget(store, team, body.usd, caller.actor, utc_now(), audit_of(request, caller, 200))
    return next(b for b in budget_status(store, config, utc_now()) if b["team"] == team)


@router.get("/v1/alerts", response_model=list[Alert])
def alert_log(caller: ReadCaller, store: StoreDep,
              open_only: bool = Query(False, alias="open", description="only alerts whose condition still holds"),
              limit: int = Query(200, ge=1, le=5000)) -> list[dict]:
    """The alerts raised, newest first: what, for which team, when fired and resolved, and where each message went."""
    found = [{**a, "detail": json.loads(a["detail"] or "{}"), "deliveries": json.loads(a["deliveries"] or "{}")}
             for a in records(alerts(store, limit))]
    if open_only:
        found = [a for a in found if a["resolved_at"] is None]
    return caller.visible(found, shared=False)
