"""Inference servers' /metrics pages read into canonical figures (collector/apps) and any page checked for what
gpuledger would store from it (collector/page_check.py, `gpuledger scrape`).

Every real capture in ../shared/app-pages/<folder> is read by the test of its folder, which globs the folder (a
page dropped in needs no code) and holds it to what must be true of every page: its kind recognised, rows in the
canonical unit and range, cumulative buckets, no `_created` timestamp ever a row, no Triton ensemble counting its
composing models' requests again, one series per vLLM engine. The synthetic pages below are written from each
project's own docs and source (old and new names together, histograms cut before +Inf, summaries, pasted noise,
bad values, run-time aliases), since real captures show only some of what a page can hold.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from functools import partial
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from gpuledger.collector.apps import FIGURES, PARTS, READERS, SERVER_KINDS, AppRow, read_families, read_page
from gpuledger.collector.apps.triton import is_ensemble
from gpuledger.collector.errors import InputError
from gpuledger.collector.page_check import KINDS, NOTHING, check_page, fetch_page, summary
from gpuledger.collector.prom_text import parse

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
APP_PAGES = SHARED / "app-pages"
FOLDERS = ("vllm", "triton", "tgi-sglang", "hami", "dcgm-prof", "kube-state-metrics", "slurm-sacct")
GPULEDGER = str(Path(sys.executable).with_name("gpuledger"))


def pages(folder: str) -> list[Path]:
    return sorted((APP_PAGES / folder).glob("*.txt"))


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([GPULEDGER, *args], capture_output=True, text=True, timeout=120, input=stdin)


# -- what holds for every page ------------------------------------------------------------------------------------
def assert_sound(rows: list[AppRow], text: str = "") -> None:
    """The invariants every reader's rows keep, whatever the page."""
    keys = Counter((r.kind, r.figure, r.part, r.le, r.service, r.instance, r.namespace, r.pod) for r in rows)
    assert not [k for k, n in keys.items() if n > 1], "one row per figure, part, bound and series"
    histograms: dict[tuple, dict[str, object]] = defaultdict(dict)
    for r in rows:
        figure = FIGURES[r.figure]
        assert r.kind in SERVER_KINDS and r.part in PARTS
        assert (r.part == "value") == (figure.type != "histogram"), r
        assert (r.le is not None) == (r.part == "bucket"), r
        assert math.isfinite(r.value) and r.value >= 0, r
        if figure.unit == "fraction":
            assert 0 <= r.value <= 1, r
        if r.part == "bucket":
            assert r.le == math.inf or (figure.unit != "seconds" or 0 <= r.le < 1e5), r
            histograms[(r.kind, r.figure, r.service, r.instance, r.namespace, r.pod)].setdefault("buckets", []) \
                .append((r.le, r.value))
        elif r.part in ("sum", "count"):
            histograms[(r.kind, r.figure, r.service, r.instance, r.namespace, r.pod)][r.part] = r.value
    for key, parts in histograms.items():
        buckets = sorted(parts.get("buckets", []))  # type: ignore[arg-type]
        counts = [count for _, count in buckets]
        assert counts == sorted(counts), f"{key}: buckets not cumulative in le"
        if buckets and buckets[-1][0] == math.inf and "count" in parts:
            assert parts["count"] == buckets[-1][1], f"{key}: +Inf bucket != count"
        if FIGURES[key[1]].unit == "seconds" and parts.get("count"):
            assert 0 <= parts.get("sum", 0) / parts["count"] < 1e5, f"{key}: mean latency out of range"  # type: ignore
    if text:  # prometheus_client's `_created` gauges hold a unix time: none is ever a figure
        created = {value for name, _, value, _ in parse(text).samples if name.endswith("_created")}
        assert not [r for r in rows if r.value in created and r.value > 1e9]


def read(path: Path, **kwargs) -> tuple[str, object]:
    text = path.read_text()
    return text, read_page(text, **kwargs)


# -- the real captures, a test per folder -------------------------------------------------------------------------
def test_the_shared_pages_are_there():
    for folder in FOLDERS:
        assert pages(folder), f"no pages in {APP_PAGES / folder}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_shared_page_of_a_folder(folder):
    check = globals()["check_" + folder.replace("-", "_")]
    for path in pages(folder):
        check(path)


def check_vllm(path: Path) -> None:
    text, page = read(path)
    assert page.kinds[0] == "vllm", path.name
    assert page.rows, path.name
    assert_sound(page.rows, text)
    engines = {labels["engine"] for fam in read_families(text).families.values() if fam.name.startswith("vllm:")
               for labels in (s.labels for s in fam.series.values()) if "engine" in labels}
    vllm_rows = [r for r in page.rows if r.kind == "vllm"]
    if engines:  # V1: one series per engine, the engine in the identity
        assert all("engine=" in r.instance for r in vllm_rows), path.name
        assert {r.instance.split("engine=")[1].split(",")[0] for r in vllm_rows} <= engines
    assert {r.service for r in vllm_rows} - {""}, "the served model names the service"
    for r in vllm_rows:
        if r.figure in ("prompt_tokens", "generation_tokens", "requests"):
            assert r.value >= 0 and r.value == int(r.value)


def check_triton(path: Path) -> None:
    text, page = read(path)
    assert page.kinds == ["triton"], path.name
    assert page.rows
    assert_sound(page.rows, text)
    models = {s.labels.get("model") for fam in read_families(text).families.values()
              for s in fam.series.values()} - {None}
    ensembles = {m for m in models if is_ensemble(m)}
    assert not [r for r in page.rows if is_ensemble(r.service)], "an ensemble's rows repeat its steps' requests"
    if ensembles:
        assert page.skipped["triton_ensemble"] > 0
        requests = {r.service: r.value for r in page.rows if r.figure == "requests"}
        raw = {s.labels["model"]: s.value for s in read_families(text).families["nv_inference_request_success"]
               .series.values()}
        assert sum(requests.values()) == sum(v for m, v in raw.items() if m not in ensembles)
    durations = read_families(text).families.get("nv_inference_request_duration_us")
    if durations:  # cumulative microseconds -> the sum part of e2e_seconds, in seconds
        sums = {r.service: r.value for r in page.rows if r.figure == "e2e_seconds" and r.part == "sum"}
        for series in durations.series.values():
            if not is_ensemble(series.labels["model"]):
                assert sums[series.labels["model"]] == pytest.approx(series.value * 1e-6)


def check_tgi_sglang(path: Path) -> None:
    text, page = read(path)
    assert set(page.kinds) & {"tgi", "sglang"}, path.name
    assert page.rows
    assert_sound(page.rows, text)


def check_hami(path: Path) -> None:
    text, page = read(path)
    assert page.kinds == ["hami"], path.name
    assert_sound(page.rows, text)
    per_container = {fam.name for fam in read_families(text).families.values() if fam.series} & {
        "hami_vgpu_memory_used_bytes", "hami_container_device_memory_bytes", "vGPU_device_memory_usage_in_bytes",
        "Device_memory_desc_of_container", "hami_container_device_utilization_ratio",
        "Device_utilization_desc_of_container"}
    if per_container:
        assert page.rows and all(r.pod and r.namespace and "container=" in r.instance for r in page.rows)
    else:  # only per-host GPU figures (an exclusive GPU): none is a container's, all counted as read past
        assert not page.rows and page.skipped["unread_family"] > 0


def check_dcgm_prof(path: Path) -> None:
    answer = check_page(path.read_text())
    assert answer["kind"] == ["dcgm-exporter"], path.name
    assert answer["rows"] and all(r["kind"] == "dcgm-exporter" for r in answer["rows"])
    json.dumps(answer, allow_nan=False)


def check_kube_state_metrics(path: Path) -> None:
    text = path.read_text()
    answer = check_page(text)
    assert answer["kind"] == ["kube-state-metrics"], path.name
    json.dumps(answer, allow_nan=False)
    if not answer["rows"]:  # a cluster with no GPU pod stores no job: each pod is counted instead
        assert answer["skipped"]["kube-state-metrics: no_gpus"] > 0
    pods = {s.labels["pod"]: s.labels["namespace"] for s in read_families(text).families["kube_pod_owner"]
            .series.values()}
    pod, namespace = next(iter(pods.items()))
    asked = text + (f'\nkube_pod_container_resource_requests{{namespace="{namespace}",pod="{pod}",container="c",'
                    'resource="nvidia_com_gpu",unit="integer"} 1\n')
    jobs = [r for r in check_page(asked)["rows"] if r["job_id"] == f"{namespace}/{pod}"]
    assert len(jobs) == 1 and jobs[0]["gpus"] == 1


def check_slurm_sacct(path: Path) -> None:
    answer = check_page(path.read_text())
    assert answer["kind"] == [] and answer["rows"] == [], "sacct output is not a metrics page"
    assert sum(answer["skipped"].values()) > 0
    done = run("scrape", str(path))
    assert done.returncode == 1, done.stderr
    assert "kinds: none recognised" in done.stdout


@pytest.mark.parametrize("path", sorted((SHARED / "dcgm-pages").glob("*.txt")), ids=lambda p: p.name)
def test_every_dcgm_page_is_dcgm_exporter(path):
    answer = check_page(path.read_text())
    assert answer["kind"] == ["dcgm-exporter"]
    assert answer["rows"]
    json.dumps(answer, allow_nan=False)


# -- synthetic pages from the projects' docs and source -----------------------------------------------------------
VLLM_BOTH = """\
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.5
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 3.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.5
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 4.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.1",model_name="m"} 3.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.5
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 4.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2.0
vllm:request_success_total{engine="0",finished_reason="error",model_name="m"} 1.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="m"} 5.0
# TYPE vllm:request_success_created gauge
vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7537953269e+09
"""


def test_old_and_new_vllm_names_on_one_page_count_once_per_engine():
    page = read_page(VLLM_BOTH)
    assert page.kinds == ["vllm"]
    assert_sound(page.rows, VLLM_BOTH)
    kv = {r.instance: r.value for r in page.rows if r.figure == "kv_cache_usage"}
    assert kv == {"engine=0": 0.25, "engine=1": 0.5}  # one series per engine, not 0.5 and 1.0
    tpot = [r for r in page.rows if r.figure == "tpot_seconds"]
    assert {(r.part, r.le, r.value) for r in tpot} == {("bucket", 0.1, 3.0), ("bucket", math.inf, 4.0),
                                                      ("sum", None, 0.5), ("count", None, 4.0)}
    assert page.skipped["superseded"] == 2 + 4  # the deprecated gauge of each engine and the old histogram's lines
    requests = {r.instance: r.value for r in page.rows if r.figure == "requests"}
    assert requests == {"engine=0": 10.0, "engine=1": 5.0}  # summed over finished_reason
    assert [r.value for r in page.rows if r.figure == "failed_requests"] == [1.0]
    assert page.skipped["created_timestamp"] == 1


def test_a_histogram_cut_before_inf_keeps_its_buckets_and_says_so():
    text = ('# TYPE vllm:e2e_request_latency_seconds histogram\n'
            'vllm:e2e_request_latency_seconds_bucket{model_name="m",le="0.5"} 1\n'
            'vllm:e2e_request_latency_seconds_bucket{model_name="m",le="1.0"} 3\n')
    page = read_page(text)
    assert [(r.part, r.le, r.value) for r in page.rows] == [("bucket", 0.5, 1.0), ("bucket", 1.0, 3.0)]
    assert page.skipped["histogram_without_inf"] == 1
    assert any(e.startswith("histogram_without_inf: ") for e in page.examples)


def test_labels_in_any_order_and_le_in_any_spelling():
    text = ('# TYPE sglang:time_to_first_token_seconds histogram\n'
            'sglang:time_to_first_token_seconds_bucket{le="1e-1",model_name="m",tp_rank="0"} 1\n'
            'sglang:time_to_first_token_seconds_bucket{model_name="m",le="1",tp_rank="0"} 2\n'
            'sglang:time_to_first_token_seconds_bucket{tp_rank="0",model_name="m",le="1e3"} 3\n'
            'sglang:time_to_first_token_seconds_bucket{tp_rank="0",le="+Inf",model_name="m"} 4\n'
            'sglang:time_to_first_token_seconds_count{tp_rank="0",model_name="m"} 4\n'
            'sglang:time_to_first_token_seconds_sum{model_name="m",tp_rank="0"} 9.5\n')
    page = read_page(text)
    assert_sound(page.rows)
    buckets = [(r.le, r.value) for r in page.rows if r.part == "bucket"]
    assert buckets == [(0.1, 1.0), (1.0, 2.0), (1000.0, 3.0), (math.inf, 4.0)]
    assert {(r.service, r.instance) for r in page.rows} == {("m", "tp_rank=0")}


def test_a_bad_bound_and_a_non_cumulative_histogram_are_counted():
    text = ('# TYPE tgi_request_duration histogram\n'
            'tgi_request_duration_bucket{le="fast"} 1\n'
            'tgi_request_duration_bucket{le="1"} 5\n'
            'tgi_request_duration_bucket{le="2"} 4\n'
            'tgi_request_duration_bucket{le="+Inf"} 5\n'
            'tgi_request_duration_sum 6\ntgi_request_duration_count 5\n')
    page = read_page(text)
    assert page.skipped["bad_le"] == 1 and page.skipped["histogram_not_cumulative"] == 3
    assert {r.part for r in page.rows} == {"sum", "count"}  # the buckets are dropped, the mean is kept


def test_a_summary_keeps_sum_and_count_and_skips_its_quantiles():
    text = ('# TYPE tgi_request_mean_time_per_token_duration summary\n'
            'tgi_request_mean_time_per_token_duration{quantile="0.5"} 0.02\n'
            'tgi_request_mean_time_per_token_duration{quantile="0.99"} 0.09\n'
            'tgi_request_mean_time_per_token_duration_sum 1.5\n'
            'tgi_request_mean_time_per_token_duration_count 60\n'
            '# TYPE tgi_request_input_length summary\n'
            'tgi_request_input_length{quantile="0.5"} 20\n'
            'tgi_request_input_length_sum 1200\ntgi_request_input_length_count 60\n')
    page = read_page(text)
    got = {(r.figure, r.part): r.value for r in page.rows}
    assert got == {("tpot_seconds", "sum"): 1.5, ("tpot_seconds", "count"): 60.0, ("prompt_tokens", "value"): 1200.0}
    assert page.skipped["summary_quantile"] == 2
    assert page.skipped["unread_series"] == 0


def test_a_type_with_no_samples_and_samples_before_their_type():
    text = ('# TYPE vllm:num_requests_waiting gauge\n'
            'vllm:num_requests_running{model_name="m"} 3\n'
            'vllm:e2e_request_latency_seconds_sum{model_name="m"} 2\n'
            'vllm:e2e_request_latency_seconds_count{model_name="m"} 4\n'
            '# TYPE vllm:num_requests_running gauge\n'
            '# TYPE vllm:e2e_request_latency_seconds histogram\n')
    page = read_page(text)
    assert {(r.figure, r.part): r.value for r in page.rows} == {
        ("requests_running", "value"): 3.0, ("e2e_seconds", "sum"): 2.0, ("e2e_seconds", "count"): 4.0}
    assert sum(page.skipped.values()) == 0


def test_a_histogram_with_no_type_line_is_read_by_its_shape():
    text = ('sglang:e2e_request_latency_seconds_sum{model_name="m"} 3\n'
            'sglang:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 1\n'
            'sglang:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 2\n'
            'sglang:e2e_request_latency_seconds_count{model_name="m"} 2\n')
    page = read_page(text)
    assert {(r.part, r.le) for r in page.rows} == {("bucket", 1.0), ("bucket", math.inf), ("sum", None),
                                                   ("count", None)}


def test_tritons_documented_histogram_and_an_openmetrics_page():
    # Triton's docs/user_guide/metrics.md example as published: its TYPE line names another family and its buckets
    # carry no `_bucket` suffix
    triton = ('# HELP nv_first_response_histogram_ms Duration from request to first response in milliseconds\n'
              '# TYPE nv_first_response_histogram_ms histogram\n'
              'nv_inference_first_response_histogram_ms_count{model="my_model",version="1"} 37\n'
              'nv_inference_first_response_histogram_ms_sum{model="my_model",version="1"} 10771\n'
              'nv_inference_first_response_histogram_ms{model="my_model",version="1", le="100"} 8\n'
              'nv_inference_first_response_histogram_ms{model="my_model",version="1", le="500"} 30\n'
              'nv_inference_first_response_histogram_ms{model="my_model",version="1", le="+Inf"} 37\n')
    page = read_page(triton)
    assert_sound(page.rows)
    assert {(r.part, r.le): r.value for r in page.rows} == pytest.approx(
        {("bucket", 0.1): 8, ("bucket", 0.5): 30, ("bucket", math.inf): 37, ("sum", None): 10.771,
         ("count", None): 37})
    openmetrics = ('# TYPE vllm:generation_tokens counter\n# UNIT vllm:generation_tokens tokens\n'
                   'vllm:generation_tokens_total{model_name="m"} 12.0\n'
                   'vllm:generation_tokens_created{model_name="m"} 1.7e+09\n'
                   '# TYPE vllm:time_to_first_token_seconds histogram\n'
                   'vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.5"} 1 # {trace_id="a"} 0.3\n'
                   'vllm:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"} 1\n'
                   'vllm:time_to_first_token_seconds_count{model_name="m"} 1\n'
                   'vllm:time_to_first_token_seconds_sum{model_name="m"} 0.3\n# EOF\n')
    page = read_page(openmetrics)
    assert {(r.figure, r.part, r.le): r.value for r in page.rows} == {
        ("generation_tokens", "value", None): 12.0, ("ttft_seconds", "bucket", 0.5): 1.0,
        ("ttft_seconds", "bucket", math.inf): 1.0, ("ttft_seconds", "count", None): 1.0,
        ("ttft_seconds", "sum", None): 0.3}
    assert page.skipped == Counter({"created_timestamp": 1})


def test_pasted_shell_noise_and_an_indent_around_the_page():
    body = ('# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n'
            '# TYPE vllm:prompt_tokens_total counter\n'
            'vllm:prompt_tokens_total{model_name="m"} 148.0\n')
    text = ("$ kubectl port-forward svc/vllm 8000:8000 &\nHandling connection for 8000\n"
            "curl -s localhost:8000/metrics\n\n" + body + "\nThat's all the output.\n")
    page = read_page(text)
    assert [(r.figure, r.value) for r in page.rows] == [("prompt_tokens", 148.0)]
    assert sum(n for reason, n in page.skipped.items() if reason.startswith("page_")) == 4
    indented = read_page("".join("    " + line + "\n" for line in body.splitlines()))  # a reST code block
    assert [(r.figure, r.value) for r in indented.rows] == [("prompt_tokens", 148.0)]
    crlf = read_page(body.replace("\n", "\r\n"))
    assert [(r.figure, r.value) for r in crlf.rows] == [("prompt_tokens", 148.0)]


def test_nan_negative_and_infinite_values_never_become_rows():
    text = ('# TYPE vllm:prompt_tokens_total counter\n'
            'vllm:prompt_tokens_total{model_name="a"} NaN\n'
            'vllm:prompt_tokens_total{model_name="b"} -3\n'
            'vllm:prompt_tokens_total{model_name="c"} +Inf\n'
            'vllm:prompt_tokens_total{model_name="d"} 5\n'
            '# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{model_name="a"} NaN\n'
            '# TYPE vllm:kv_cache_usage_perc gauge\n'
            'vllm:kv_cache_usage_perc{model_name="a"} 1.02\n')
    page = read_page(text)
    assert_sound(page.rows)
    assert {(r.figure, r.service, r.value) for r in page.rows} == {("prompt_tokens", "d", 5.0),
                                                                    ("kv_cache_usage", "a", 1.0)}
    assert page.skipped["bad_counter_value"] == 3 and page.skipped["bad_value"] == 1
    assert page.skipped["fraction_above_1_clamped"] == 1


def test_a_run_time_alias_teaches_a_renamed_metric():
    text = ('# TYPE vllm:prompt_tokens_by_source_total counter\n'
            'vllm:prompt_tokens_by_source_total{model_name="m",engine="0"} 40\n'
            '# TYPE vllm:queue_time_us_total counter\n'
            'vllm:queue_time_us_total{model_name="m",engine="0"} 2500000\n')
    before = read_page(text)
    assert before.rows == [] and before.skipped["unknown_family"] == 2
    taught = read_page(text, aliases={"vllm": {"vllm:prompt_tokens_by_source": "prompt_tokens",
                                               "vllm:queue_time_us_total": "prompt_tokens*1e-6"}})
    assert {r.value for r in taught.rows if r.figure == "prompt_tokens"} == {40.0}
    assert taught.skipped["superseded"] == 1  # two names for one figure and series: the first one taught wins
    new_server = read_page("my_server_generated_tokens_total 9\n",
                           aliases={"training": {"my_server_generated_tokens_total": "train_samples"}})
    assert new_server.kinds == ["training"] and [r.value for r in new_server.rows] == [9.0]
    with pytest.raises(InputError, match="unknown figure"):
        read_page(text, aliases={"vllm": {"x": "tokens"}})
    with pytest.raises(InputError, match="unknown server kind"):
        read_page(text, aliases={"llama.cpp": {"x": "prompt_tokens"}})


def test_an_unknown_page_is_no_inference_server():
    page = read_page("# TYPE node_load1 gauge\nnode_load1 0.5\n")
    assert page.kinds == [] and page.rows == []
    assert page.skipped == Counter({"not an inference server page": 1})
    answer = check_page("# TYPE node_load1 gauge\nnode_load1 0.5\n")
    assert answer["kind"] == [] and answer["skipped"] == {NOTHING: 1}


def test_triton_microseconds_summaries_and_a_configured_ensemble():
    text = ('# TYPE nv_inference_request_success counter\n'
            'nv_inference_request_success{model="pipeline",version="1"} 10\n'
            'nv_inference_request_success{model="encoder",version="1"} 10\n'
            'nv_inference_request_success{model="ensemble_model",version="1"} 4\n'
            '# TYPE nv_inference_request_failure counter\n'
            'nv_inference_request_failure{model="encoder",reason="REJECTED",version="1"} 1\n'
            'nv_inference_request_failure{model="encoder",reason="BACKEND",version="1"} 2\n'
            '# TYPE nv_inference_request_duration_us counter\n'
            'nv_inference_request_duration_us{model="encoder",version="1"} 2500000\n'
            '# TYPE nv_inference_request_summary_us summary\n'
            'nv_inference_request_summary_us{model="encoder",version="1",quantile="0.5"} 240000\n'
            'nv_inference_request_summary_us_sum{model="encoder",version="1"} 2500000\n'
            'nv_inference_request_summary_us_count{model="encoder",version="1"} 10\n'
            '# TYPE nv_inference_first_response_histogram_ms histogram\n'
            'nv_inference_first_response_histogram_ms{model="encoder",version="1",le="100"} 8\n'
            'nv_inference_first_response_histogram_ms{model="encoder",version="1",le="+Inf"} 10\n'
            'nv_inference_first_response_histogram_ms_sum{model="encoder",version="1"} 900\n'
            'nv_inference_first_response_histogram_ms_count{model="encoder",version="1"} 10\n')
    page = read_page(text, ensembles=["pipeline"])
    assert_sound(page.rows)
    got = {(r.service, r.figure, r.part, r.le): r.value for r in page.rows}
    assert {s for s, *_ in got} == {"encoder"}  # `pipeline` configured, `ensemble_model` by convention
    assert got[("encoder", "e2e_seconds", "sum", None)] == pytest.approx(2.5)
    assert got[("encoder", "e2e_seconds", "count", None)] == 10
    assert got[("encoder", "failed_requests", "value", None)] == 3
    assert got[("encoder", "ttft_seconds", "bucket", 0.1)] == 8
    assert got[("encoder", "ttft_seconds", "sum", None)] == pytest.approx(0.9)
    assert page.skipped["superseded"] == 2 and page.skipped["summary_quantile"] == 1
    assert page.skipped["triton_ensemble"] == 2
    assert "pipeline" in {r.service for r in read_page(text).rows}  # not an ensemble unless configured


def test_hami_legacy_and_current_names_are_one_series_in_canonical_units():
    labels_new = 'namespace="ml",pod="p-1",container="c",vdevice_index="0",device_uuid="GPU-1"'
    labels_old = 'podnamespace="ml",podname="p-1",ctrname="c",vdeviceid="0",deviceuuid="GPU-1",zone="vGPU"'
    text = (f"# TYPE hami_vgpu_memory_used_bytes gauge\nhami_vgpu_memory_used_bytes{{{labels_new}}} 2.5e+09\n"
            "# TYPE vGPU_device_memory_usage_in_bytes gauge\n"
            f"vGPU_device_memory_usage_in_bytes{{{labels_old}}} 2.5e+09\n"
            "# TYPE Device_utilization_desc_of_container gauge\n"
            f"Device_utilization_desc_of_container{{{labels_old}}} 35\n"
            '# TYPE HostCoreUtilization gauge\nHostCoreUtilization{deviceidx="0",deviceuuid="GPU-1",zone="vGPU"} 80\n')
    page = read_page(text)
    assert page.kinds == ["hami"]
    got = {(r.figure, r.namespace, r.pod, r.instance): r.value for r in page.rows}
    ident = "container=c,device_uuid=GPU-1,vdevice_index=0"
    assert got == {("gpu_memory_used_bytes", "ml", "p-1", ident): 2.5e9, ("gpu_core_use", "ml", "p-1", ident): 0.35}
    assert page.skipped["superseded"] == 1 and page.skipped["unread_family"] == 1
    scraped = read_page('hami_vgpu_memory_used_bytes{exported_namespace="ml",exported_pod="p-1",container="c",'
                        'vdevice_index="0",device_uuid="GPU-1",namespace="hami-system",pod="hami-monitor-x"} 1\n')
    assert [(r.namespace, r.pod) for r in scraped.rows] == [("ml", "p-1")]  # the workload's, not the monitor's


def test_training_counters_sglang_router_and_colon_free_names():
    text = ('# TYPE gpuledger_train_samples counter\n'
            'gpuledger_train_samples_total{job_name="llama-ft",rank="0",namespace="ml",pod="w-0"} 128000\n'
            'gpuledger_train_steps_total{job_name="llama-ft",rank="0"} 500\n'
            '# TYPE smg_router_requests_total counter\n'
            'smg_router_requests_total{router_type="http",model="m",endpoint="chat",streaming="true"} 5\n'
            'smg_router_requests_total{router_type="http",model="m",endpoint="chat",streaming="false"} 2\n'
            'smg_router_tokens_total{model="m",token_type="input"} 700\n'
            '# TYPE vllm_generation_tokens_total counter\n'
            'vllm_generation_tokens_total{model_name="m"} 42\n')
    page = read_page(text)
    assert page.kinds == ["training", "sglang_router", "vllm"]
    got = {(r.kind, r.figure, r.service, r.instance, r.pod): r.value for r in page.rows}
    assert got == {("training", "train_samples", "llama-ft", "rank=0", "w-0"): 128000.0,
                   ("training", "train_steps", "llama-ft", "rank=0", None): 500.0,
                   ("sglang_router", "requests", "m", "", None): 7.0,
                   ("sglang_router", "prompt_tokens", "m", "", None): 700.0,
                   ("vllm", "generation_tokens", "m", "", None): 42.0}


def test_check_page_finds_every_kind_on_a_mixed_page():
    dcgm = next(iter(sorted((SHARED / "dcgm-pages").glob("*.txt")))).read_text()
    text = (dcgm + "\n" + VLLM_BOTH + '# TYPE kueue_pending_workloads gauge\n'
            'kueue_pending_workloads{cluster_queue="cq",status="active"} 3\n')
    answer = check_page(text)
    assert set(answer["kind"]) == {"dcgm-exporter", "vllm", "kueue"}
    assert set(answer["kind"]) <= set(KINDS)
    assert {r["kind"] for r in answer["rows"]} == {"dcgm-exporter", "vllm", "kueue"}
    assert "other_family" not in answer["skipped"]  # the DCGM families are dcgm-exporter's, not unread
    json.dumps(answer, allow_nan=False)
    assert [r["le"] for r in answer["rows"] if r.get("le") not in (None, 0.1)] == ["+Inf"]
    lines = summary(answer, "mixed")
    assert lines[1].startswith("kinds: ") and any("superseded" in line for line in lines)


def test_a_reader_failing_on_a_page_is_reported_not_fatal():
    # a MIG profile naming no slice count on a series without GPU_I_ID makes the dcgm converter raise (TypeError in
    # bill_each_gpu_once): the check says so and still reads the rest of the page
    text = ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",modelName="NVIDIA A100-SXM4-40GB",GPU_I_PROFILE="x"} 5\n'
            'vllm:num_requests_running{model_name="m"} 2\n')
    answer = check_page(text)
    assert answer["kind"] == ["dcgm-exporter", "vllm"]
    assert [r["figure"] for r in answer["rows"] if r["kind"] == "vllm"] == ["requests_running"]
    # the converter reads such a series as the card's own slot: billed at most the whole GPU, never failing
    assert "dcgm-exporter: reader_failed" not in answer["skipped"]
    gpu = [r for r in answer["rows"] if r.get("gpu_uuid") == "GPU-1"]
    assert len(gpu) == 1 and 0 < gpu[0]["gpu_fraction"] <= 1.0


def test_fetch_page_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(InputError, match="not found"):
        fetch_page(str(tmp_path / "missing.txt"))
    with pytest.raises(InputError, match="is a folder"):
        fetch_page(str(tmp_path))
    with pytest.raises(InputError, match="only http"):
        fetch_page("ftp://example.invalid/metrics")
    big = tmp_path / "big.txt"
    big.write_text("x 1\n" * 100)
    with pytest.raises(InputError, match="larger than"):
        fetch_page(str(big), max_bytes=50)


# -- the command ----------------------------------------------------------------------------------------------------
def test_scrape_a_file_as_json_and_from_stdin():
    path = pages("vllm")[0]
    done = run("scrape", str(path), "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert set(answer) == {"kind", "rows", "skipped", "examples", "costing"}
    assert answer["kind"] == ["vllm"] and answer["rows"]
    # a server's own page names no pod: what to add so its tokens can be costed (issue 45 item 8)
    assert "[[apps.targets]] with its namespace and pod" in answer["costing"]
    assert all({"kind", "figure", "part", "le", "service", "instance", "value"} <= set(r) for r in answer["rows"])
    piped = run("scrape", "-", "--json", stdin=path.read_text())
    assert piped.returncode == 0 and json.loads(piped.stdout) == answer
    human = run("scrape", str(path))
    assert human.returncode == 0 and "kinds: vllm" in human.stdout and "rows: " in human.stdout
    assert "\ncost: " in human.stdout


def test_a_page_whose_series_name_their_pod_needs_nothing_added_to_be_costed():
    from gpuledger.collector.page_check import check_page
    page = ('# TYPE vllm:prompt_tokens_total counter\n'
            'vllm:prompt_tokens_total{model_name="m",namespace="nlp",pod="llama-0"} 12\n')
    answer = check_page(page)
    assert answer["kind"] == ["vllm"] and answer["rows"] and answer["costing"] is None
    assert check_page("# TYPE up gauge\nup 1\n")["costing"] is None  # no server: nothing to cost


class _Pages(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture()
def page_server():
    """A real HTTP server on 127.0.0.1 serving the shared vLLM pages."""
    server = HTTPServer(("127.0.0.1", 0), partial(_Pages, directory=str(APP_PAGES / "vllm")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_scrape_a_url(page_server):
    path = pages("vllm")[-1]
    done = run("scrape", f"{page_server}/{path.name}", "--json", "--timeout", "5")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer == json.loads(json.dumps(check_page(path.read_text())))
    missing = run("scrape", f"{page_server}/no-such-page", "--timeout", "5")
    assert missing.returncode == 2 and "HTTP 404" in missing.stderr


def test_scrape_a_missing_file_is_one_line_and_exit_2(tmp_path):
    done = run("scrape", str(tmp_path / "nope.txt"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "not found" in done.stderr
    assert done.stdout == ""


def test_scrape_explains_itself():
    done = run("scrape", "--help")
    assert done.returncode == 0 and "promtool check metrics" in done.stdout.replace("\n", " ")
    assert "--json" in done.stdout and "--timeout" in done.stdout


def test_every_reader_is_declared_once():
    assert tuple(READERS) == SERVER_KINDS
    for reader in READERS.values():
        assert all(source.figure in FIGURES for source in reader.sources)
