"""GET /v1/catalogue: the GPU cards gpuledger knows (shipped and the site's `[catalogue]`), with their rates in
force, and the models present in the cluster, so a card that bills nothing is seen before the statement."""
from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from gpuledger.analytics.catalogue import catalogue_view
from gpuledger.analytics.windows import utc_now
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import StoreDep

router = APIRouter(tags=["catalogue"])


class Card(BaseModel):
    name: str = Field(description="the rate-card model: what rates, quotas, bills and plans name the card by")
    source: str = Field(description="'built-in' (gpuledger's catalogue) or 'site' (the config's [catalogue])")
    patterns: list[str] = Field(description="regular expressions on the driver's name that name this card")
    memory_gb: int = Field(description="the card's memory per NVIDIA's datasheet (fit and resize advice)")
    mig_slices: int = Field(description="compute slices of a MIG-capable card; 0: no MIG")
    mig_profiles: list[str] = Field(description="its MIG profiles, smallest first")
    nvlink: bool = Field(description="whether a node's GPUs of this card talk over NVLink")
    nvlink_gbytes_s: float | None = Field(description="NVLink bandwidth of one GPU, GB/s (null: none or unknown)")
    tdp_w: int | None = Field(description="board power, W (null: unknown)")
    list_usd_per_gpu_hour: float | None = Field(description="the catalogue's default rate (null: none)")
    price_basis: str | None = Field(description="where that default comes from")
    usd_per_gpu_hour: float | None = Field(description="the rate in force now (null: unpriced)")
    rate_status: str = Field(description="'priced', or why it bills nothing and how to price it")


class PresentModel(BaseModel):
    gpu_model: str = Field(description="a model present in the cluster now, as its samples name it")
    gpus: float = Field(description="GPUs of it present (MIG instances as their fractions)")
    catalogued: bool = Field(description="whether the catalogue knows it (false: the driver's raw name)")
    usd_per_gpu_hour: float | None = Field(description="its rate in force (null: unpriced)")
    rate_status: str = Field(description="'priced', or why it bills nothing and how to price it")


class Catalogue(BaseModel):
    cards: list[Card] = Field(description="every card in force, the site's first")
    present: list[PresentModel] = Field(description="the models present now, catalogued or not")


@router.get("/v1/catalogue", response_model=Catalogue)
def catalogue(caller: ReadCaller, store: StoreDep) -> dict:
    """The GPU catalogue in force and the models present now: which bill, and which bill nothing until named."""
    return catalogue_view(store, utc_now())
