"""The ledger: periods and their state, a period's statement (stored when closed, a draft while open), and
adjustments an admin books to correct a closed period."""
from __future__ import annotations

from fastapi import APIRouter, Path, Request

from gpuledger.analytics.ledger import adjust, periods, statement, team_total
from gpuledger.deploy.api.access import AdminCaller, ReadCaller, audit_of
from gpuledger.deploy.api.deps import CaughtUp, ConfigDep, StoreDep
from gpuledger.deploy.api.models import Adjustment, AdjustmentRequest, PeriodState, Statement

router = APIRouter(tags=["ledger"], dependencies=[CaughtUp])  # deps.caught_up
PERIOD = Path(..., max_length=16, description="2026-11 (a month) or 2026-W48 (an ISO week), as [ledger] period says")


@router.get("/v1/ledger/periods", response_model=list[PeriodState])
def ledger_periods(caller: ReadCaller, store: StoreDep, config: ConfigDep) -> list[dict]:
    """Every closed period with its total, then the open ones up to now with when each closes."""
    return periods(store, config.ledger)


@router.get("/v1/ledger/statements/{period}", response_model=Statement)
def period_statement(caller: ReadCaller, store: StoreDep, config: ConfigDep, period: str = PERIOD) -> dict:
    """A period's statement: per bill line, GPU model and rate card version, with the adjustments booked into
    it. A closed period's is the stored one and never changes; an open period's is a draft computed now. A team
    token sees its own and the shared lines (unattributed, idle capacity) and the cluster's total."""
    found = statement(store, config.ledger, period)
    found["cluster_total_usd"] = found["total_usd"]
    if caller.team:
        found["lines"] = caller.visible(found["lines"])
        found["adjustments"] = caller.visible(found["adjustments"])
        found["teams"] = caller.visible(found["teams"])
        found["total_usd"] = team_total(found["teams"])
    return found


@router.post("/v1/ledger/adjustments", response_model=Adjustment, status_code=201)
def book(body: AdjustmentRequest, request: Request, caller: AdminCaller, store: StoreDep, config: ConfigDep) -> dict:
    """Book a correction of a period for a team (USD: positive charges, negative credits), into the first open
    period at or after the one it corrects, with who made it and why; audited with the write. Needs an admin
    token."""
    request.state.audit = {"team": body.team, "corrects": body.corrects, "usd": body.usd}
    return adjust(store, config.ledger, body.team, body.usd, body.reason, body.corrects, caller.actor,
                  set(config.teams), audit=audit_of(request, caller, 201))
