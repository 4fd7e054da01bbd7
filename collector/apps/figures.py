"""The closed set of canonical figures an inference server's or training job's /metrics page is read into.

Every exporter names and scales the same thing its own way (vLLM `vllm:prompt_tokens_total`, SGLang
`sglang:prompt_tokens_total`, TGI the `_sum` of its `tgi_request_input_length` histogram; Triton's latencies in
cumulative microseconds, vLLM's in seconds). The readers (one module per server) turn all of them into these
figures, in these units, so everything downstream (storage, rates, chargeback) knows one vocabulary. Declared
once here: a reader mapping to a name that is not in FIGURES fails at import, never at a customer's scrape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FigureType = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class Figure:
    """What a figure is: its Prometheus type (which decides its parts), its canonical unit and a one-line help."""

    type: FigureType
    unit: str
    help: str


FIGURES: dict[str, Figure] = {
    # cumulative counters: per series as the exporter gives them; resets are handled downstream by differencing
    "requests": Figure("counter", "requests", "requests that finished (any finish reason: stop, length, ...)"),
    "failed_requests": Figure("counter", "requests", "requests that failed or were aborted by the server"),
    "prompt_tokens": Figure("counter", "tokens", "prompt (prefill) tokens processed"),
    "generation_tokens": Figure("counter", "tokens", "tokens generated (decode)"),
    "inferences": Figure("counter", "inferences",
                         "Triton's inference count: a batch of n counts n (does not include cached requests)"),
    "train_samples": Figure("counter", "samples", "training samples processed (gpuledger_train_samples_total)"),
    "train_steps": Figure("counter", "steps", "training steps (optimizer updates) done (gpuledger_train_steps_total)"),
    # histograms: buckets with their upper bound `le` in the unit, a sum in the unit, a count of observations
    "ttft_seconds": Figure("histogram", "seconds", "time to first token"),
    "tpot_seconds": Figure("histogram", "seconds", "time per output token (inter-token latency)"),
    "e2e_seconds": Figure("histogram", "seconds", "end-to-end request latency"),
    "queue_seconds": Figure("histogram", "seconds", "time a request waited in the server's queue"),
    # gauges: the value at the scrape
    "requests_running": Figure("gauge", "requests", "requests being processed now"),
    "requests_waiting": Figure("gauge", "requests", "requests waiting in the queue now"),
    "kv_cache_usage": Figure("gauge", "fraction", "KV-cache in use, 0..1"),
    "gpu_memory_used_bytes": Figure("gauge", "bytes", "GPU memory a container uses on a shared GPU (HAMi)"),
    "gpu_core_use": Figure("gauge", "fraction", "GPU cores (SM) a container uses on a shared GPU, 0..1 (HAMi)"),
}

# the kinds of page a reader recognises; check_page adds the exporters gpuledger reads elsewhere (dcgm-exporter, ...)
SERVER_KINDS: tuple[str, ...] = ("vllm", "triton", "tgi", "sglang", "sglang_router", "hami", "training")

# a counter or gauge gives one "value" row per series; a histogram "bucket" rows (with le), a "sum" and a "count"
PARTS: tuple[str, ...] = ("value", "bucket", "sum", "count")

# figures whose value is a fraction 0..1 (a value above 1 is clamped and counted, never stored as is)
FRACTIONS = frozenset(name for name, figure in FIGURES.items() if figure.unit == "fraction")

__all__ = ["FIGURES", "FRACTIONS", "PARTS", "SERVER_KINDS", "Figure", "FigureType"]
