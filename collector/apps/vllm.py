"""vLLM's `/metrics` (the `vllm:` families), every engine generation: the V0 engine (vllm/engine/metrics.py, up to
0.10), the V1 engine (vllm/v1/metrics/loggers.py, from 0.8) and the renames between them.

Facts from vLLM's source (PrometheusStatLogger in each generation), not from sample pages:
- Labels: `model_name` (the served model name) on every family; V1 adds `engine` (the engine index: one series
  per engine when a server runs several, data-parallel), so `engine` is identity and `model_name` the service.
  `vllm:request_success_total` adds `finished_reason` (stop, length, abort; error and repetition in newer V1):
  requests = the sum over all reasons, failed_requests = `finished_reason="error"` (an internal error vLLM turns
  into a 500; `abort` is the client's doing and stays a finished request).
- Renames: `vllm:time_per_output_token_seconds` -> `vllm:inter_token_latency_seconds` (0.11; the old name is
  written beside the new one while deprecated, both observing each inter-token interval);
  `vllm:gpu_cache_usage_perc` -> `vllm:kv_cache_usage_perc` (0.10; 1.0 means 100 %, already a fraction). Where a
  page has both, the new name wins and the old one is counted as superseded.
- Units: all latency histograms are in seconds, token counters in tokens; no scaling.
- `vllm:request_time_per_output_token_seconds` (V1) is a per-request mean, a different distribution from the
  per-token one: read past, not mixed into tpot_seconds.
"""
from __future__ import annotations

from gpuledger.collector.apps.spec import ServerReader, Source

SOURCES = (
    Source("vllm:request_success_total", "requests", note="V0 0.4+ and V1; summed over finished_reason"),
    Source("vllm:request_success_total", "failed_requests", select=(("finished_reason", "error"),),
           note="V1 0.11+ (FinishReason.ERROR)"),
    Source("vllm:prompt_tokens_total", "prompt_tokens", note="V0 and V1"),
    Source("vllm:generation_tokens_total", "generation_tokens", note="V0 and V1"),
    Source("vllm:time_to_first_token_seconds", "ttft_seconds", note="V0 0.3+ and V1"),
    Source("vllm:inter_token_latency_seconds", "tpot_seconds", note="V1 0.11+"),
    Source("vllm:time_per_output_token_seconds", "tpot_seconds", note="V0 and V1 up to 0.11 (deprecated there)"),
    Source("vllm:e2e_request_latency_seconds", "e2e_seconds", note="V0 0.4+ and V1"),
    Source("vllm:request_queue_time_seconds", "queue_seconds", note="V0 0.6+ and V1"),
    Source("vllm:num_requests_running", "requests_running", note="all versions"),
    Source("vllm:num_requests_waiting", "requests_waiting", note="all versions"),
    Source("vllm:kv_cache_usage_perc", "kv_cache_usage", note="V1 0.10+; a fraction despite the name"),
    Source("vllm:gpu_cache_usage_perc", "kv_cache_usage", note="V0 and V1 up to 0.10 (deprecated there)"),
)

# families vLLM writes that hold no canonical figure (read past on purpose; any other `vllm:` family is counted
# as unknown, which is how a new version's rename shows up)
KNOWN_UNUSED = frozenset({
    "vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc", "vllm:cpu_prefix_cache_hit_rate",
    "vllm:gpu_prefix_cache_hit_rate", "vllm:cache_config_info", "vllm:lora_requests_info",
    "vllm:num_preemptions_total", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total", "vllm:mm_cache_queries_total", "vllm:mm_cache_hits_total",
    "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:iteration_tokens_total",
    "vllm:request_max_num_generation_tokens", "vllm:request_params_n", "vllm:request_params_max_tokens",
    "vllm:request_inference_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
    "vllm:request_time_per_output_token_seconds", "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:spec_decode_draft_acceptance_rate",
    "vllm:spec_decode_efficiency", "vllm:avg_prompt_throughput_toks_per_s", "vllm:avg_generation_throughput_toks_per_s",
    "vllm:engine_sleep_state", "vllm:corrupted_requests_total",
})

READER = ServerReader(
    kind="vllm",
    sources=SOURCES,
    prefixes=("vllm:",),
    service_labels=("model_name",),
    identity_labels=("engine",),
    known_unused=KNOWN_UNUSED,
    colon_alias=True,
)
