"""The GPU inventory: which node each GPU is registered to, the rows held because a node sent a GPU not its own,
and an admin's move of a GPU (analytics/store/gpu_inventory.py says why an agent cannot move one itself)."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from gpuledger.analytics.records import records
from gpuledger.analytics.store.gpu_inventory import inventory_rows, reported
from gpuledger.collector.errors import NotFoundError, UnavailableError
from gpuledger.deploy.api.access import AdminCaller, ReadCaller, audit_of
from gpuledger.deploy.api.deps import StoreDep
from gpuledger.deploy.api.models import RequestBody

router = APIRouter(tags=["inventory"])
NodeName = Path(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9._:-]+$")


class RegisteredGpu(BaseModel):
    node: str = Field(description="the node the GPU is registered to: the only node whose rows of it are billed")
    gpu_uuid: str = Field(description="the GPU's UUID as NVML or dcgm-exporter reports it")
    gpu_model: str | None = Field(description="the model registered with it; rows naming another are refused")
    registered_at: datetime = Field(description="when it was registered there")
    registered_by: str = Field(description="'first-sight' (the node's own first reports), 'history' (an older "
                                           "store's samples) or 'admin:<who>'")


class HeldRows(BaseModel):
    node: str = Field(description="the node that sent them")
    gpu_uuid: str = Field(description="the GPU the rows claim")
    reason: str = Field(description="gpu_on_other_node (registered to `registered_to`) or gpu_not_in_inventory "
                                    "(new on a node whose inventory is closed)")
    rows: int = Field(description="rows held")
    first_ts: datetime = Field(description="the first instant held")
    last_ts: datetime = Field(description="the last instant held")
    gpu_hours: float | None = Field(description="what they would bill if released")
    registered_to: str | None = Field(description="the node the GPU is registered to (null: none)")


class Inventory(BaseModel):
    gpus: list[RegisteredGpu] = Field(description="every registered GPU")
    held: list[HeldRows] = Field(description="rows not billed, kept until an admin moves the GPU")


class Assignment(RequestBody):
    gpu_uuid: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$",
                          description="the GPU to register to the node")
    gpu_model: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._ -]+$",
                                  description="the model to register (default: as registered, else as its held "
                                              "rows say)")


class Assigned(BaseModel):
    gpu_uuid: str = Field(description="the GPU registered")
    node: str = Field(description="the node it is registered to now")
    previous_node: str | None = Field(description="where it was registered before (null: nowhere)")
    gpu_model: str | None = Field(description="its registered model")
    released_rows: int = Field(description="held rows of this node's now stored")
    refused_rows: dict[str, int] = Field(description="held rows refused on release, by reason (overlaps_stored: "
                                                     "that time of the GPU was billed already)")
    still_held_rows: int = Field(description="rows of it this node sent that stay held (another model)")


@router.get("/v1/nodes/inventory", response_model=Inventory)
def inventory(caller: ReadCaller, store: StoreDep) -> dict:
    """Every registered GPU with its node and model, and the rows held per node, GPU and reason."""
    gpus, held = inventory_rows(store)
    return {"gpus": records(gpus), "held": records(held)}


@router.post("/v1/nodes/{node}/gpus", response_model=Assigned)
def assign(body: Assignment, request: Request, caller: AdminCaller, store: StoreDep, node: str = NodeName) -> dict:
    """Register a GPU to `node` (a GPU moved to another machine, a card replaced, a node registered late) and store
    the rows `node` sent of it that were held. Audited. The only way a GPU changes node."""
    writer = request.app.state.ingest
    if writer is None:
        raise UnavailableError("ingest is not enabled on this server (read-only): the inventory cannot change")
    if not reported(store, body.gpu_uuid):
        raise NotFoundError(f"no node has reported GPU {body.gpu_uuid}: nothing to register")
    request.state.audit = {"node": node, "gpu_uuid": body.gpu_uuid}
    return writer.assign(body.gpu_uuid, node, caller.actor, body.gpu_model, audit=audit_of(request, caller, 200))
