"""Job lifecycle from the schedulers (issue 22, the Slurm part): sacct's output parsed by field name over every real
capture in ../shared/app-pages/slurm-sacct, stored with its events, and read back as queue waits, outcomes and
what waits now, through the analytics, the CLI and the API."""
from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.workloads import outcomes, waiting_demand, waiting_now, workload_summary
from gpuledger.collector.errors import InputError
from gpuledger.collector.jobs.kube_state import parse_kube_state
from gpuledger.collector.jobs.lifecycle import LEFT_QUEUE, STATES
from gpuledger.collector.jobs.sacct import gpus_of, parse_sacct
from gpuledger.collector.jobs.squeue import parse_squeue
from gpuledger.deploy.api import create_app
from gpuledger.deploy.api.live_metrics import StoreGauges
from tests.procs import GPULEDGER

CAPTURES = sorted((Path(__file__).parent.parent.parent / "shared" / "app-pages" / "slurm-sacct").glob("*.txt"))


def _allocation_rows(text: str) -> list[list[str]]:
    """The capture's allocation rows with a GPU, split by hand: the oracle the parser is checked against."""
    rows = [line.split("|") for line in text.splitlines() if "|" in line and not line.startswith("#")]
    body = [r for r in rows if r[0] != "JobID"]
    return [r for r in body if "." not in r[0] and "gres/gpu" in "|".join(r)]


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_every_sacct_capture_gives_its_gpu_jobs_once_each(capture):
    assert CAPTURES, "../shared/app-pages/slurm-sacct holds the real captures"
    text = capture.read_text()
    batch = parse_sacct(text)
    want = _allocation_rows(text)
    assert len(batch.jobs) == len(want) and batch.jobs["job_id"].is_unique
    assert set(batch.jobs["job_id"]) == {f"slurm:{r[0]}" for r in want}
    assert (batch.jobs["gpus"] >= 1).all()
    assert batch.skipped["step"] == sum(1 for line in text.splitlines()
                                        if "|" in line and not line.startswith("#") and "." in line.split("|")[0])
    known = [s for s in batch.jobs["state"].dropna() if s not in STATES]
    assert sorted(known) == sorted(s.lower() for s in batch.unknown_states.elements())


def test_states_times_and_gpus_as_sacct_prints_them():
    text = next(p for p in CAPTURES if "sonar" in p.name).read_text()
    jobs = parse_sacct(text, zone=ZoneInfo("Europe/Oslo")).jobs.set_index("job_id")
    cancelled = jobs.loc["slurm:974745"]  # "CANCELLED by 2101477"; AllocTRES gres/gpu:rtx30=1,gres/gpu=1
    assert cancelled["state"] == "cancelled" and cancelled["gpus"] == 1 and cancelled["gpu_model"] == "rtx30"
    assert cancelled["team"] == "ec35" and cancelled["partition"] == "ifi_accel" and cancelled["node"] == "gpu-4"
    timeout = jobs.loc["slurm:974804"]
    assert timeout["state"] == "timeout" and timeout["gpu_model"] == "a100"  # 40 or 80 GB: not guessed
    # the Fox cluster's local time (CET in November): 13:05:06 there is 12:05:06 UTC
    assert timeout["submit_ts"] == pd.Timestamp("2024-11-13 12:05:06", tz="UTC")
    assert not jobs.index.str.contains(r"\.").any()  # no step row
    mig = parse_sacct(next(p for p in CAPTURES if "mig" in p.name).read_text()).jobs.set_index("job_id")
    assert mig.loc["slurm:8117657", "gpu_model"] == "A100-40GB"  # a100_3g.20gb: only the 40 GB card has it
    assert mig.loc["slurm:8117678", "gpu_model"] == "H100"


@pytest.mark.parametrize("tres, want", [
    ("billing=6,cpu=6,mem=10000M,node=1", (None, None)),
    ("cpu=8,gres/gpu=4,mem=64G", (4, None)),
    ("gres/gpu:h100=2,gres/gpu=2", (2, "H100")),  # typed beside generic: counted once
    ("gres/gpu:h100=2,gres/gpu:l4=1", (3, None)),  # two types, no generic: summed, no single model
    ("gres/gpu:l40s=1", (1, "L40S")),
    ("gres/gpu=x", (None, None)),
])
def test_gpus_of_alloctres(tres, want):
    assert gpus_of(tres) == want


def test_a_dump_without_a_header_needs_its_fields_and_bad_rows_are_counted():
    rows = "1001|COMPLETED|2026-12-01T10:00:00|2026-12-01T10:05:00|2026-12-01T11:05:00|nlp|gres/gpu=2\n" \
           "1001.batch|COMPLETED|2026-12-01T10:05:00|2026-12-01T10:05:00|2026-12-01T11:05:00|nlp|gres/gpu=2\n" \
           "1002|COMPLETED|short row\n$ echo done\n"
    with pytest.raises(InputError, match="no header"):
        parse_sacct(rows)
    batch = parse_sacct(rows, ["JobID", "State", "Submit", "Start", "End", "Account", "AllocTRES"])
    assert list(batch.jobs["job_id"]) == ["slurm:1001"] and batch.jobs["gpus"].tolist() == [2]
    assert dict(batch.skipped) == {"step": 1, "malformed": 1, "not_a_row": 1}
    pasted = "$ sacct -P --noheader -o JobID,State,Submit,Start,End,Account,AllocTRES%30\n" + rows
    assert list(parse_sacct(pasted).jobs["job_id"]) == ["slurm:1001"]
    with pytest.raises(InputError, match="no sacct"):
        parse_sacct("hello\nworld\n")
    odd = parse_sacct("JobID|State|AllocTRES\n7|SPECIAL_NEW|gres/gpu=1\n")
    assert odd.jobs["state"].tolist() == ["special_new"] and dict(odd.unknown_states) == {"SPECIAL_NEW": 1}


AT = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
HISTORY = """JobID|State|Submit|Start|End|Account|AllocTRES|ReqTRES|Reason|Restarts
1|COMPLETED|2026-12-01T08:00:00|2026-12-01T08:10:00|2026-12-01T09:10:00|nlp|gres/gpu:h100=2,gres/gpu=2||None|0
2|FAILED|2026-12-01T08:00:00|2026-12-01T08:30:00|2026-12-01T09:00:00|nlp|gres/gpu:h100=4,gres/gpu=4||None|1
3|PREEMPTED|2026-12-01T09:00:00|2026-12-01T09:00:00|2026-12-01T10:00:00|vision|gres/gpu:h100=1,gres/gpu=1||None|0
4|PENDING|2026-12-01T10:00:00|Unknown|Unknown|vision||gres/gpu:h100=8,gres/gpu=8|Resources|0
5|CANCELLED by 0|2026-12-01T10:00:00|None|2026-12-01T10:30:00|vision||gres/gpu:h100=2,gres/gpu=2|None|0
"""


def test_waits_outcomes_and_what_waits_now(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        batch = parse_sacct(HISTORY)
        assert store.record_jobs(batch.jobs, batch.events) == 5
        assert store.record_jobs(batch.jobs, batch.events) == 5  # read again: replaced, not doubled
        assert store.scalar("SELECT count(*) FROM job_events") == len(batch.events)
        start = AT - timedelta(hours=6)
        summary = workload_summary(store, start, AT, AT).set_index("team")
        nlp, vision = summary.loc["nlp"], summary.loc["vision"]
        assert nlp["jobs_started"] == 2 and nlp["wait_max_minutes"] == pytest.approx(30)
        assert nlp["wait_p50_minutes"] == pytest.approx(20)
        assert nlp["lost_gpu_hours"] == pytest.approx(4 * 0.5) and nlp["run_gpu_hours"] == pytest.approx(2 + 2)
        assert nlp["restarts"] == 1
        assert vision["pending_jobs"] == 1 and vision["pending_gpus"] == 8
        assert vision["longest_pending_minutes"] == pytest.approx(120)
        assert vision["lost_gpu_hours"] == pytest.approx(1.0)  # preempted
        # waiting: job 4 for 2 h (8 GPUs) and job 5 for 30 min (2 GPUs), cancelled before it started
        assert vision["waiting_gpu_hours"] == pytest.approx(8 * 2 + 2 * 0.5)
        demand = waiting_demand(store, start, AT, AT).set_index("team")
        assert demand.loc["vision", "waiting_gpu_hours"] == pytest.approx(17)
        ended = outcomes(store, start, AT, AT)
        assert set(zip(ended["team"], ended["outcome"])) == {("nlp", "completed"), ("nlp", "failed"),
                                                             ("vision", "preempted"), ("vision", "cancelled")}
        now = waiting_now(store, AT)
        assert now["job_id"].tolist() == ["slurm:4"] and now["pending_reason"].tolist() == ["Resources"]
        with TestClient(create_app(store, Config(), open_reads=True)) as client:
            got = client.get("/v1/workloads", params={"days": 0.25, "end": AT.isoformat()})
            assert got.status_code == 200, got.text
            body = got.json()
            assert {r["team"] for r in body["by_team"]} == {"nlp", "vision"}
            assert body["waiting_now"][0]["pending_reason"] == "Resources"
            assert sum(r["gpu_hours"] for r in body["outcomes"] if r["lost"]) == pytest.approx(3.0)
        gauges = {f.name: f for f in StoreGauges(store, Config(), clock=lambda: AT).collect()}
        waiting = {(x.labels["team"], x.labels["gpu_model"]): x.value
                   for x in gauges["gpuledger_team_pending_gpus"].samples}
        assert waiting[("vision", "H100")] == 8
        longest = gauges["gpuledger_team_longest_wait_minutes"].samples
        assert [(x.labels["team"], x.value) for x in longest] == [("vision", 120.0)]  # none for nlp: no wait known


def test_import_sacct_from_a_file_and_from_stdin(tmp_path):
    db = tmp_path / "jobs.duckdb"
    dump = tmp_path / "sacct.txt"
    dump.write_text(HISTORY)
    out = subprocess.run([GPULEDGER, "import", "sacct", str(dump), "--db", str(db)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "imported sacct: 5 GPU jobs" in out.stdout, out.stderr
    sonar = next(p for p in CAPTURES if "sonar" in p.name).read_text()
    out = subprocess.run([GPULEDGER, "import", "sacct", "-", "--db", str(db), "--timezone", "Europe/Oslo"],
                         input=sonar, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "4 GPU jobs" in out.stdout and "5 no_gpus" in out.stdout, out.stderr
    for args, message in ((["nothere"], "not found"), (["-", "--timezone", "Mars/Base"], "not a time zone"),
                          ([], "give the file")):
        bad = subprocess.run([GPULEDGER, "import", "sacct", *args, "--db", str(db)], input="", capture_output=True,
                             text=True, timeout=120)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
    with Store(db) as store:
        assert store.scalar("SELECT count(*) FROM jobs") == 9


# squeue -a -o "%i|%T|%V|%a|%u|%P|%q|%b|%r|%j|%D|%S" from Debian's Slurm 22.05 (the test cluster of test_slurm.py)
SQUEUE = """JOBID|STATE|SUBMIT_TIME|ACCOUNT|USER|PARTITION|QOS|TRES_PER_NODE|REASON|NAME|NODES|START_TIME
1|PENDING|2026-12-05T08:14:14|nlp|root|debug|normal|gres:gpu:h100:1|BeginTime|wrap|1|2026-12-05T09:14:14
2|PENDING|2026-12-05T08:14:14|vision|root|debug|normal|gres:gpu:2|BeginTime|wrap|1|2026-12-05T09:14:14
4|PENDING|2026-12-05T08:14:14|vision|root|debug|normal|gres:gpu:h100:2|AssocGrpGRES|wrap|1|N/A
3|RUNNING|2026-12-05T08:14:14|vision|root|debug|normal|gres:gpu:h100:2|None|wrap|1|2026-12-05T08:14:16
5|COMPLETING|2026-12-05T08:14:14|vision|root|debug|normal|gres/gpu:l4=1|None|wrap|2|2026-12-05T08:14:16
6|PENDING|2026-12-05T08:14:14|vision|root|debug|normal|N/A|Priority|cpu|1|N/A
"""


def test_squeue_gives_what_waits_now_and_why(tmp_path):
    batch = parse_squeue(SQUEUE)
    jobs = batch.jobs.set_index("job_id")
    assert list(jobs.index) == ["slurm:1", "slurm:2", "slurm:4", "slurm:3", "slurm:5"]
    assert jobs.loc["slurm:4", "pending_reason"] == "AssocGrpGRES" and jobs.loc["slurm:4", "gpus"] == 2
    assert pd.isna(jobs.loc["slurm:2", "gpu_model"]) and jobs.loc["slurm:1", "gpu_model"] == "H100"
    assert pd.isna(jobs.loc["slurm:1", "start_ts"])  # a pending job's START_TIME is an expectation, not a start
    assert jobs.loc["slurm:3", "start_ts"] == pd.Timestamp("2026-12-05 08:14:16", tz="UTC")
    assert jobs.loc["slurm:5", "gpus"] == 2 and jobs.loc["slurm:5", "gpu_model"] == "L4"  # 1 per node x 2 nodes
    assert batch.skipped["no_gpus"] == 1
    with pytest.raises(InputError, match="no header"):
        parse_squeue(SQUEUE.split("\n", 1)[1])
    with Store(tmp_path / "q.duckdb") as store:
        store.record_jobs(batch.jobs, batch.events)
        seen = waiting_now(store, datetime(2026, 12, 5, 9, tzinfo=timezone.utc))
        assert seen["job_id"].tolist()[:1] == ["slurm:1"] and set(seen["pending_reason"]) == {"BeginTime",
                                                                                              "AssocGrpGRES"}
        later = parse_squeue(SQUEUE.replace("4|PENDING", "7|PENDING"))  # 4 left the queue, 7 came
        store.record_jobs(later.jobs, later.events)
        at = datetime(2026, 12, 5, 9, tzinfo=timezone.utc)
        gone = store.close_left_queue("slurm", list(later.jobs["job_id"]), at, LEFT_QUEUE)
        assert gone == 1 and store.scalar("SELECT state FROM jobs WHERE job_id = 'slurm:4'") == LEFT_QUEUE


KSM_CAPTURES = sorted((Path(__file__).parent.parent.parent / "shared" / "app-pages" / "kube-state-metrics")
                      .glob("*.txt"))
# kube-state-metrics v2 pod families for GPU pods, shaped as its pod-metrics docs give them (values change per pod)
KSM_GPU = """# TYPE kube_pod_created gauge
kube_pod_created{namespace="nlp",pod="train-0",uid="a"} 1.7648e+09
kube_pod_created{namespace="nlp",pod="train-1",uid="b"} 1.7648e+09
kube_pod_created{namespace="vision",pod="oom-0",uid="c"} 1.7648e+09
kube_pod_created{namespace="vision",pod="evicted-0",uid="d"} 1.7648e+09
kube_pod_created{namespace="vision",pod="web-0",uid="e"} 1.7648e+09
# TYPE kube_pod_start_time gauge
kube_pod_start_time{namespace="vision",pod="oom-0",uid="c"} 1.7648006e+09
kube_pod_start_time{namespace="vision",pod="evicted-0",uid="d"} 1.76480012e+09
# TYPE kube_pod_completion_time gauge
kube_pod_completion_time{namespace="vision",pod="oom-0",uid="c"} 1.7648042e+09
# TYPE kube_pod_status_phase gauge
kube_pod_status_phase{namespace="nlp",pod="train-0",uid="a",phase="Pending"} 1
kube_pod_status_phase{namespace="nlp",pod="train-0",uid="a",phase="Running"} 0
kube_pod_status_phase{namespace="nlp",pod="train-1",uid="b",phase="Pending"} 1
kube_pod_status_phase{namespace="vision",pod="oom-0",uid="c",phase="Failed"} 1
kube_pod_status_phase{namespace="vision",pod="evicted-0",uid="d",phase="Failed"} 1
kube_pod_status_phase{namespace="vision",pod="web-0",uid="e",phase="Running"} 1
# TYPE kube_pod_status_reason gauge
kube_pod_status_reason{namespace="vision",pod="evicted-0",uid="d",reason="Evicted"} 1
kube_pod_status_reason{namespace="vision",pod="evicted-0",uid="d",reason="NodeLost"} 0
# TYPE kube_pod_status_unschedulable gauge
kube_pod_status_unschedulable{namespace="nlp",pod="train-0",uid="a"} 1
kube_pod_status_unschedulable{namespace="nlp",pod="train-1",uid="b"} 1
# TYPE kube_pod_container_status_restarts_total counter
kube_pod_container_status_restarts_total{namespace="vision",pod="oom-0",uid="c",container="main"} 2
kube_pod_container_status_restarts_total{namespace="vision",pod="oom-0",uid="c",container="sidecar"} 1
# TYPE kube_pod_container_status_last_terminated_reason gauge
kube_pod_container_status_last_terminated_reason{namespace="vision",pod="oom-0",uid="c",container="main",reason="OOMKilled"} 1
# TYPE kube_pod_owner gauge
kube_pod_owner{namespace="nlp",pod="train-0",uid="a",owner_kind="PyTorchJob",owner_name="bert",owner_is_controller="true"} 1
kube_pod_owner{namespace="nlp",pod="train-1",uid="b",owner_kind="PyTorchJob",owner_name="bert",owner_is_controller="true"} 1
kube_pod_owner{namespace="vision",pod="web-0",uid="e",owner_kind="<none>",owner_name="<none>",owner_is_controller="<none>"} 1
# TYPE kube_pod_labels gauge
kube_pod_labels{namespace="nlp",pod="train-0",uid="a",label_team="research"} 1
# TYPE kube_pod_container_resource_requests gauge
kube_pod_container_resource_requests{namespace="nlp",pod="train-0",uid="a",container="main",node="",resource="nvidia_com_gpu",unit="integer"} 8
kube_pod_container_resource_requests{namespace="nlp",pod="train-0",uid="a",container="main",node="",resource="cpu",unit="core"} 32
kube_pod_container_resource_requests{namespace="nlp",pod="train-1",uid="b",container="main",node="",resource="nvidia_com_gpu",unit="integer"} 8
kube_pod_container_resource_requests{namespace="vision",pod="oom-0",uid="c",container="main",node="n1",resource="nvidia_com_gpu",unit="integer"} 1
kube_pod_container_resource_requests{namespace="vision",pod="evicted-0",uid="d",container="main",node="n1",resource="nvidia_com_gpu",unit="integer"} 2
kube_pod_container_resource_requests_nvidia_gpu_devices{namespace="vision",pod="web-0",container="main"} 1
"""


@pytest.mark.parametrize("capture", KSM_CAPTURES, ids=lambda p: p.name)
def test_every_kube_state_capture_gives_its_pods_phases_and_owners(capture):
    text = capture.read_text()
    every = parse_kube_state(text, gpu_pods_only=False).jobs.set_index("job_id")
    pods = {line.split('pod="')[1].split('"')[0] for line in text.splitlines()
            if line.startswith("kube_pod_created{")}
    assert set(every["pod"]) == pods
    phases = {line.split('pod="')[1].split('"')[0]: line.split('phase="')[1].split('"')[0]
              for line in text.splitlines() if line.startswith("kube_pod_status_phase{") and line.endswith(" 1")}
    for pod, phase in phases.items():
        state = every.set_index("pod").loc[pod, "state"]
        assert state == {"Succeeded": "completed", "Running": "running", "Pending": "pending"}.get(phase, state)
    assert every["state"].isna().sum() == len(pods) - len(phases)  # a phase the page does not give: unknown
    gpu = parse_kube_state(text)
    assert len(gpu.jobs) == sum(1 for line in text.splitlines() if 'resource="nvidia_com_gpu"' in line)


def test_kube_state_gpu_pods_as_jobs(tmp_path):
    batch = parse_kube_state(KSM_GPU, team_label="team")
    jobs = batch.jobs.set_index("job_id")
    assert set(jobs.index) == {"nlp/train-0", "nlp/train-1", "vision/oom-0", "vision/evicted-0", "vision/web-0"}
    gang = jobs.loc["nlp/train-0"]
    assert gang["state"] == "pending" and gang["pending_reason"] == "Unschedulable" and gang["gpus"] == 8
    assert gang["name"] == "PyTorchJob/bert" and gang["team"] == "research"  # the label, not the namespace
    assert jobs.loc["nlp/train-1", "team"] == "nlp"  # no such label: its namespace
    oom = jobs.loc["vision/oom-0"]
    assert oom["state"] == "out_of_memory" and oom["restarts"] == 3 and oom["exit_code"] == "OOMKilled"
    assert (oom["end_ts"] - oom["start_ts"]).total_seconds() == pytest.approx(3600)
    assert jobs.loc["vision/evicted-0", "state"] == "preempted"
    assert jobs.loc["vision/web-0", "gpus"] == 1 and pd.isna(jobs.loc["vision/web-0", "name"])  # older family
    with Store(tmp_path / "k.duckdb") as store:
        store.record_jobs(batch.jobs, batch.events)
        at = datetime.fromtimestamp(1.7648042e9, timezone.utc)
        now = waiting_now(store, at)
        assert now["gpus"].sum() == 16 and set(now["pending_reason"]) == {"Unschedulable"}
        ended = outcomes(store, at - timedelta(hours=2), at + timedelta(seconds=1), at).set_index("outcome")
        assert ended.loc["out_of_memory", "gpu_hours"] == pytest.approx(1.0) and bool(ended.loc["out_of_memory",
                                                                                                "lost"])
    out = subprocess.run([GPULEDGER, "import", "kube-state", "-", "--team-label", "team", "--db",
                          str(tmp_path / "cli.duckdb")], input=KSM_GPU, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "imported kube-state: 5 GPU jobs" in out.stdout, out.stderr
