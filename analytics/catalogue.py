"""The GPU catalogue in force as a site reads it (GET /v1/catalogue): every card with where its entry comes from,
its memory, MIG geometry and NVLink, and its rate in force now; and the models present in the cluster, each said
to be catalogued or not and priced or not. Why: a card the catalogue does not know bills nothing until the site
names a rate, and an admin must be able to see that before the statement does (unknown is never zero)."""
from __future__ import annotations

from datetime import datetime

from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import capacity_by_model
from gpuledger.collector.gpu_catalog import MODELS, UNKNOWN_MODEL


def _rate_status(model: str, rates: dict[str, float]) -> str:
    if model in rates:
        return "priced"
    return f"unpriced: billed once the site names a rate ([rates] \"{model}\" = USD per GPU-hour)"


def catalogue_view(store: Store, now: datetime) -> dict:
    """The cards in force (site first, then shipped) and the models present now with their GPUs."""
    rates = store.current_rates()
    cards = [{"name": m.name, "source": m.source, "patterns": list(m.patterns), "memory_gb": m.memory_gb,
              "mig_slices": m.mig_slices, "mig_profiles": [p.name for p in m.mig_profiles], "nvlink": m.nvlink,
              "nvlink_gbytes_s": m.nvlink_gbytes_s, "tdp_w": m.tdp_w, "list_usd_per_gpu_hour": m.usd_per_gpu_hour,
              "price_basis": m.price_basis, "usd_per_gpu_hour": rates.get(m.name),
              "rate_status": _rate_status(m.name, rates)} for m in MODELS.values()]
    present = capacity_by_model(store, now)
    models = [{"gpu_model": row.gpu_model, "gpus": float(row.gpus),
               "catalogued": row.gpu_model in MODELS, "usd_per_gpu_hour": rates.get(row.gpu_model),
               "rate_status": ("unknown model: the driver named no card" if row.gpu_model == UNKNOWN_MODEL
                               else _rate_status(row.gpu_model, rates))}
              for row in present.itertuples()]
    return {"cards": cards, "present": models}
