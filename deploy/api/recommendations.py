"""Recommendations for schedulers: quota, reclaim and resize advice with its evidence, decisions, and exports."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse

from gpuledger.analytics.windows import utc_now
from gpuledger.deploy.api.access import AdminCaller, ClusterCaller, ReadCaller
from gpuledger.deploy.api.deps import ConfigDep, End, StoreDep
from gpuledger.deploy.api.models import Decision, Recommendation, Recommendations
from gpuledger.policies.exporting import export
from gpuledger.policies.recommendation import stored
from gpuledger.policies.recommender import DecisionError, UnknownRecommendation, decide

router = APIRouter(tags=["recommendations"])


@router.get("/v1/recommendations", response_model=Recommendations)
def recommendations(request: Request, caller: ReadCaller, end: datetime | None = End,
                    kind: str | None = Query(None, pattern="^(quota|reclaim|resize|consolidate|colocate|separate)$"),
                    team: str | None = None) -> dict:
    """The open recommendations (proposed or accepted) and, per team and GPU model without enough data, an
    `insufficient_data` note with the reason instead of a number.

    Advice comes from the policy window before the instant evaluated (`[quota] window_days`), never from a
    window the caller views, and is re-evaluated at most every `[quota] refresh_minutes`. With `end`, the policy
    is evaluated at that instant instead and nothing is stored (status `preview`)."""
    service = request.app.state.recommender
    team = caller.own(team)
    evaluation, recs = service.preview(end) if end else service.current()
    recs = [r.to_dict() for r in recs if (kind is None or r.kind == kind) and (team is None or r.team == team)]
    return {"generated_at": utc_now(), "as_of": evaluation.at,
            "policy_window": {"start": evaluation.start, "end": evaluation.at}, "recommendations": recs}


@router.get("/v1/recommendations/history", response_model=list[Recommendation])
def history(caller: ReadCaller, store: StoreDep, team: str | None = None, status: str | None = Query(
        None, pattern="^(proposed|accepted|rejected|applied|superseded)$"),
            limit: int = Query(200, ge=1, le=10000)) -> list[dict]:
    """Every stored recommendation, newest first, with what was decided, by whom, when and why."""
    return [r.to_dict() for r in stored(store, statuses=(status,) if status else None, team=caller.own(team), limit=limit)]


@router.get("/v1/recommendations/export", response_class=PlainTextResponse, responses={200: {
    "content": {"application/yaml": {}, "text/x-shellscript": {}},
    "description": "KAI / Kueue / Volcano objects as YAML, a sacctmgr script for Slurm, or JSON"}})
def export_plan(caller: ClusterCaller, store: StoreDep, config: ConfigDep, target: str = Query(..., pattern="^(kai|kueue|volcano|slurm)$"),
                status: str = Query("open", pattern="^(open|accepted)$",
                                    description="open: proposed and accepted recommendations; accepted: only those"),
                format: str = Query("native", pattern="^(native|json)$")) -> PlainTextResponse:
    """The quota plan as the target scheduler's objects: each team's share, and its guarantee and limit per GPU
    model as the recommendations chosen by `status` would set them (the numbers in force elsewhere). The same as
    `gpuledger emit --target T`; to get only changes against the objects that exist, use `emit --current`."""
    exported = export(store, config, target, status)
    return PlainTextResponse(exported[format], media_type="application/json" if format == "json"
                             else exported.media_type)


@router.post("/v1/recommendations/{rec_id}/decision", response_model=Recommendation)
def decision(rec_id: str, body: Decision, request: Request, caller: AdminCaller, store: StoreDep) -> dict:
    """Record a decision on a recommendation: accept, reject, or applied. Needs an admin token."""
    request.state.audit = {"recommendation": rec_id, "decision": body.decision, "by": body.by, "note": body.note}
    try:
        return decide(store, rec_id, body.decision, body.by, body.note).to_dict()
    except UnknownRecommendation as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from exc
    except DecisionError as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from exc
