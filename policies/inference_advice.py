"""Advice from what inference services achieve: right-size a service far inside its SLO on a bigger GPU than it
needs, and separate one that misses its SLO while it shares a GPU with other work.

Why from the services' own figures: a vLLM server preallocates ~90% of the card for its KV cache, so its memory use
says nothing about what it needs, and its GPU_UTIL says little about its latency. What it needs is its weights plus
the KV cache it actually filled (`kv_cache_usage`, highest read), and whether it is fast enough is its latency
against its objective. Both are read over SERVICE_WINDOW before the advice's instant.

Right-size: every bound of its SLO measured and at most FAR_UNDER of it, running now on whole GPUs, its cost known.
The memory it needs is its weights (from the parameter count in the model's name, in BF16: 2 bytes a parameter, an
assumption the evidence states) plus the share of the rest of the card's used memory its KV cache filled, with 20%
headroom; the compute it needs is its GPU_UTIL p95 scaled by SM activity where reported (analytics/waste.py). The
target is the smallest MIG slice of its card, else a smaller card, that holds both (waste.smallest_fit), and the
advice states the service's cost per million tokens projected on it, assuming the same throughput (it has the
latency headroom to keep it).

Separate: a service that missed a bound of its SLO whose pod shares a GPU with another job gets separation advice
with its measured latency (policies/consolidation.py separate_advice makes it; this module says which jobs and why).
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.inference import SLO_FIGURES, service_table
from gpuledger.analytics.records import number_or_none
from gpuledger.analytics.store import Store
from gpuledger.analytics.waste import MEMORY_HEADROOM, job_profiles, smallest_fit, with_compute_need, with_p95
from gpuledger.policies.quota import HOURS_PER_WEEK
from gpuledger.policies.recommendation import Recommendation, known_evidence

SERVICE_WINDOW = timedelta(days=1)  # latency and KV-cache use are judged over the last day
FAR_UNDER = 0.5  # every measured quantile at most this share of its bound: far inside the SLO
BYTES_PER_PARAMETER = 2.0  # BF16/FP16 weights
_PARAMETERS = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])")


def weights_mib(service: str) -> float | None:
    """The model's weights in MiB from the parameter count in its name (`Llama-3.1-8B-Instruct`: 8e9 × 2 bytes), or
    None where the name gives none: then no memory is assumed and no right-size advice is made."""
    found = _PARAMETERS.findall(service)
    if not found:
        return None
    return float(found[-1]) * 1e9 * BYTES_PER_PARAMETER / 2 ** 20


def missed_slos(store: Store, config: Config, at: datetime) -> dict[str, dict]:
    """Per job serving a service that missed its SLO over SERVICE_WINDOW: the service and the measured evidence."""
    if not config.slo:
        return {}
    services = service_table(store, at - SERVICE_WINDOW, at, config.slo)
    out: dict[str, dict] = {}
    for row in services[services["slo_status"] == "missed"].itertuples(index=False) if len(services) else []:
        measured = {k: v for k in row.slo if (v := number_or_none(getattr(row, _column(k)))) is not None}
        for job in row.jobs:
            out[job] = {"service": row.service, "server": row.kind, "slo": row.slo, "measured": measured,
                        "slo_missed": list(row.slo_missed)}
    return out


def judged_jobs(store: Store, config: Config, at: datetime) -> set[str]:
    """The jobs serving a service judged against an SLO over SERVICE_WINDOW (met, missed or unknown): their size
    is for the service's own advice to say (right-size when far inside it), never the memory rule's."""
    if not config.slo:
        return set()
    services = service_table(store, at - SERVICE_WINDOW, at, config.slo)
    judged = services[services["slo_status"].notna()] if len(services) else services
    return {str(j) for jobs in judged["jobs"] for j in jobs} if len(judged) else set()


def rightsize_advice(store: Store, config: Config, at: datetime, latest: datetime,
                     skip_jobs: set[str | None]) -> list[Recommendation]:
    """Resize advice for services far inside their SLO on more GPU than they need (module docstring)."""
    if not config.slo:
        return []
    start = at - SERVICE_WINDOW
    services = service_table(store, start, at, config.slo)
    if services.empty:
        return []
    calm = services[(services["slo_status"] == "met") & services["cost_usd"].notna()]
    if calm.empty:
        return []
    profiles = job_profiles(store, start, at, jobs=sorted({str(j) for jobs in calm["jobs"] for j in jobs}))
    profiles = profiles[pd.to_datetime(profiles["last_ts"]) >= pd.Timestamp(latest)]  # running: can be moved
    if profiles.empty:
        return []
    profiles = with_compute_need(with_p95(store, profiles, start, at))  # one percentile query for them all
    rates = store.current_rates()
    out = []
    for row in calm.itertuples(index=False):
        bounds = row.slo
        measured = {k: number_or_none(getattr(row, _column(k))) for k in bounds}
        if any(v is None or v > FAR_UNDER * bounds[k] for k, v in measured.items()):
            continue
        weights = weights_mib(row.service)
        kv = number_or_none(row.kv_cache_usage_max)
        jobs = [j for j in row.jobs if j not in skip_jobs]
        mine = profiles[profiles["job_id"].isin(jobs)]
        if weights is None or kv is None or mine.empty:
            continue
        for job in mine.itertuples(index=False):
            if pd.isna(job.compute_pct) or pd.isna(job.peak_mem_mib):
                continue
            cache = kv * max(float(job.peak_mem_mib) - weights, 0.0)
            need_mib = weights + cache  # smallest_fit adds MEMORY_HEADROOM
            fit = smallest_fit(str(job.gpu_model), need_mib, float(job.compute_pct))
            if fit is None:
                continue
            rate, target_rate = rates.get(job.gpu_model), rates.get(fit["target"])
            scale = (fit["gpu_fraction"] if fit["kind"] == "mig" else
                     (float(target_rate) / float(rate) if rate and target_rate else None))
            projected = row.cost_per_million_tokens * scale if scale is not None else None
            freed = int(job.gpus) * (1.0 - float(fit["gpu_fraction"])) if fit["kind"] == "mig" else None
            saving = (freed * float(rate) * HOURS_PER_WEEK if freed is not None and rate else
                      int(job.gpus) * (float(rate) - float(target_rate)) * HOURS_PER_WEEK
                      if rate and target_rate else None)
            out.append(Recommendation(
                kind="resize", team=str(row.team), gpu_model=str(job.gpu_model), job_id=str(job.job_id),
                action={"move_to": fit["target"], "target_kind": fit["kind"], "from": job.gpu_model,
                        "gpus": int(job.gpus), "per_gpu": True, "target_gpu_fraction": fit["gpu_fraction"],
                        "gpus_freed": freed},
                evidence=known_evidence({"service": row.service, "server": row.kind, "slo": bounds,
                          "measured": measured,
                          "kv_cache_usage_max": kv, "weights_mib": weights,
                          "weights_assumption": f"{BYTES_PER_PARAMETER:g} bytes per parameter (BF16) from the "
                                                "parameter count in the model's name",
                          "needed_mib": need_mib * MEMORY_HEADROOM, "peak_mem_mib": float(job.peak_mem_mib),
                          "compute_pct": float(job.compute_pct), "compute_signal": job.compute_signal,
                          "cost_per_million_tokens": float(row.cost_per_million_tokens),
                          "projected_cost_per_million_tokens": projected,
                          "projection_assumption": "the same tokens per second on the target",
                          "effect_usd_per_week": saving}),
                reason=(f"{row.service} ({row.kind}) in {job.job_id} runs far inside its SLO ("
                        + ", ".join(f"{k.replace('_s', '')} {v:.3g}s of {bounds[k]:g}s" for k, v in measured.items())
                        + f") on {int(job.gpus)} × {job.gpu_model}; weights and the KV cache it filled "
                        f"({kv:.0%}) fit {fit['target']}"
                        + (f": ${row.cost_per_million_tokens:.3f} → ${projected:.3f} per million tokens"
                           if projected is not None else ""))))
    return out


def _column(bound: str) -> str:
    figure, q = SLO_FIGURES[bound]
    return f"{figure.removesuffix('_seconds')}_p{round(q * 100)}_s"

