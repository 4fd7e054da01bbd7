"""Inference services (issue 23): the servers' own metrics, stored as read, give tokens, requests and latency quantiles
that agree with the pages, reset-aware; joined by pod to GPU cost they give cost per million tokens to the cent; an
SLO is met, missed or unknown; whatever cannot be computed is null with the reason."""
from __future__ import annotations

import math
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from gpuledger.analytics.config import Config, Slo
from gpuledger.analytics.store.database import Retention
from gpuledger.analytics.inference import histogram_quantile, service_table, unknown_slo_names
from gpuledger.collector.apps.targets import AppRead, PageRead
from gpuledger.collector.attribution import Attributor
from gpuledger.deploy.api import create_app
from gpuledger.deploy.app_loop import store_read
from tests.helpers import T0, gpu_rows, table

BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0)


def vllm_page(requests: int, prompt: int, generated: int, buckets: list[int], model: str = "llama-8b",
              engine: str = "0") -> str:
    """A vLLM page in the current names: the counters and a TTFT histogram with cumulative `buckets` (one per bound,
    then +Inf = requests)."""
    labels = f'engine="{engine}",model_name="{model}"'
    lines = ["# TYPE vllm:request_success_total counter",
             f'vllm:request_success_total{{{labels},finished_reason="stop"}} {requests}',
             "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{labels}}} {prompt}",
             "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{{{labels}}} {generated}",
             "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{labels}}} 2",
             "# TYPE vllm:time_to_first_token_seconds histogram"]
    lines += [f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{b}"}} {n}' for b, n in zip(BOUNDS, buckets)]
    lines += [f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {requests}',
              f"vllm:time_to_first_token_seconds_count{{{labels}}} {requests}",
              f"vllm:time_to_first_token_seconds_sum{{{labels}}} {requests * 0.2}"]
    return "\n".join(lines) + "\n"


# five reads a minute apart; the server restarts before the fourth (its counters start again from 0)
READS = [
    (100, 60_000, 20_000, [10, 40, 80, 95, 99]),
    (400, 240_000, 80_000, [40, 160, 320, 380, 396]),
    (1000, 600_000, 200_000, [100, 400, 800, 950, 990]),
    (300, 180_000, 60_000, [30, 120, 240, 285, 297]),  # restarted: every counter fell
    (700, 420_000, 140_000, [70, 280, 560, 665, 693]),
]


def _store_reads(store, reads=READS, namespace="nlp", pod="vllm-0", start=T0) -> None:
    for i, (requests, prompt, generated, buckets) in enumerate(reads):
        read = AppRead(at=start + timedelta(minutes=i),
                       pages=[PageRead(vllm_page(requests, prompt, generated, buckets), f"http://{pod}:8000/metrics",
                                       namespace, pod)])
        store_read(store, read, Attributor())


def _increase(values: list[float]) -> float:
    """What the pages say was added: differences, and the new value where it fell (a restart)."""
    return sum(b - a if b >= a else b for a, b in zip(values, values[1:]))


def test_counters_and_quantiles_agree_with_the_pages_across_a_reset(store):
    _store_reads(store)
    row = service_table(store, T0, T0 + timedelta(hours=1)).iloc[0]
    assert (row["kind"], row["service"], row["team"]) == ("vllm", "llama-8b", "nlp")
    assert row["requests"] == _increase([r[0] for r in READS]) == 300 + 600 + 300 + 400
    assert row["prompt_tokens"] == _increase([r[1] for r in READS])
    assert row["generation_tokens"] == _increase([r[2] for r in READS])
    assert row["requests_per_s"] == pytest.approx(1600 / 240)
    # the buckets' increases, summed, then interpolated as histogram_quantile does
    added = [_increase([r[3][k] for r in READS]) for k in range(len(BOUNDS))]
    pairs = list(zip(BOUNDS, added)) + [(math.inf, 1600.0)]
    for q, column in ((0.5, "ttft_p50_s"), (0.95, "ttft_p95_s"), (0.99, "ttft_p99_s")):
        assert row[column] == pytest.approx(histogram_quantile(q, pairs))
    assert 0.1 < row["ttft_p50_s"] <= 0.25  # half the requests are under 0.25 s, less than half under 0.1 s
    assert row["ttft_seconds_mean"] == pytest.approx(0.2)
    assert row["requests_waiting"] == 2.0
    # a figure vLLM does not give here is unknown, not zero
    assert math.isnan(row["tpot_p95_s"]) and math.isnan(row["e2e_p95_s"])


def _figures(frame) -> dict:
    """What a service table says of its services, for comparing two stores."""
    columns = ["requests", "prompt_tokens", "generation_tokens", "ttft_p50_s", "ttft_p95_s", "ttft_seconds_mean",
               "seconds", "requests_waiting"]
    return {tuple(r[k] for k in ("kind", "service", "team")): [round(float(r[c]), 9) for c in columns]
            for _, r in frame.iterrows()}


def test_late_pages_rereads_and_an_older_store_count_the_same_increases(open_store):
    """Increases are kept with each row at ingest: a page that arrives after a newer one of its target, a page read
    again (replacing the first), and a store from before they were kept (recounted when opened) give what the pages
    in order give; a window starting between reads counts only the steps inside it."""
    in_order = open_store("in_order")
    _store_reads(in_order)
    expected = service_table(in_order, T0, T0 + timedelta(hours=1))
    late = open_store("late")
    order = [4, 0, 2, 1, 3]  # the fifth read first, the restart's read last
    for i in order:
        _store_reads(late, reads=[READS[i]], start=T0 + timedelta(minutes=i))
    _store_reads(late, reads=[(1, 1, 1, [1] * 5)], start=T0 + timedelta(minutes=2))  # a wrong read of minute 2 ...
    _store_reads(late, reads=[READS[2]], start=T0 + timedelta(minutes=2))  # ... replaced by the right one
    assert _figures(service_table(late, T0, T0 + timedelta(hours=1))) == _figures(expected)
    # every read in one write (a backfill), each page at its own instant
    batched = open_store("batched")
    store_read(batched, AppRead(at=T0, pages=[
        PageRead(vllm_page(*READS[i]), "http://vllm-0:8000/metrics", "nlp", "vllm-0", at=T0 + timedelta(minutes=i))
        for i in range(len(READS))]), Attributor())
    assert _figures(service_table(batched, T0, T0 + timedelta(hours=1))) == _figures(expected)
    # from minute 1 on: the step into minute 1 is outside, the rest in
    inside = service_table(in_order, T0 + timedelta(minutes=1), T0 + timedelta(hours=1)).iloc[0]
    assert inside["requests"] == _increase([r[0] for r in READS[1:]]) == 600 + 300 + 400
    # a store as schema 12 left it: no increases, no newest reads; opened again, it counts them
    with in_order.transaction() as cur:
        cur.execute("UPDATE app_samples SET series_id = NULL, prev_ts = NULL, increase = NULL")
        cur.execute("DELETE FROM app_series")
        cur.execute("DELETE FROM app_hour")
        cur.execute("DELETE FROM meta WHERE key = 'app_series_counted'")
    assert service_table(in_order, T0, T0 + timedelta(hours=1)).empty
    in_order.close()
    reopened = open_store("in_order")
    assert _figures(service_table(reopened, T0, T0 + timedelta(hours=1))) == _figures(expected)
    # and the next read counts from the newest stored one
    _store_reads(reopened, reads=[(900, 1, 1, [1] * 5)], start=T0 + timedelta(minutes=5))
    assert service_table(reopened, T0, T0 + timedelta(hours=1)).iloc[0]["requests"] == 1600 + 200


def test_any_window_over_hours_of_reads_counts_what_the_pages_in_it_say(store):
    """Whole hours are read from the hourly fold, partial ones from the rows: for windows on and off the hour, the
    requests and the seconds read are those of the pages read inside the window (a step counts when both its
    reads are in it), across a restart."""
    at = [T0 + timedelta(minutes=17 * k) for k in range(22)]  # six hours, off the hour
    values = [100 * k if k < 9 else 40 * (k - 9) for k in range(22)]  # the server restarts before read 9
    for ts, v in zip(at, values):
        _store_reads(store, reads=[(v, v, v, [v] * 5)], start=ts)
    starts = [T0, T0 + timedelta(minutes=30), T0 + timedelta(hours=1), T0 + timedelta(hours=2, minutes=5)]
    ends = [T0 + timedelta(hours=3), T0 + timedelta(hours=4, minutes=20), T0 + timedelta(hours=7)]
    for start in starts:
        for end in ends:
            inside = [(ts, v) for ts, v in zip(at, values) if start <= ts < end]
            row = service_table(store, start, end).iloc[0]
            assert row["requests"] == _increase([v for _, v in inside]), (start, end)
            assert row["seconds"] == (inside[-1][0] - inside[0][0]).total_seconds()
    one = service_table(store, at[3], at[4])  # one read: no step, so no count, never 0
    assert math.isnan(one.iloc[0]["requests"])
    # retention drops whole hours of rows, folds and series together: what is kept still adds up
    kept_from = T0 + timedelta(hours=3)
    dropped = store.retain(now=kept_from + timedelta(days=30), retention=Retention(raw_days=30, minute_days=30))
    assert dropped["app_samples"] > 0 and dropped["app_hour"] > 0
    assert store.scalar("SELECT min(ts) FROM app_samples") == min(ts for ts in at if ts >= kept_from)
    assert store.scalar("SELECT min(hour) FROM app_hour") == kept_from
    # the step into the first read kept counts: both its reads were in the window, though one row is gone
    first_kept = min(k for k, ts in enumerate(at) if ts >= kept_from)
    inside = values[first_kept - 1:]
    assert service_table(store, T0, T0 + timedelta(hours=7)).iloc[0]["requests"] == _increase(inside)


def test_histogram_quantile_edges():
    assert histogram_quantile(0.5, [(1.0, 50), (2.0, 100), (math.inf, 100)]) == pytest.approx(1.0)
    assert histogram_quantile(0.75, [(1.0, 50), (2.0, 100), (math.inf, 100)]) == pytest.approx(1.5)
    assert histogram_quantile(0.99, [(1.0, 50), (math.inf, 100)]) == 1.0  # in +Inf: the highest finite bound
    assert histogram_quantile(0.5, [(1.0, 0), (math.inf, 0)]) is None  # nothing observed
    # cut before +Inf: the count totals it; a rank past the last bucket has no answer, never a guess
    assert histogram_quantile(0.25, [(1.0, 50), (2.0, 80)], total=100) == pytest.approx(0.5)
    assert histogram_quantile(0.95, [(1.0, 50), (2.0, 80)], total=100) is None
    assert histogram_quantile(0.5, [(1.0, 50), (2.0, 80)]) is None  # no +Inf and no count


def test_cost_per_million_tokens_adds_up_and_is_unknown_without_gpu_samples(store):
    # the serving pod held one H100 for the hour (default rate), a second service has no GPU samples at all
    store.append_samples(table(gpu_rows("n1", 0, "H100", 60, util=60.0, job="nlp/vllm-0", team="nlp")))
    _store_reads(store)
    _store_reads(store, namespace="cv", pod="orphan")
    rate = store.rate_card().set_index("gpu_model").loc["H100", "usd_per_gpu_hour"]
    rows = service_table(store, T0, T0 + timedelta(hours=1)).set_index("team")
    nlp = rows.loc["nlp"]
    assert nlp["cost_usd"] == pytest.approx(rate)
    tokens = _increase([r[1] for r in READS]) + _increase([r[2] for r in READS])
    assert nlp["cost_per_million_tokens"] == pytest.approx(rate / (tokens / 1e6))
    assert nlp["cost_per_thousand_requests"] == pytest.approx(rate / 1.6)
    assert round(nlp["cost_per_million_tokens"] * tokens / 1e6, 2) == round(rate, 2)  # to the cent
    orphan = rows.loc["cv"]
    assert math.isnan(orphan["cost_usd"]) and math.isnan(orphan["cost_per_million_tokens"])  # unknown, not $0
    assert "no GPU samples" in orphan["cost_note"]


def test_slos_are_met_missed_or_unknown_and_unknown_names_are_said(store):
    _store_reads(store)
    window = (T0, T0 + timedelta(hours=1))
    p95 = service_table(store, *window).iloc[0]["ttft_p95_s"]
    assert service_table(store, *window, {"llama-8b": Slo(ttft_p95_s=p95 + 0.01)}).iloc[0]["slo_status"] == "met"
    missed = service_table(store, *window, {"nlp": Slo(ttft_p95_s=p95 - 0.01)}).iloc[0]  # by team
    assert missed["slo_status"] == "missed" and missed["slo_missed"] == ["ttft_p95_s"]
    # a bound on a figure the server does not report: unknown, never met
    unknown = service_table(store, *window, {"llama-8b": Slo(ttft_p95_s=10.0, e2e_p95_s=5.0)}).iloc[0]
    assert unknown["slo_status"] == "unknown"
    assert unknown_slo_names(store, {"llama-8b": Slo(ttft_p95_s=1.0), "no-such-model": Slo(ttft_p95_s=1.0)}) \
        == ["no-such-model"]


def test_the_api_serves_services_and_team_cost(store):
    store.append_samples(table(gpu_rows("n1", 0, "H100", 60, util=60.0, job="nlp/vllm-0", team="nlp")))
    _store_reads(store)
    config = Config(slo={"llama-8b": Slo(ttft_p95_s=0.3), "ghost": Slo(e2e_p95_s=1.0)})
    body = TestClient(create_app(store, config, open_reads=True)).get(
        "/v1/inference", params={"days": 1, "end": (T0 + timedelta(hours=1)).isoformat()}).json()
    service = body["services"][0]
    assert service["slo_status"] in ("met", "missed") and service["cost_per_million_tokens"] > 0
    assert service["tpot_p95_s"] is None  # not reported: null in JSON
    assert body["teams"][0]["team"] == "nlp" and body["unknown_slos"] == ["ghost"]


def test_hostile_names_from_a_page_are_dropped_and_counted(store):
    page = vllm_page(10, 10, 10, [1, 2, 3, 4, 5], model="x" * 300)
    stored, skipped, _ = store_read(store, AppRead(at=T0, pages=[PageRead(page, "t", "nlp", "p")]), Attributor())
    assert stored == 0 and skipped["bad_service_name"] > 0
    stored, skipped, _ = store_read(store, AppRead(at=T0, pages=[PageRead(vllm_page(1, 1, 1, [1] * 5), "t",
                                                                          "bad ns!", "p")]), Attributor())
    assert stored == 0 and skipped["bad_pod_name"] > 0


def _serving_reads(store, pod: str, fast: bool, reads: int = 12, namespace: str = "nlp",
                   model: str = "meta-llama/Llama-3.1-8B-Instruct") -> None:
    """A vLLM server of `model` read every 10 minutes: fast (every TTFT under 50 ms) or slow (most over 1 s), its
    KV cache at most 20% full."""
    for i in range(reads):
        n = 200 * (i + 1)
        buckets = [n, n, n, n, n] if fast else [0, 0, 0, int(n * 0.1), int(n * 0.2)]
        page = vllm_page(n, 600 * n, 180 * n, buckets, model=model)
        page += ('# TYPE vllm:kv_cache_usage_perc gauge\n'
                 f'vllm:kv_cache_usage_perc{{engine="0",model_name="{model}"}} {0.1 + 0.1 * (i % 2)}\n')
        store_read(store, AppRead(at=T0 + timedelta(minutes=10 * i),
                                  pages=[PageRead(page, f"http://{pod}:8000/metrics", namespace, pod)]), Attributor())


def test_a_service_far_inside_its_slo_on_a_big_gpu_is_right_sized_with_its_projected_cost(store):
    """Right-size advice from what the service achieves: its memory use (vLLM preallocates 86% of the card) is not
    what it needs; its weights plus the KV cache it filled are, and its SMs are a quarter busy."""
    from gpuledger.policies.recommender import evaluate
    store.append_samples(table(gpu_rows("n1", 0, "H100", 120, util=60.0, job="nlp/vllm-0", team="nlp",
                                        mem_used=70000.0, sm_active=0.15, tensor_active=0.05, dram_active=0.3)))
    _serving_reads(store, "vllm-0", fast=True)
    config = Config(slo={"meta-llama/Llama-3.1-8B-Instruct": Slo(ttft_p95_s=1.0)})
    advice = [r for r in evaluate(store, config, T0 + timedelta(minutes=119, seconds=30)).proposals()
              if r.kind == "resize" and r.job_id == "nlp/vllm-0"]
    assert len(advice) == 1
    rec = advice[0]
    weights = 8e9 * 2 / 2 ** 20
    assert rec.evidence["weights_mib"] == pytest.approx(weights)
    assert rec.evidence["needed_mib"] == pytest.approx((weights + 0.2 * (70000.0 - weights)) * 1.2)
    assert rec.evidence["compute_signal"] == "sm_active" and rec.evidence["compute_pct"] == pytest.approx(15.0)
    assert rec.action["move_to"] == "H100 MIG 3g.40gb"  # 30.7 GB with headroom: the smallest slice that holds it
    assert rec.evidence["projected_cost_per_million_tokens"] == pytest.approx(
        rec.evidence["cost_per_million_tokens"] * 3 / 7)
    assert "far inside its SLO" in rec.reason
    # the same service near its bound gets no advice: right-sizing must not push it over
    tight = Config(slo={"meta-llama/Llama-3.1-8B-Instruct": Slo(ttft_p95_s=0.06)})
    assert not [r for r in evaluate(store, tight, T0 + timedelta(minutes=119, seconds=30)).proposals()
                if r.kind == "resize" and r.job_id == "nlp/vllm-0"]


def test_inference_pods_are_sized_by_their_service_and_never_by_the_memory_rule(store):
    """Three pods on little of their H100's memory: the one whose service is far inside its SLO gets the service's
    right-size advice (weights and KV cache), not the memory rule's; the one whose service misses it, and the one
    whose service meets it close to its bound, get none (a smaller shape could push them over)."""
    from gpuledger.policies.recommender import evaluate
    store.append_samples(table(
        gpu_rows("n1", 0, "H100", 120, util=20.0, job="nlp/vllm-0", team="nlp", mem_used=15000.0, sm_active=0.1),
        gpu_rows("n1", 1, "H100", 120, util=20.0, job="speech/vllm-1", team="speech", mem_used=15000.0,
                 sm_active=0.1),
        gpu_rows("n1", 2, "H100", 120, util=20.0, job="cv/vllm-2", team="cv", mem_used=15000.0, sm_active=0.1)))
    _serving_reads(store, "vllm-0", fast=True)
    _serving_reads(store, "vllm-1", fast=False, namespace="speech")
    _serving_reads(store, "vllm-2", fast=True, namespace="cv", model="org/Other-7B")
    config = Config(slo={"meta-llama/Llama-3.1-8B-Instruct": Slo(ttft_p95_s=0.5),
                         "org/Other-7B": Slo(ttft_p95_s=0.06)})  # met (p95 ~48 ms), but not far inside
    resize = [r for r in evaluate(store, config, T0 + timedelta(minutes=119, seconds=30)).proposals()
              if r.kind == "resize"]
    assert [r.job_id for r in resize] == ["nlp/vllm-0"]
    assert "weights_mib" in resize[0].evidence and "far inside its SLO" in resize[0].reason


def test_a_service_missing_its_slo_on_a_shared_gpu_is_separated_on_measured_latency(store):
    """Its namespace is not named latency-sensitive in the config: the measured latency makes it so."""
    from gpuledger.policies.recommender import evaluate
    store.append_samples(table(
        gpu_rows("n1", 0, "H100", 120, util=80.0, job="nlp/vllm-0", team="nlp", gpu_fraction=0.5),
        gpu_rows("n1", 0, "H100", 120, util=80.0, job="cv/train", team="cv", gpu_fraction=0.5),
        gpu_rows("n1", 1, "H100", 120, util=0.0)))
    _serving_reads(store, "vllm-0", fast=False)
    at = T0 + timedelta(minutes=119, seconds=30)
    config = Config(slo={"meta-llama/Llama-3.1-8B-Instruct": Slo(ttft_p95_s=0.5)})
    separate = [r for r in evaluate(store, config, at).proposals() if r.kind == "separate"]
    assert [r.job_id for r in separate] == ["nlp/vllm-0"]
    measured = separate[0].evidence["measured_latency"]
    assert measured["slo_missed"] == ["ttft_p95_s"] and measured["measured"]["ttft_p95_s"] > 0.5
    assert "missed its SLO" in separate[0].reason and "cv/train" in separate[0].reason
    # without an SLO nothing says it is latency-sensitive: no advice
    assert not [r for r in evaluate(store, Config(), at).proposals() if r.kind == "separate"]


def test_a_pod_is_billed_to_its_jobs_team_and_rates_are_over_the_time_it_was_read(store):
    """The page's namespace is not always the team: the job record's team wins (a pod label, a mapping). Two pods
    of one service read an hour apart: the rate is over the 8 minutes they were read, not the 68 between."""
    import pandas as pd
    store.upsert_jobs(pd.DataFrame([{"job_id": "serving/vllm-a", "team": "nlp", "gpus": 1, "state": "running"}]))
    _store_reads(store, namespace="serving", pod="vllm-a")
    _store_reads(store, namespace="serving", pod="vllm-b", start=T0 + timedelta(hours=1))
    rows = service_table(store, T0, T0 + timedelta(hours=2)).set_index("team")
    assert rows.loc["nlp", "pods"] == 1 and rows.loc["serving", "pods"] == 1  # b has no record: its namespace
    store.upsert_jobs(pd.DataFrame([{"job_id": "serving/vllm-b", "team": "nlp", "gpus": 1, "state": "running"}]))
    row = service_table(store, T0, T0 + timedelta(hours=2)).iloc[0]
    assert row["team"] == "nlp" and row["pods"] == 2 and row["seconds"] == 480
    assert row["requests_per_s"] == pytest.approx(2 * 1600 / 480)
    # its pods on two models: the cost is each pod's at its card's rate, and both models are named
    store.append_samples(table(gpu_rows("n1", 0, "H100", 10, job="serving/vllm-a", team="nlp"),
                               gpu_rows("n2", 0, "H200", 10, start=T0 + timedelta(hours=1), job="serving/vllm-b",
                                        team="nlp")))
    row = service_table(store, T0, T0 + timedelta(hours=2)).iloc[0]
    assert row["gpu_model"] == "H100, H200"
    rates = dict(zip(store.rate_card()["gpu_model"], store.rate_card()["usd_per_gpu_hour"]))
    assert row["cost_usd"] == pytest.approx(10 / 60 * (rates["H100"] + rates["H200"]))


def test_scrape_says_what_a_server_would_store_and_a_flooding_page_is_capped(store):
    from gpuledger.collector.apps.rows import MAX_SERVICES_PER_PAGE
    from gpuledger.collector.page_check import check_page
    long_name = vllm_page(10, 10, 10, [1, 2, 3, 4, 5], model="x" * 300)
    answer = check_page(long_name)
    assert answer["rows"] == [] and answer["skipped"]["bad_service_name"] > 0  # as serve would drop it
    flood = "# TYPE vllm:num_requests_running gauge\n" + "".join(
        f'vllm:num_requests_running{{model_name="m{i}"}} 1\n' for i in range(MAX_SERVICES_PER_PAGE + 100))
    answer = check_page(flood)
    assert len(answer["rows"]) == MAX_SERVICES_PER_PAGE and answer["skipped"]["too_many_services_on_page"] == 100
    stored, skipped, _ = store_read(store, AppRead(at=T0, pages=[PageRead(flood, "t", "nlp", "p")]), Attributor())
    assert stored == MAX_SERVICES_PER_PAGE and skipped["too_many_services_on_page"] == 100


def test_one_target_down_does_not_stop_the_others_and_all_down_is_an_error():
    from gpuledger.analytics.config import AppTarget
    from gpuledger.collector.apps.targets import TargetsSource
    from gpuledger.collector.source import SourceError
    from tests.helpers import PageServer
    from tests.procs import free_port
    up = PageServer()
    up.body = vllm_page(1, 1, 1, [1] * 5)
    down = f"http://127.0.0.1:{free_port()}/metrics"
    try:
        read = TargetsSource([AppTarget(up.url, "nlp", "vllm-0"), AppTarget(down)], timeout_s=2).read()
        assert [p.target for p in read.pages] == [up.url] and read.pages[0].pod == "vllm-0"
        assert len(read.errors) == 1 and down in read.errors[0]
        with pytest.raises(SourceError, match="no inference server answered"):
            TargetsSource([AppTarget(down)], timeout_s=2).read()
    finally:
        up.close()
