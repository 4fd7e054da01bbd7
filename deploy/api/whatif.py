"""What-if: the recorded jobs replayed under the quotas in force and a proposal (policies/whatif). A question, not
a write: nothing is stored, so a POST needs only a read token, but every team's waits are in the answer, so not
a team token."""
from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from gpuledger.analytics.records import json_safe
from gpuledger.analytics.windows import as_utc, utc_now
from gpuledger.deploy.api.access import ClusterCaller
from gpuledger.deploy.api.deps import CaughtUp, ConfigDep, StoreDep
from gpuledger.deploy.api.models import PlacementWhatIfAnswer, PlacementWhatIfRequest, WhatIfAnswer, WhatIfRequest
from gpuledger.policies.recommender import evaluate
from gpuledger.policies.whatif import run_whatif
from gpuledger.policies.whatif.placement import placement_whatif

router = APIRouter(tags=["whatif"], dependencies=[CaughtUp])


@router.post("/v1/whatif", response_model=WhatIfAnswer)
async def whatif(request: WhatIfRequest, caller: ClusterCaller, store: StoreDep, config: ConfigDep) -> dict:
    """Replay the window's recorded jobs through a Kueue-, KAI- or Slurm-like model under the quotas in force and
    under the proposal (the open recommendations, then `edits`), and answer per team the waits, completion times,
    GPU-hours served and preemptions under both, the difference, and what was assumed. 422 with the reason for a
    proposal over capacity, an unknown team or a window without job records."""
    end = as_utc(request.end) if request.end else utc_now()
    start = as_utc(request.start) if request.start else end - timedelta(days=config.quota.window_days)
    edits = {team: {model: edit.model_dump(exclude_none=True) for model, edit in models.items()}
             for team, models in request.edits.items()}
    answer = await run_in_threadpool(run_whatif, store, config, start, end, request.model, edits,
                                     request.use_recommendations, request.capacity, evaluate)
    return json_safe(answer.to_dict())


@router.post("/v1/whatif/placement", response_model=PlacementWhatIfAnswer)
async def placement(request: PlacementWhatIfRequest, caller: ClusterCaller, store: StoreDep,
                    config: ConfigDep) -> dict:
    """Replay the window's recorded jobs through each placer on the GPUs present at its end, from empty, and answer
    per placer: GPU allocated and fragmented, stranded GPU-hours and dollars, waits, and the gang jobs that would
    have started earlier than they did. 422 for a window without job records or nodes."""
    end = as_utc(request.end) if request.end else utc_now()
    start = as_utc(request.start) if request.start else end - timedelta(days=config.quota.window_days)
    answer = await run_in_threadpool(placement_whatif, store, start, end, list(dict.fromkeys(request.placers)))
    return json_safe(answer)
