"""SGLang's `/metrics` (the `sglang:` families of its tokenizer manager and scheduler) and its router's.

Server facts from SGLang's source (python/sglang/srt/metrics/collector.py: TokenizerMetricsCollector and
SchedulerMetricsCollector; docs/references/production_metrics.md):
- Labels: `model_name` (service) on every family, and per process `engine_type` (unified, prefill, decode),
  `tp_rank`, `pp_rank`, `dp_rank`, `moe_ep_rank` in versions that add them: all identity.
- Counters (tokenizer manager, per finished request): `sglang:num_requests_total`, `sglang:prompt_tokens_total`,
  `sglang:generation_tokens_total`; `sglang:num_aborted_requests_total` (aborted by the server: a client gone,
  an error) is read as failed_requests.
- Histograms in SECONDS: `sglang:time_to_first_token_seconds`, `sglang:inter_token_latency_seconds` (0.4.7+;
  earlier `sglang:time_per_output_token_seconds`; SGLang observes a burst of n tokens as n observations of
  interval/n, so its count is tokens and its mean the time per token), `sglang:e2e_request_latency_seconds`,
  `sglang:queue_time_seconds` (scheduler, 0.4.4+).
- Gauges: `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage` (the KV token pool in use,
  0..1).

Router facts (SGLang's Rust router: sgl-router/src/metrics.rs, `sgl_router_*`, sglang-router 0.1-0.2; its
successor sgl-model-gateway, `smg_*`; both on metrics-exporter-prometheus, durations in seconds):
- `smg_router_requests_total` / `sgl_router_requests_total` (requests), `..._request_errors_total` (failed),
  `..._request_duration_seconds` (e2e), `smg_router_ttft_seconds`, `smg_router_tpot_seconds` (gRPC mode),
  `smg_router_tokens_total{token_type=input|output}`, running requests per worker (`smg_worker_requests_active`,
  `sgl_router_running_requests`). Labels `model` (gateway) is the service; `worker`/`worker_url` are identity;
  `route`, `method`, `endpoint`, `router_type`, `backend_type`, `connection_mode`, `streaming`, `error_type` are
  summed over. sgl-router counts a request when it arrives, the gateway when it is routed.
"""
from __future__ import annotations

from gpuledger.collector.apps.spec import ServerReader, Source

SOURCES = (
    Source("sglang:num_requests_total", "requests", note="0.4+: one per finished request"),
    Source("sglang:num_aborted_requests_total", "failed_requests", note="0.4.8+"),
    Source("sglang:prompt_tokens_total", "prompt_tokens", note="all versions"),
    Source("sglang:generation_tokens_total", "generation_tokens", note="all versions"),
    Source("sglang:time_to_first_token_seconds", "ttft_seconds", note="all versions"),
    Source("sglang:inter_token_latency_seconds", "tpot_seconds", note="0.4.7+"),
    Source("sglang:time_per_output_token_seconds", "tpot_seconds", note="up to 0.4.6"),
    Source("sglang:e2e_request_latency_seconds", "e2e_seconds", note="all versions"),
    Source("sglang:queue_time_seconds", "queue_seconds", note="0.4.4+ (scheduler)"),
    Source("sglang:num_running_reqs", "requests_running", note="all versions"),
    Source("sglang:num_queue_reqs", "requests_waiting", note="all versions"),
    Source("sglang:token_usage", "kv_cache_usage", note="a fraction of the KV token pool"),
)

KNOWN_UNUSED = frozenset({
    "sglang:num_used_tokens", "sglang:gen_throughput", "sglang:cache_hit_rate", "sglang:spec_accept_length",
    "sglang:spec_accept_rate", "sglang:num_grammar_queue_reqs", "sglang:num_running_reqs_offline_batch",
    "sglang:pending_prealloc_token_usage", "sglang:swa_token_usage", "sglang:cached_tokens_total",
    "sglang:num_so_requests_total", "sglang:prompt_tokens_histogram", "sglang:generation_tokens_histogram",
    "sglang:func_latency_seconds", "sglang:utilization", "sglang:engine_startup_time",
    "sglang:engine_load_weights_time", "sglang:is_cuda_graph", "sglang:num_retracted_reqs", "sglang:num_paused_reqs",
    "sglang:per_stage_req_latency_seconds", "sglang:grammar_compilation_time_seconds",
    "sglang:max_running_requests_under_SLO", "sglang:kv_transfer_speed_gb_s", "sglang:kv_transfer_latency_ms",
    "sglang:num_prefill_prealloc_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_bootstrap_failed_reqs_total", "sglang:num_transfer_failed_reqs_total",
})

READER = ServerReader(
    kind="sglang",
    sources=SOURCES,
    prefixes=("sglang:",),
    service_labels=("model_name",),
    identity_labels=("engine_type", "tp_rank", "pp_rank", "dp_rank", "moe_ep_rank"),
    known_unused=KNOWN_UNUSED,
    colon_alias=True,
)

ROUTER_SOURCES = (
    Source("smg_router_requests_total", "requests", note="sgl-model-gateway: routed requests"),
    Source("sgl_router_requests_total", "requests", note="sglang-router 0.1-0.2: requests by route"),
    Source("smg_router_request_errors_total", "failed_requests", note="sgl-model-gateway"),
    Source("sgl_router_request_errors_total", "failed_requests", note="sglang-router"),
    Source("smg_router_request_duration_seconds", "e2e_seconds", note="sgl-model-gateway, seconds"),
    Source("sgl_router_request_duration_seconds", "e2e_seconds", note="sglang-router, seconds"),
    Source("smg_router_ttft_seconds", "ttft_seconds", note="sgl-model-gateway, gRPC mode"),
    Source("smg_router_tpot_seconds", "tpot_seconds", note="sgl-model-gateway, gRPC mode"),
    Source("smg_router_tokens_total", "prompt_tokens", select=(("token_type", "input"),), note="gRPC mode"),
    Source("smg_router_tokens_total", "generation_tokens", select=(("token_type", "output"),), note="gRPC mode"),
    Source("smg_worker_requests_active", "requests_running", note="sgl-model-gateway, per worker"),
    Source("sgl_router_running_requests", "requests_running", note="sglang-router, per worker"),
)

ROUTER = ServerReader(
    kind="sglang_router",
    sources=ROUTER_SOURCES,
    prefixes=("sgl_router_", "smg_", "sgl_tokenizer_"),
    marks=("sgl_router_", "smg_router_", "smg_worker_"),
    service_labels=("model", "model_id"),
    identity_labels=("worker", "worker_url"),
)
