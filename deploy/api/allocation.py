"""OpenCost's `/allocation` API over gpuledger's GPU costs, so dashboards and tools built on OpenCost read them."""
from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query

from gpuledger.analytics.allocation import AGGREGATES, allocation_sets
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import CaughtUp, StoreDep
from gpuledger.deploy.api.models import AllocationAnswer

router = APIRouter(tags=["opencost"], dependencies=[CaughtUp])  # deps.caught_up
TEAM_AGGREGATES = ("team", "label:team", "cluster")  # what a team token may aggregate by: nothing names another's


@router.get("/allocation", response_model=AllocationAnswer)
@router.get("/allocation/compute", response_model=AllocationAnswer)
def allocation(caller: ReadCaller, store: StoreDep,
               window: str = Query(..., max_length=80, description="30m, 24h, 7d, 2w; today, yesterday, week, "
                                   "month, lastweek, lastmonth; or start,end as RFC 3339 or Unix seconds"),
               aggregate: str = Query("namespace", description=f"one of {', '.join(AGGREGATES)}"),
               step: str | None = Query(None, max_length=16, description="one set per step (e.g. 1d); default: "
                                                                          "the whole window"),
               accumulate: bool = Query(False, description="one set over the whole window"),
               include_idle: bool = Query(False, alias="includeIdle", description="include the __idle__ allocation"),
               share_idle: bool = Query(False, alias="shareIdle", description="share idle cost to allocations by "
                                                                              "their GPU-hours of the same card"),
               idle_by_node: bool = Query(False, alias="idleByNode", description="share idle per node, not per "
                                                                                 "cluster")) -> dict:
    """Allocations as OpenCost's API returns them ({code, data: [set, ...]}), with its field names and units; a team
    token may aggregate by team or cluster only and sees its own team and the shared lines."""
    if caller.team is not None and aggregate not in TEAM_AGGREGATES:
        raise HTTPException(status_code=403, detail=f"a team token may aggregate by {', '.join(TEAM_AGGREGATES)}")
    sets = allocation_sets(store, window, aggregate, step, accumulate, include_idle, share_idle, idle_by_node)
    if caller.team is not None and aggregate != "cluster":
        sets = [{name: a for name, a in found.items() if caller.visible([{"team": name}])} for found in sets]
    return {"code": 200, "data": sets}
