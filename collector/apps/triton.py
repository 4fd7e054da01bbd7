"""NVIDIA Triton Inference Server's `/metrics` (`nv_inference_*`, and the TensorRT-LLM backend's `nv_trt_llm_*`).

Facts from Triton's docs (docs/user_guide/metrics.md) and core source (src/metrics.cc, src/infer_stats.cc,
src/metric_model_reporter.cc, src/ensemble_scheduler/ensemble_scheduler.cc):
- Per model series, labels `model` (the service) and `version`, plus `gpu_uuid` for a reporter tied to a GPU; a
  model's tags come as `_<tag>` labels (summed over). With model namespacing on (`--model-namespacing`, rare)
  Triton adds a `namespace` label naming the model's namespace: it is read like every server's `namespace` label,
  as the Kubernetes namespace a scrape config attaches, which is what it is on the usual Prometheus-scraped page.
  `nv_inference_request_failure` has a `reason` label (REJECTED, CANCELED, BACKEND, OTHER) from 24.08 on: summed
  over.
- Latencies are cumulative MICROSECOND counters (`nv_inference_request_duration_us`, `..._queue_duration_us`,
  `..._compute_{input,infer,output}_duration_us`), added to on success only (InferenceStatsAggregator::
  UpdateSuccess*), so request_duration_us / request_success is the mean latency: they become the `sum` (seconds)
  and `count` parts of e2e_seconds and queue_seconds. The summaries `nv_inference_{request,queue}_summary_us`
  (off by default) repeat them and rank after them; their quantiles are not stored.
- `nv_inference_first_response_histogram_ms` (24.11+, decoupled models; all models from 2025-12): time to first
  response in MILLISECONDS -> ttft_seconds.
- Old servers (22.x-23.x) print counters as floats (`100.000000`); read as any float.
- TensorRT-LLM backend gauges: `nv_trt_llm_request_metrics{request_type=active|waiting|...}` and
  `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}`; the compute durations hold no canonical
  figure and are read past.

Ensembles (the double counting rule). Triton reports an ensemble as a model of its own: every request a client
sends to the ensemble is counted under the ensemble (success/failure, inference and execution counts, request
and queue durations, with compute durations summed from its steps through a secondary stats aggregator) AND once
more under each composing model the ensemble scheduler forwards it to, as that model's own request (the docs'
failure-count note: a composing model's failure is counted under it and again under the ensemble). Summing a
page's models would count every ensemble request 1 + (number of steps) times. gpuledger bills the models that do
the work, so the rule is: an ensemble's series are left out (skipped as `triton_ensemble`, with their lines
counted) and its composing models' series are kept. A page does not say which models are ensembles (Triton gives
them no label, and since 2022 an ensemble reports executions like any model), so a model is treated as an ensemble
when its name is in the `ensembles` option (a config lists them) or, by the convention the TensorRT-LLM backend's
and Triton's tutorials' model repositories follow, when its name has `ensemble` as a `_`/`-`/`.` separated word
(`ensemble`, `ensemble_model`, `llama-ensemble`) or is the TensorRT-LLM backend's BLS pipeline `tensorrt_llm_bls`
(a Python model that calls the same composing models, with the same double count).
"""
from __future__ import annotations

import re
from typing import Mapping

from gpuledger.collector.apps.spec import ServerReader, Source

US = 1e-6
MS = 1e-3
SOURCES = (
    Source("nv_inference_request_success", "requests", note="all versions; one per request, whatever its batch"),
    Source("nv_inference_request_failure", "failed_requests", note="all versions; `reason` label from 24.08"),
    Source("nv_inference_count", "inferences", note="all versions; a batch of n counts n, cache hits not counted"),
    Source("nv_inference_request_duration_us", "e2e_seconds", US, as_part="sum", note="cumulative us, successes"),
    Source("nv_inference_request_success", "e2e_seconds", as_part="count"),
    Source("nv_inference_queue_duration_us", "queue_seconds", US, as_part="sum", note="cumulative us, successes"),
    Source("nv_inference_request_success", "queue_seconds", as_part="count"),
    Source("nv_inference_request_summary_us", "e2e_seconds", US, note="23.04+, off by default (--metrics-config)"),
    Source("nv_inference_queue_summary_us", "queue_seconds", US, note="23.04+, off by default"),
    Source("nv_inference_first_response_histogram_ms", "ttft_seconds", MS, note="24.11+, milliseconds"),
    Source("nv_trt_llm_request_metrics", "requests_running", select=(("request_type", "active"),),
           note="TensorRT-LLM backend"),
    Source("nv_trt_llm_request_metrics", "requests_waiting", select=(("request_type", "waiting"),),
           note="TensorRT-LLM backend"),
    Source("nv_inference_pending_request_count", "requests_waiting", note="23.09+: requests not yet executing"),
    Source("nv_trt_llm_kv_cache_block_metrics", "kv_cache_usage", select=(("kv_cache_block_type", "fraction"),),
           note="TensorRT-LLM backend; a fraction of the KV-cache blocks"),
)

KNOWN_UNUSED = frozenset({
    "nv_inference_exec_count", "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us", "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us", "nv_inference_compute_output_summary_us", "nv_model_load_duration_secs",
    "nv_energy_consumption", "nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_cpu_utilization", "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes", "nv_pinned_memory_pool_total_bytes", "nv_pinned_memory_pool_used_bytes",
    "nv_cache_util", "nv_cache_num_entries", "nv_cache_num_hits", "nv_cache_num_misses", "nv_cache_num_lookups",
    "nv_cache_num_evictions", "nv_cache_lookup_duration", "nv_cache_insertion_duration",
    "nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model", "nv_cache_hit_duration_per_model",
    "nv_cache_miss_duration_per_model", "nv_cache_hit_summary_per_model", "nv_cache_miss_summary_per_model",
    "nv_trt_llm_runtime_memory_metrics", "nv_trt_llm_inflight_batcher_metrics", "nv_trt_llm_general_metrics",
    "nv_trt_llm_disaggregated_serving_metrics", "nv_trt_llm_v1_metrics",
})

# model names that are ensembles (or BLS pipelines) by the convention their model repositories follow
_ENSEMBLE_WORD = re.compile(r"(?:^|[_\-.])ensemble(?:$|[_\-.])", re.IGNORECASE)
CONVENTIONAL_PIPELINES = frozenset({"tensorrt_llm_bls"})


def is_ensemble(model: str, ensembles: frozenset[str] = frozenset()) -> bool:
    """Whether a Triton model is treated as an ensemble (its series repeat its composing models' requests)."""
    return model in ensembles or model in CONVENTIONAL_PIPELINES or bool(_ENSEMBLE_WORD.search(model))


class TritonReader(ServerReader):
    """Triton's table, plus the ensemble rule above."""

    def excluded(self, service: str, labels: Mapping[str, str], options: Mapping[str, object]) -> str | None:
        ensembles = options.get("ensembles") or frozenset()
        return "triton_ensemble" if service and is_ensemble(service, frozenset(ensembles)) else None  # type: ignore


READER = TritonReader(
    kind="triton",
    sources=SOURCES,
    prefixes=("nv_inference_", "nv_trt_llm_", "nv_model_", "nv_cache_", "nv_gpu_", "nv_cpu_", "nv_energy_",
              "nv_pinned_memory_"),
    marks=("nv_inference_", "nv_trt_llm_"),  # GPU/CPU gauges alone do not make a page Triton's
    service_labels=("model",),
    identity_labels=("version",),
    known_unused=KNOWN_UNUSED,
)
