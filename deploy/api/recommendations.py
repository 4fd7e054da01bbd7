"""Recommendations for schedulers: quota, reclaim and resize advice with its evidence, decisions, and exports."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse

from gpuledger.analytics.windows import utc_now
from gpuledger.deploy.api.access import AdminCaller, ClusterCaller, ReadCaller, audit_of
from gpuledger.deploy.api.deps import CaughtUp, ConfigDep, End, StoreDep
from gpuledger.deploy.api.models import (
    Decision,
    ExportFormat,
    ExportStatus,
    Kind,
    Recommendation,
    Recommendations,
    StoredStatus,
    Target,
)
from gpuledger.policies.alternatives import annotate, potential_savings
from gpuledger.policies.exporting import DEFAULT_STATUS, export
from gpuledger.policies.recommendation import Recommendation as RecommendationRecord
from gpuledger.policies.recommendation import for_team, stored
from gpuledger.policies.recommender import DecisionError, Evaluation, UnknownRecommendation, decide

router = APIRouter(tags=["recommendations"], dependencies=[CaughtUp])  # deps.caught_up


def recommendations_answer(evaluation: Evaluation, recs: list[RecommendationRecord], kind: str | None = None,
                           team: str | None = None, redact_for: str | None = None) -> dict:
    """The open recommendations as GET /v1/recommendations answers them and `gpuledger recommend` prints them:
    one shape (the `Recommendations` model, as JSON), built here for both. `redact_for`: a team token's team,
    whose view names no other team's jobs or users."""
    # alternatives are found among all the advice, then shown with the part asked for
    grouped = annotate([r.to_dict() for r in recs])
    chosen = [{**(for_team(r, redact_for).to_dict() if redact_for else shown), "alternatives": shown["alternatives"]}
              for r, shown in zip(recs, grouped)
              if (kind is None or r.kind == kind) and (team is None or r.team == team)]
    return Recommendations.model_validate({
        "generated_at": utc_now(), "as_of": evaluation.at,
        "policy_window": {"start": evaluation.start, "end": evaluation.at},
        "recommendations": chosen, "potential_savings": potential_savings(chosen)}).model_dump(mode="json")


@router.get("/v1/recommendations", response_model=Recommendations)
def recommendations(request: Request, caller: ReadCaller, store: StoreDep, end: datetime | None = End,
                    kind: Kind | None = Query(None, description="only advice of this kind"),
                    team: str | None = None) -> dict:
    """The open recommendations (proposed or accepted) and, per team and GPU model without enough data, an
    `insufficient_data` note with the reason instead of a number.

    Placement advice that wants the same free GPUs or the same job is one group of alternatives (`alternatives`:
    group id, rank, what it competes with); `potential_savings` counts each group once: the most valuable set of
    its advice that can all be done together.

    Advice comes from the policy window before the instant evaluated (`[quota] window_days`), never from a
    window the caller views, and is re-evaluated at most every `[quota] refresh_minutes`. With `end`, the policy
    is evaluated at that instant instead and nothing is stored (status `preview`)."""
    service = request.app.state.recommender
    team = caller.own(team, store)
    evaluation, recs = service.preview(end) if end else service.current()
    return recommendations_answer(evaluation, recs, kind, team, redact_for=team if caller.team else None)


@router.get("/v1/recommendations/history", response_model=list[Recommendation])
def history(caller: ReadCaller, store: StoreDep, team: str | None = None,
            status: StoredStatus | None = Query(None, description="only recommendations with this status"),
            limit: int = Query(200, ge=1, le=10000)) -> list[dict]:
    """Every stored recommendation, newest first, with what was decided, by whom, when and why."""
    team = caller.own(team, store)
    recs = stored(store, statuses=(status,) if status else None, team=team, limit=limit)
    return [(for_team(r, team) if caller.team else r).to_dict() for r in recs]  # a team token: no other team named


@router.get("/v1/recommendations/export", response_class=PlainTextResponse, responses={200: {
    "content": {"application/yaml": {}, "text/x-shellscript": {}},
    "description": "KAI / Kueue / Volcano objects as YAML, a sacctmgr script for Slurm, or JSON"}})
def export_plan(caller: ClusterCaller, store: StoreDep, config: ConfigDep, target: Target = Query(..., description="the scheduler"),
                status: ExportStatus = Query(DEFAULT_STATUS, description="accepted (the default): only advice an "
                                             "admin accepted; open: proposed too, to review the plan it would make"),
                format: ExportFormat = Query("native", description="native: YAML, or a shell script for slurm; "
                                                                   "json: the objects as JSON"),
                fill: bool = Query(False, description="share out by the teams' shares the GPUs accepted advice "
                                                      "leaves under no guarantee, instead of answering 422")
                ) -> PlainTextResponse:
    """The quota plan as the target scheduler's objects: each team's share, and its guarantee and limit per GPU
    model as the recommendations chosen by `status` would set them (the numbers in force elsewhere). The same as
    `gpuledger emit --target T`; to get only changes against the objects that exist, use `emit --current`. The
    native text opens with a header: when and from which advice it was made, every adjustment made so that it can
    be applied (and for Kueue the Configuration fragment it needs). A plan that would strand GPUs or could not
    start a job shape of the policy window answers 422 naming the model and the shortfall."""
    exported = export(store, config, target, status, fill=fill)
    return PlainTextResponse(exported[format], media_type="application/json" if format == "json"
                             else exported.media_type)


@router.post("/v1/recommendations/{rec_id}/decision", response_model=Recommendation)
def decision(rec_id: str, body: Decision, request: Request, caller: AdminCaller, store: StoreDep) -> dict:
    """Record a decision on a recommendation: accept, reject, or applied. Needs an admin token."""
    request.state.audit = {"recommendation": rec_id, "decision": body.decision, "by": body.by, "note": body.note}
    try:
        return decide(store, rec_id, body.decision, body.by, body.note, audit=audit_of(request, caller, 200),
                      shown=request.app.state.recommender.listed).to_dict()
    except UnknownRecommendation as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from exc
    except DecisionError as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from exc
