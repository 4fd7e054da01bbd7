"""GPU health events: readings in samples become events, per holder, in the fold's transactions; the real dcgm
pages' health series are read; the API and /metrics serve them."""
from __future__ import annotations

from datetime import timedelta

import pandas as pd
import requests

from gpuledger.analytics.health import events_until, health_by_gpu, health_by_job, health_events
from gpuledger.collector.dcgm_source import DcgmPageConverter
from gpuledger.collector.gpu_health import HW_THERMAL, SW_POWER_CAP, xid_meaning
from tests.helpers import T0, gpu_rows, table
from tests.test_dcgm_pages import SHARED_PAGES

STEP = 60.0


def readings(node, gpu, minutes, job=None, team=None, **series):
    """One GPU's samples with per-minute health series (lists) or constants."""
    rows = gpu_rows(node, gpu, "H100", minutes, STEP, util=50.0, job=job, team=team)
    for i, row in enumerate(rows):
        for column, values in series.items():
            row[column] = values[i] if isinstance(values, list) else values
    return rows


def oracle(rows) -> list[tuple]:
    """Events computed in plain Python from the readings, per (node, gpu): what the store must find."""
    found = []
    frame = pd.DataFrame(rows).sort_values("ts")
    for (node, gpu), g in frame.groupby(["node", "gpu_uuid"]):
        prev = None
        for _, r in g.iterrows():
            if r["xid"] > 0 and (prev is None or r["xid"] != prev["xid"]):
                found.append((r["ts"], gpu, "xid", r["xid"], r["job_id"]))
            if prev is not None and r["ecc_sbe_total"] > prev["ecc_sbe_total"]:
                found.append((r["ts"], gpu, "ecc_sbe", r["ecc_sbe_total"] - prev["ecc_sbe_total"], r["job_id"]))
            prev = r
    return sorted(found, key=str)


def stored(store, start, end) -> list[tuple]:
    got = health_events(store, start, end)
    got = got[got["kind"].isin(["xid", "ecc_sbe"])]
    return sorted(((r.ts, r.gpu_uuid, r.kind, r.code if r.kind == "xid" else r.increase, r.job_id)
                   for r in got.itertuples()), key=str)


def test_xid_and_ecc_changes_become_events_of_the_job_holding_the_gpu(open_store):
    xids = [0] * 20 + [79] * 20 + [13] * 20  # the field holds the last XID until the next one
    ecc = [3] * 30 + [5] * 10 + [2] * 20  # a rise of 2, then a reset (driver reload): not an event
    rows = (readings("n1", 0, 60, job="j1", team="a", xid=xids, ecc_sbe_total=ecc)
            + readings("n1", 1, 60, xid=[0] * 59 + [48], ecc_sbe_total=0))
    with open_store("h") as s:
        s.append_samples(table(rows))
        s.fold(until=T0 + timedelta(hours=1))
        assert events_until(s) == T0 + timedelta(hours=1)
        got = stored(s, T0, T0 + timedelta(hours=1))
        want = oracle(rows)
        assert got == [tuple(w) for w in want] and len(got) == 4
        free = health_events(s, T0, T0 + timedelta(hours=1), kind="xid", node="n1")
        assert pd.isna(free.iloc[0]["job_id"]) and free.iloc[0]["code"] == 48  # a free GPU: an event of no job
        assert free.iloc[0]["meaning"] == xid_meaning(48) == "double-bit ECC error"
        job = health_by_job(s, T0, T0 + timedelta(hours=1)).set_index("job_id").loc["j1"]
        assert (job["xid"], job["ecc_sbe"], list(job["xid_codes"]), job["gpus_affected"]) == (2, 1, [13, 79], 1)
        # every part of an answer holds to its filters: another node's jobs and GPUs are not in a node's answer
        # (/v1/health?node=bogus listed every node's jobs)
        assert health_by_job(s, T0, T0 + timedelta(hours=1), node="no-such-node").empty
        assert not health_by_job(s, T0, T0 + timedelta(hours=1), node="n1").empty
        assert health_by_gpu(s, T0, T0 + timedelta(hours=1), team="no-such-team").empty


def test_throttling_starts_count_once_per_spell_and_shared_gpus_name_every_holder(open_store):
    # thermal bits set for minutes 10-19, a one-minute gap at 20, set again 21-29 (the same spell), then clear
    # until 40 and set again: two spells. Power cap alone at minute 50.
    bits = [0] * 10 + [HW_THERMAL] * 10 + [0] + [HW_THERMAL] * 9 + [0] * 10 + [HW_THERMAL] * 10 + [0] * 10
    bits = [b | (SW_POWER_CAP if i == 50 else 0) for i, b in enumerate(bits)]
    rows = [dict(r, gpu_fraction=0.5, pod=f"p{k}", job_id=f"job-{k}", team=f"t{k}")
            for k in (1, 2) for r in readings("n2", 0, 60, job="x", team="x", throttle_reasons=bits)]
    with open_store("t") as s:
        s.append_samples(table(rows))
        s.fold(until=T0 + timedelta(hours=1))
        events = health_events(s, T0, T0 + timedelta(hours=1))
        thermal = events[events["kind"] == "thermal_throttle"]
        assert sorted(thermal["ts"].unique()) == [pd.Timestamp(T0 + timedelta(minutes=m)) for m in (10, 40)]
        assert sorted(thermal["job_id"]) == ["job-1", "job-1", "job-2", "job-2"]  # each pod sharing the GPU
        power = events[events["kind"] == "power_throttle"]
        assert len(power) == 2 and set(power["ts"]) == {pd.Timestamp(T0 + timedelta(minutes=50))}
        gpu = health_by_gpu(s, T0, T0 + timedelta(hours=1)).iloc[0]
        assert (gpu["thermal_throttle"], gpu["power_throttle"], gpu["jobs_hit"]) == (2, 1, 2)


def test_a_late_reading_refolds_its_events(open_store):
    """A batch for minutes already folded (an agent's backlog) re-derives the events of those minutes."""
    early = readings("n3", 0, 30, job="j", team="a", xid=0)
    late = readings("n3", 0, 30, job="j", team="a", xid=[0] * 5 + [31] * 25)
    late = [dict(r, ts=r["ts"] + timedelta(minutes=30)) for r in late]
    with open_store("late") as s:
        s.append_samples(table(early))
        s.append_samples(table([r for r in late if r["ts"] >= T0 + timedelta(minutes=50)]))  # minute 50-59 first
        s.fold(until=T0 + timedelta(hours=1))
        assert health_events(s, T0, T0 + timedelta(hours=1), kind="xid").empty or \
            len(health_events(s, T0, T0 + timedelta(hours=1), kind="xid")) == 1
        s.append_samples(table([r for r in late if r["ts"] < T0 + timedelta(minutes=50)]))  # the backlog
        got = health_events(s, T0, T0 + timedelta(hours=1), kind="xid")
        assert got["ts"].tolist() == [pd.Timestamp(T0 + timedelta(minutes=35))] and got["code"].tolist() == [31]


def test_the_real_pages_health_series_are_read():
    """The 2.4 docs page and the Datadog T4 fixture carry XID_ERRORS = 0 (no error) and the NVLink total; a page
    whose XID reads 79 on the next scrape is an XID on every row of that GPU."""
    page = (SHARED_PAGES / "nvidia-cloud-native-docs-dcgm-exporter-rst-a100-mig-2.4.txt").read_text()
    converter = DcgmPageConverter()
    first = converter.convert(page, T0, 10.0).to_pandas()
    assert (first["xid"] == 0).all()
    assert first.loc[first["mig_instance"].isna(), "nvlink_bps"].tolist() == [0.0]  # a GPU field, not the instance's
    sick = "\n".join(line.replace("} 0", "} 79") if line.startswith("DCGM_FI_DEV_XID_ERRORS") else line
                     for line in page.splitlines())
    second = converter.convert(sick, T0 + timedelta(seconds=10), 10.0).to_pandas()
    assert (second["xid"] == 79).all()
    t4 = DcgmPageConverter().convert((SHARED_PAGES / "datadog-integrations-core-dcgm-fixture-t4-460.txt").read_text(),
                                     T0, 10.0).to_pandas()
    assert t4["xid"].tolist() == [0] and t4["nvlink_bps"].tolist() == [0.0]


def test_the_api_and_metrics_serve_health_events(sim_store, api_url):
    """The simulated cluster has GPUs that report an XID during the run and GPUs that throttle when busy."""
    sim_store.fold()
    answer = requests.get(api_url + "/v1/health", params={"days": 3}, timeout=60)
    assert answer.status_code == 200
    body = answer.json()
    kinds = {e["kind"] for e in body["events"]}
    assert "thermal_throttle" in kinds
    assert body["events_until"] and body["by_gpu"] and body["by_job"]
    xids = [e for e in body["events"] if e["kind"] == "xid"]
    assert all(e["code"] in (79, 48, 13, 31) and e["meaning"] for e in xids)
    per_job = sum(j["events"] for j in body["by_job"])
    assert per_job == sum(1 for e in body["events"] if e["job_id"]) or len(body["events"]) == 500
    bad = requests.get(api_url + "/v1/health", params={"kind": "fire"}, timeout=60)
    assert bad.status_code == 422 and "xid" in bad.text
    metrics = requests.get(api_url + "/metrics", timeout=60).text
    assert 'gpuledger_gpu_health_events_total{kind="thermal_throttle",node=' in metrics
