"""`POST /v1/admin/compact`: the running server folds what is closed (after rebuilding the rollups from the raw
samples kept, with `rebuild`), drops what retention expired and checkpoints, as `gpuledger compact` does on a file
(deploy/compaction.py); `gpuledger compact --server` asks this. The server does this on its own once a day; an
admin asks after changing the idle threshold or retention, or to check the rollups. Admin token."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from gpuledger.deploy.api.access import AdminCaller
from gpuledger.deploy.api.deps import StoreDep
from gpuledger.deploy.api.models import RequestBody
from gpuledger.deploy.compaction import compact

router = APIRouter(tags=["admin"])


class CompactRequest(RequestBody):
    rebuild: bool = Field(False, description="first rebuild the rollups from the raw samples kept")


class Compacted(BaseModel):
    folded_minutes: int = Field(description="minutes folded into the rollups")
    complete_to: datetime = Field(description="the rollups hold every closed minute before this instant")
    dropped: dict[str, int] = Field(description="rows dropped per table as retention expired them")
    raw_days: float = Field(description="[retention] raw_days in force")
    minute_days: float = Field(description="[retention] minute_days in force")


@router.post("/v1/admin/compact", response_model=Compacted)
def compact_store(body: CompactRequest, request: Request, caller: AdminCaller, store: StoreDep) -> dict:
    """Fold, optionally rebuild, apply retention and checkpoint; answers when done (a rebuild of a month of 1,000
    GPUs takes minutes). Ingest goes on meanwhile: each fold step is its own short transaction."""
    request.state.audit = {"rebuild": body.rebuild}
    return compact(store, body.rebuild)


__all__ = ["router"]
