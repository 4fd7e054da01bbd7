"""Public traces imported into the store: totals the analytics give equal figures computed independently from the
raw files (GPU-hours per team, utilisation, queueing delay), and fractional requests are never billed whole."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import team_usage
from gpuledger.deploy.trace_import import default_path, import_trace

END = datetime(2026, 11, 30, tzinfo=timezone.utc)
ALL = (END - timedelta(days=400), END + timedelta(days=1))


@pytest.fixture
def load(tmp_path):
    """Import a trace into a DuckDB file, ending at END (the readers end traces at 'now' by default). The store's
    own behaviour on both backends is covered elsewhere; these check the readers' totals."""
    def run(trace: str, days: float | None = None):
        store = Store(tmp_path / f"{trace}.duckdb")
        counts = import_trace(store, trace, default_path(trace), days, echo=lambda _: None, end=END)
        return store, counts
    return run


def gpu_hours(store) -> dict[str, float]:
    frame = team_usage(store, *ALL)
    return dict(zip(frame["team"], frame["allocated_gpu_hours"]))


def test_philly_gpu_hours_per_vc_and_queueing_match_the_job_log(load):
    raw = json.loads((default_path("philly") / "sampled_jobs.json").read_text())

    def sec(text: str) -> float:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").timestamp()
    want: dict[str, float] = {}
    for job in raw:
        gpus = sum(len(d["gpus"]) for d in job["detail"])
        want[job["vc"]] = want.get(job["vc"], 0.0) + gpus * (sec(job["end_time"]) - sec(job["start_time"])) / 3600
    store, counts = load("philly")
    assert counts["jobs"] == len(raw) == 4206
    got = gpu_hours(store)
    assert set(got) == set(want)
    for vc, hours in want.items():
        assert got[vc] == pytest.approx(hours, rel=1e-9), vc
    assert round(got["ee9e8c"]) == 251_335  # as the trace's README measured it
    jobs = store.query("SELECT epoch(start_ts) - epoch(submit_ts) AS waited FROM jobs")
    raw_wait = np.median([sec(j["start_time"]) - sec(j["submitted_time"]) for j in raw])
    assert jobs["waited"].median() == pytest.approx(raw_wait) and raw_wait / 60 == pytest.approx(11.2, abs=0.1)
    store.close()


def test_openb_bills_fractions_and_matches_the_pod_list(load):
    days = 2.0
    raw = pd.read_csv(default_path("openb") / "openb_pod_list_default.csv")
    end = float(raw["deletion_time"].max())
    lo = end - days * 86400
    sched = raw[raw["scheduled_time"].notna()]
    overlap = (sched["deletion_time"] - sched["scheduled_time"].clip(lower=lo)).clip(lower=0)
    per_gpu = sched["gpu_milli"].clip(upper=1000) / 1000 * (sched["num_gpu"] > 0)
    want = (sched["num_gpu"] * per_gpu * overlap / 3600).groupby(sched["qos"]).sum()
    store, counts = load("openb", days)
    got = gpu_hours(store)
    for qos, hours in want[want > 0].items():
        assert got[qos] == pytest.approx(hours, rel=1e-6), qos
    shared = store.query("SELECT min(gpu_fraction) AS lo, max(gpu_fraction) AS hi, count(*) AS n FROM samples "
                         "WHERE allocated AND gpu_fraction < 1")
    assert shared["n"][0] > 0 and 0 < shared["lo"][0] and shared["hi"][0] < 1  # milli-GPU, not whole GPUs
    per_gpu_hour = store.query("SELECT node, gpu_uuid, ts, sum(gpu_fraction * interval_s) AS s FROM samples "
                               "GROUP BY ALL")
    assert per_gpu_hour["s"].max() <= 3600 + 1e-6  # no GPU is billed more than an hour per hour
    capacity = store.query("SELECT sum(gpu_fraction * interval_s) / 3600 AS h FROM samples")["h"][0]
    assert capacity == pytest.approx(6212 * days * 24, rel=1e-6)  # held and free add up to every GPU, all the time
    assert counts["fragmentation_readings"] > 0
    store.close()


def test_genai_utilisation_is_the_traces_own(load):
    from gpuledger.collector.traces.genai import load as read_genai
    raw = read_genai(default_path("genai"))
    store, counts = load("genai")
    assert counts["jobs"] == raw["container_ip"].nunique() == 143
    stored = store.query("SELECT avg(util_pct) AS mean, avg((util_pct = 0)::INT) AS zero FROM samples")
    assert stored["mean"][0] == pytest.approx(raw["util_pct"].mean())
    assert stored["zero"][0] == pytest.approx((raw["util_pct"] == 0).mean())
    usage = team_usage(store, *ALL).set_index("team").loc["genai-serving"]
    assert 0 < usage["efficiency"] < 0.2  # used / allocated: mostly idle inference GPUs, as the trace shows
    store.close()


def test_helios_gpu_hours_per_vc_match_its_sequences(load):
    from gpuledger.collector.traces.helios import load as read_helios
    sequences = read_helios(default_path("helios"))
    store, counts = load("helios")
    got = gpu_hours(store)
    for vc, frame in sequences.items():
        assert got.get(vc, 0.0) == pytest.approx(frame["running_gpu_num"].sum() / 60, rel=1e-9), vc
    assert round(got["vc6YE"]) == 139_684
    quotas = store.team_quotas().set_index("team")["guarantee_gpus"]
    assert quotas["vc6YE"] > 0
    store.close()
