"""Hugging Face text-generation-inference's `/metrics` (`tgi_*`), written by its Rust router.

Facts from TGI's router source (router/src/server.rs, validation.rs, infer/, the `metrics` crate calls) and its
docs (docs/source/reference/metrics.md):
- No label names the model (one TGI serves one model): the service is "" unless a scrape config adds one;
  `tgi_request_failure` carries `err` (validation, generation, overloaded, ...): summed over.
- Latency histograms are in SECONDS (`as_secs_f64()`): `tgi_request_duration` (end to end),
  `tgi_request_queue_duration`, `tgi_request_mean_time_per_token_duration` (each finished request's mean time
  per output token: TGI has no per-token histogram, so this is its tpot).
- Tokens are histograms per request, no counters: the prompt tokens counter is the `_sum` of
  `tgi_request_input_length` (observed at validation, so it includes requests that later fail) and the
  generated tokens counter the `_sum` of `tgi_request_generated_tokens` (observed on success).
- `metrics-exporter-prometheus` writes a histogram it has no buckets for as a SUMMARY (quantiles + _sum/_count):
  either form is read; quantiles are not stored.
- Gauges: `tgi_queue_size` (waiting), `tgi_batch_current_size` (requests in the running batch).
"""
from __future__ import annotations

from gpuledger.collector.apps.spec import ServerReader, Source

SOURCES = (
    Source("tgi_request_success", "requests", note="all versions (0.9+)"),
    Source("tgi_request_failure", "failed_requests", note="all versions; summed over `err`"),
    Source("tgi_request_input_length", "prompt_tokens", take="sum", note="histogram of input tokens per request"),
    Source("tgi_request_generated_tokens", "generation_tokens", take="sum", note="histogram per finished request"),
    Source("tgi_request_duration", "e2e_seconds", note="seconds"),
    Source("tgi_request_queue_duration", "queue_seconds", note="seconds"),
    Source("tgi_request_mean_time_per_token_duration", "tpot_seconds", note="seconds, a per-request mean"),
    Source("tgi_queue_size", "requests_waiting"),
    Source("tgi_batch_current_size", "requests_running"),
)

KNOWN_UNUSED = frozenset({
    "tgi_request_count", "tgi_request_validation_duration", "tgi_request_inference_duration",
    "tgi_request_max_new_tokens", "tgi_request_skipped_tokens", "tgi_batch_concat", "tgi_batch_concat_duration",
    "tgi_batch_inference_count", "tgi_batch_inference_success", "tgi_batch_inference_failure",
    "tgi_batch_inference_duration", "tgi_batch_forward_duration", "tgi_batch_decode_duration",
    "tgi_batch_filter_duration", "tgi_batch_next_size", "tgi_batch_current_max_tokens", "tgi_batch_max_total_tokens",
})

READER = ServerReader(
    kind="tgi",
    sources=SOURCES,
    prefixes=("tgi_",),
    service_labels=("model_id", "model_name", "model"),
    known_unused=KNOWN_UNUSED,
)
