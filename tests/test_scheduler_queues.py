"""Kubernetes job lifecycle and scheduler queues: Kueue and KAI metrics pages, the comparison of the quotas in
force with gpuledger's plan, workload classes and gang jobs waiting, and the continuous Prometheus reader against
the real Debian Prometheus scraping pages whose values change per scrape."""
from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from gpuledger.analytics.config import Config
from gpuledger.analytics.queues import admission_waits, scheduler_queues
from gpuledger.analytics.store import Store
from gpuledger.analytics.workloads import workload_summary
from gpuledger.collector.jobs.kai import parse_kai
from gpuledger.collector.jobs.kube_state import parse_kube_state
from gpuledger.collector.jobs.kueue import parse_kueue
from gpuledger.collector.jobs.classes import UNCLASSIFIED, WORKLOAD_CLASSES, infer_class
from gpuledger.collector.jobs.prometheus_jobs import PrometheusLifecycle
from gpuledger.deploy.api import create_app
from gpuledger.deploy.job_loop import JobLoop
from gpuledger.policies.quota_plan import QuotaPlan, TeamPlan
from gpuledger.policies.scheduler_state import COMPARISON_STATUSES, compare_with_scheduler
from tests.helpers import serve_pages
from tests.prometheus_server import BINARY, PrometheusServer
from tests.scheduler_pages import FINAL, KUEUE_BUCKETS, kai_page, ksm_page, kueue_page

UTC = timezone.utc
JOB_FIELDS = ["job_id", "team", "gpus", "state", "submit_ts", "eligible_ts", "start_ts", "end_ts", "restarts",
              "exit_code", "pending_reason", "name", "workload_class", "class_rule"]


def test_kueue_page_gives_gpu_quotas_usage_waits_and_skips_other_resources():
    at = datetime(2026, 12, 1, tzinfo=UTC)
    batch = parse_kueue(kueue_page(4), at)
    rows = batch.rows
    assert batch.skipped["not_gpu"] == 6  # cpu lines of three resource families x two queues
    quota = rows[rows["figure"] == "quota_gpus"].set_index("queue")
    assert quota.loc["nlp", "value"] == 8 and quota.loc["nlp", "flavor"] == "h100"
    assert quota.loc["vision", "cohort"] == "research"
    assert set(rows.loc[rows["figure"] == "pending_workloads", "value"]) == {3.0, 1.0}  # 5 - 4 // 2, 4 % 3
    count = rows[(rows["figure"] == "admitted_total") & (rows["queue"] == "nlp")]["value"].item()
    assert count == 10  # 2 * 4 + 2 admissions
    buckets = rows[(rows["figure"] == "admission_wait_bucket") & (rows["queue"] == "nlp")]
    assert len(buckets) == len(KUEUE_BUCKETS) + 1 and "+Inf" in set(buckets["detail"])
    assert (rows["ts"] == pd.Timestamp(at)).all()


def test_kai_page_gives_deserved_allocated_and_fair_share_and_unlimited_is_not_minus_one():
    rows = parse_kai(kai_page(2), datetime(2026, 12, 1, tzinfo=UTC)).rows
    quota = rows[rows["figure"] == "quota_gpus"].set_index("queue")
    assert quota.loc["nlp", "value"] == 8
    assert pd.isna(quota.loc["default-queue", "value"]) and quota.loc["default-queue", "detail"] == "unlimited"
    assert rows[(rows["figure"] == "usage_gpus") & (rows["queue"] == "nlp-h100")]["value"].item() == 6
    # any metric namespace, and the older queue_info label when deserved is not published
    old = parse_kai('runai_queue_info{queue_name="a",gpu_guaranteed_quota="3"} 1\n'
                    'runai_queue_allocated_gpus{queue_name="a"} 2\n', datetime(2026, 12, 1, tzinfo=UTC)).rows
    assert dict(zip(old["figure"], old["value"])) == {"usage_gpus": 2.0, "quota_gpus": 3.0}


def test_admission_waits_over_a_window_come_from_the_histograms_growth(tmp_path):
    store = Store(tmp_path / "q.duckdb")
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    for step in (2, 6):
        store.record_queue_metrics(parse_kueue(kueue_page(step), t0 + timedelta(hours=step)).rows)
    store.record_queue_metrics(parse_kueue(kueue_page(6), t0 + timedelta(hours=6)).rows)  # read twice: once
    assert store.query("SELECT count(DISTINCT ts) AS n FROM queue_metrics")["n"].item() == 2
    waits = admission_waits(store, t0 + timedelta(hours=3), t0 + timedelta(hours=7)).set_index("queue")
    # steps 2 -> 6: 6 -> 14 admissions; waits cycle 1..5 x scale, the 8 new ones are k = 6..13
    new = [40.0 * (1 + (k % 5)) for k in range(6, 14)]
    assert waits.loc["nlp", "admitted"] == 8
    assert waits.loc["nlp", "wait_mean_s"] == pytest.approx(sum(new) / 8)
    assert 40 <= waits.loc["nlp", "wait_p50_s"] <= 200 and waits.loc["nlp", "wait_p95_s"] <= 320
    # no read in the window: nothing; one read and none before: the growth is unknown (null), never zero
    assert admission_waits(store, t0 + timedelta(hours=7), t0 + timedelta(hours=8)).empty
    one = admission_waits(store, t0, t0 + timedelta(hours=3))
    assert len(one) == 2 and one[["admitted", "wait_mean_s", "wait_p95_s"]].isna().all().all()
    restarted = Store(tmp_path / "r.duckdb")
    restarted.record_queue_metrics(parse_kueue(kueue_page(6), t0).rows)
    restarted.record_queue_metrics(parse_kueue(kueue_page(1), t0 + timedelta(hours=1)).rows)  # counter reset
    after = admission_waits(restarted, t0 + timedelta(minutes=30), t0 + timedelta(hours=2)).set_index("queue")
    assert after.loc["nlp", "admitted"] == 4  # counts from zero after the reset, never negative


def _plan() -> QuotaPlan:
    nlp = TeamPlan("nlp", 1.0, None, guarantee={"H100": 8.0}, limit={"H100": 12.0})
    vision = TeamPlan("vision", 1.0, None, guarantee={"H100": 6.0}, limit={"H100": 8.0})
    speech = TeamPlan("speech", 1.0, None, guarantee={"L4": 2.0}, limit={"L4": 4.0})
    return QuotaPlan([nlp, vision, speech], {"H100": 16.0, "L4": 8.0}, datetime(2026, 12, 1, tzinfo=UTC))


def test_the_plan_beside_the_quotas_in_force_names_every_difference(tmp_path):
    store = Store(tmp_path / "c.duckdb")
    at = datetime(2026, 12, 1, tzinfo=UTC)
    store.record_queue_metrics(parse_kueue(kueue_page(3), at).rows)
    store.record_queue_metrics(parse_kai(kai_page(3), at).rows)
    table = compare_with_scheduler(store, _plan(), at + timedelta(minutes=1))
    assert set(table["status"]) <= set(COMPARISON_STATUSES)
    kueue = table[table["scheduler"] == "kueue"].set_index(["queue", "flavor"])
    assert kueue.loc[("nlp", "h100"), "status"] == "matches" and kueue.loc[("nlp", "h100"), "team"] == "nlp"
    assert kueue.loc[("vision", "h100"), "status"] == "differs"
    assert kueue.loc[("vision", "h100"), "difference_gpus"] == 2  # planned 6, in force 4
    assert kueue.loc[("speech", "l4"), "status"] == "not_in_scheduler"
    kai = table[table["scheduler"] == "kai"].set_index("queue")
    assert kai.loc["nlp-h100", "status"] == "matches" and pd.isna(kai.loc["nlp", "gpu_model"])
    assert kai.loc["default-queue", "status"] == "unlimited"
    assert kai.loc["vision", "status"] == "not_in_scheduler"
    # nothing read: no rows, never a quota of zero
    assert compare_with_scheduler(Store(tmp_path / "e.duckdb"), _plan(), at).empty


def test_workload_classes_from_labels_else_names_else_unclassified_with_the_rule():
    batch = parse_kube_state(ksm_page(FINAL), "team", class_label="gpuledger.io/class")
    classes = dict(zip(batch.jobs["job_id"], zip(batch.jobs["workload_class"], batch.jobs["class_rule"])))
    assert classes["vision/serve-7d9f-abcde"] == ("online_inference", "label gpuledger.io/class=inference")
    assert classes["nlp/bert-worker-0"] == ("training", "name 'PyTorchJob/bert': a training operator's pod")
    assert classes["vision/oom-0"][0] == UNCLASSIFIED  # Job/resize says nothing: not guessed
    assert set(batch.jobs["workload_class"]) <= set(WORKLOAD_CLASSES) | {UNCLASSIFIED}
    assert infer_class("bash")[0] == "interactive"
    assert infer_class("job.sh")[0] == UNCLASSIFIED
    assert infer_class("observer")[0] == UNCLASSIFIED  # "serve" inside a word is not a server
    assert infer_class("Deployment/llama-70b")[0] == "online_inference"
    assert infer_class("finetune-lora")[0] == "fine_tuning" and infer_class("agent-rollout")[0] == "agentic"
    assert infer_class("eval-sweep")[0] == "batch_inference"
    assert infer_class("x", partition="interactive") == ("interactive", "partition interactive")
    assert infer_class("x", priority_class="Serving") == ("online_inference", "priority class Serving")
    # an annotation gives the class where the label does not; an unknown value is counted, not used
    annotated = ksm_page(FINAL).replace('label_gpuledger_io_class="inference"', 'label_x="1"') + (
        'kube_pod_annotations{namespace="vision",pod="oom-0",annotation_gpuledger_io_class="notebook"} 1\n'
        'kube_pod_annotations{namespace="vision",pod="evicted-0",annotation_gpuledger_io_class="frobnicate"} 1\n')
    other = parse_kube_state(annotated, "team", class_label="gpuledger.io/class")
    again = dict(zip(other.jobs["job_id"], other.jobs["workload_class"]))
    assert again["vision/oom-0"] == "interactive" and again["vision/serve-7d9f-abcde"] == "online_inference"
    assert other.skipped["unknown_class_label"] == 1


def test_cost_efficiency_and_waste_per_class_and_telemetry_places_jobs_without_a_record(tmp_path):
    from gpuledger.analytics.workload_classes import class_usage, job_classes
    from tests.helpers import T0, gpu_rows, table
    store = Store(tmp_path / "w.duckdb")
    store.set_rates(Config().rates)
    busy = [r for g in range(4) for r in gpu_rows("n1", g, "H100", 120, util=90.0, job="ml/gang", team="ml")]
    bursty = gpu_rows("n2", 0, "H100", 120, util=[60.0 if i % 10 == 0 else 0.0 for i in range(120)],
                      job="ml/nb", team="ml")
    unknown = gpu_rows("n2", 1, "H100", 120, util=None, job="ml/blind", team="ml")
    named = gpu_rows("n2", 2, "H100", 120, util=30.0, job="ml/serve", team="ml")
    store.append_samples(table(busy, bursty, unknown, named))
    store.upsert_jobs(pd.DataFrame([{"job_id": "ml/serve", "team": "ml", "gpus": 1, "name": "vllm-serve",
                                     "state": "running", "submit_ts": T0, "start_ts": T0}]))
    store.fold()
    end = T0 + timedelta(hours=2)
    jobs = job_classes(store, T0, end).set_index("job_id")
    assert jobs.loc["ml/gang", "workload_class"] == "training" and "4 GPUs busy" in jobs.loc["ml/gang", "class_rule"]
    assert jobs.loc["ml/nb", "workload_class"] == "interactive"
    assert jobs.loc["ml/blind", "workload_class"] == UNCLASSIFIED  # no readings: not guessed
    assert jobs.loc["ml/serve", "class_rule"].startswith("name 'vllm-serve'")
    usage = class_usage(store, T0, end).set_index("workload_class")
    assert usage.loc["training", "gpu_hours"] == pytest.approx(8.0)
    assert usage.loc["training", "efficiency"] == pytest.approx(0.9)
    assert usage.loc["training", "cost_usd"] == pytest.approx(8.0 * Config().rates["H100"])
    assert usage.loc["interactive", "idle_gpu_hours"] == pytest.approx(1.8)
    assert pd.isna(usage.loc[UNCLASSIFIED, "efficiency"])  # unmeasured: null, not zero
    assert usage["placed_by_telemetry"].sum() == 2
    # every billed job is in a class: 4 + 1 + 1 + 1 GPUs for 2 hours
    assert usage["cost_usd"].sum() == pytest.approx(14.0 * Config().rates["H100"])


def test_gang_jobs_waiting_are_counted_once_with_all_their_gpus(tmp_path):
    store = Store(tmp_path / "g.duckdb")
    batch = parse_kube_state(ksm_page(0), "team")
    store.record_jobs(batch.jobs, batch.events)
    at = datetime.fromtimestamp(1_790_000_000 + 600, UTC)
    rows = workload_summary(store, at - timedelta(days=1), at, at).set_index("team")
    # the 2-pod PyTorchJob (4 + 4 GPUs) is one gang; gone-0 asks 8 GPUs on its own: a gang of one job
    assert rows.loc["nlp", "pending_jobs"] == 3 and rows.loc["nlp", "gang_jobs_waiting"] == 2
    assert rows.loc["nlp", "gang_gpus_waiting"] == 16
    assert rows.loc["vision", "gang_jobs_waiting"] == 0
    by_class = workload_summary(store, at - timedelta(days=1), at, at, by=("workload_class",))
    assert set(by_class["workload_class"]) == {"training", UNCLASSIFIED, "online_inference"}
    with pytest.raises(ValueError):
        workload_summary(store, at, at, at, by=("node",))


def test_the_api_serves_queues_and_classes(tmp_path):
    store = Store(tmp_path / "a.duckdb")
    now = datetime.now(UTC)
    store.record_queue_metrics(parse_kueue(kueue_page(3), now - timedelta(minutes=5)).rows)
    store.record_queue_metrics(parse_kai(kai_page(3), now - timedelta(minutes=5)).rows)
    batch = parse_kube_state(ksm_page(2), "team")
    store.record_jobs(batch.jobs, batch.events)
    store.upsert_teams(pd.DataFrame({"team": ["nlp", "vision"], "share": [1.0, 1.0], "quota_gpus": [8, 4]}))
    client = TestClient(create_app(store, Config(), open_reads=True))
    answer = client.get("/v1/workloads/queues")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert {q["scheduler"] for q in body["queues"]} == {"kueue", "kai"}
    assert {w["queue"] for w in body["admission_waits"]} == {"nlp", "vision"}
    work = client.get("/v1/workloads", params={"days": 300})
    assert work.status_code == 200, work.text
    assert {row["workload_class"] for row in work.json()["by_class"]} >= {"training", "online_inference"}
    assert {job["workload_class"] for job in work.json()["waiting_now"]} == {"training", UNCLASSIFIED}
    assert work.json()["class_usage"] == []  # no telemetry in this store: nothing billed, nothing made up


def test_import_kueue_and_kai_pages(tmp_path, capsys):
    from gpuledger.deploy.cli import main
    db = tmp_path / "i.duckdb"
    (tmp_path / "kueue.txt").write_text(kueue_page(2))
    (tmp_path / "kai.txt").write_text(kai_page(2))
    assert main(["import", "kueue", str(tmp_path / "kueue.txt"), "--db", str(db)]) == 0
    assert "2 queue(s)" in capsys.readouterr().out
    assert main(["import", "kai", str(tmp_path / "kai.txt"), "--db", str(db)]) == 0
    (tmp_path / "other.txt").write_text("node_load1 0.5\n")
    assert main(["import", "kueue", str(tmp_path / "other.txt"), "--db", str(db)]) == 2
    assert "no kueue queue figures" in capsys.readouterr().err
    with Store(db) as store:
        assert set(scheduler_queues(store, datetime.now(UTC))["scheduler"]) == {"kueue", "kai"}


def _figures(rows: pd.DataFrame) -> list[tuple]:
    """Queue rows as comparable tuples (a missing flavor or detail as '', a missing value as -1)."""
    def text(value) -> str:
        return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)
    return sorted((r.queue, text(r.flavor), r.figure, text(r.detail), -1.0 if pd.isna(r.value) else float(r.value))
                  for r in rows.itertuples())


class ChangingSchedulerPages:
    """Serves /ksm, /kueue and /kai, each a step further on every scrape (up to FINAL), remembering the last page
    of each path."""

    PAGES = {"/ksm": ksm_page, "/kueue": kueue_page, "/kai": kai_page}

    def __init__(self) -> None:
        self.steps = {path: 0 for path in self.PAGES}
        self.last: dict[str, str] = {}
        self.lock = threading.Lock()
        self.server, self.target = serve_pages(self._answer)

    def _answer(self, path: str) -> tuple[int, str]:
        """The next step of the page at `path` (404 for any other path)."""
        with self.lock:
            make = self.PAGES.get(path)
            if make is None:
                return 404, "not found\n"
            body = make(self.steps[path])
            self.last[path] = body
            self.steps[path] += 1
        return 200, body

    def settled(self) -> bool:
        with self.lock:
            return all(step > FINAL + 2 for step in self.steps.values())

    def close(self) -> None:
        self.server.shutdown()


@pytest.mark.skipif(not Path(BINARY).exists() and not os.environ.get("CI"),
                    reason="needs Debian's prometheus (.ci/run installs it)")
def test_prometheus_gives_the_jobs_and_queues_the_pages_give(tmp_path):
    """Kube-state-metrics, Kueue and KAI pages change on every scrape of the real Prometheus; gpuledger reads
    Prometheus while they change, as `serve --jobs-from prometheus` does, and ends with the jobs (states, waits,
    restarts, outcomes, classes) and queue figures that reading the final pages directly gives; the pod deleted
    while it waited is no longer waiting."""
    pages = ChangingSchedulerPages()
    prometheus = PrometheusServer({"ksm": (pages.target, "/ksm"), "kueue": (pages.target, "/kueue"),
                                   "kai": (pages.target, "/kai")}).start()
    store = Store(tmp_path / "p.duckdb")
    try:
        loop = JobLoop(PrometheusLifecycle(prometheus.url, "team", since=timedelta(minutes=10),
                                           class_label="gpuledger.io/class"), store)
        saw_pending_gang = False
        deadline = time.monotonic() + 90
        while not pages.settled():
            assert time.monotonic() < deadline, f"Prometheus scraped too few pages: {pages.steps}"
            loop.read_once()
            states = store.query("SELECT job_id, state FROM jobs")
            saw_pending_gang |= bool(((states["job_id"] == "nlp/bert-worker-0") & (states["state"] == "pending")).any())
            time.sleep(0.7)
        time.sleep(2.5)  # Prometheus holds the final pages' scrapes
        stored = loop.read_once()
        assert stored["jobs"] >= 5
        assert saw_pending_gang  # read while the gang still waited
        direct = parse_kube_state(pages.last["/ksm"], "team", class_label="gpuledger.io/class").jobs
        got = store.query("SELECT * FROM jobs WHERE job_id <> 'nlp/gone-0' ORDER BY job_id")[JOB_FIELDS]
        want = direct.sort_values("job_id")[JOB_FIELDS]
        pd.testing.assert_frame_equal(got.reset_index(drop=True).astype(object).where(got.notna().values, None),
                                      want.reset_index(drop=True).astype(object).where(want.notna().values, None),
                                      check_dtype=False)
        assert set(got["state"]) == {"completed", "out_of_memory", "running", "preempted"}
        gone = store.query("SELECT state FROM jobs WHERE job_id = 'nlp/gone-0'")
        assert gone["state"].item() == "left_queue"  # deleted while pending: not queued demand any more
        # the queues: the last read holds exactly the final pages' figures
        at = datetime.now(UTC)
        for scheduler, parse, path in (("kueue", parse_kueue, "/kueue"), ("kai", parse_kai, "/kai")):
            last = store.query("SELECT queue, coalesce(flavor, '') AS flavor, figure, coalesce(detail, '') AS detail, "
                               "value FROM queue_metrics WHERE scheduler = $s AND ts = (SELECT max(ts) FROM "
                               "queue_metrics WHERE scheduler = $s)", {"s": scheduler})
            page = parse(pages.last[path], at).rows
            assert _figures(last) == _figures(page), scheduler
        assert store.query("SELECT count(DISTINCT ts) AS n FROM queue_metrics")["n"].item() >= 4  # a history
        # the nodes' labels, from kube_node_labels, put each node in its pool for pricing
        store.set_rates({}, pools=[(None, None, "label_cloud_google_com_gke_nodepool")])
        pools = dict(store.node_pools()[["node", "pool"]].itertuples(index=False))
        assert pools == {"gpu-a-1": "a3-spot", "gpu-b-1": "a3-reserved"}
        # restarts seen growing between reads have a time; the events read off the pod's instants are still there
        events = store.query("SELECT event, count(*) AS n FROM job_events WHERE job_id = 'vision/serve-7d9f-abcde' "
                             "GROUP BY event")
        counts = dict(zip(events["event"], events["n"]))
        assert 1 <= counts.get("restarted", 0) <= FINAL // 2 and counts["started"] == 1 and counts["submitted"] == 1
        # /healthz says how the reads go; a Prometheus asked before it had any of the series says what it lacks
        app = create_app(store, Config(), open_reads=True)
        app.state.job_source = loop
        health = TestClient(app).get("/healthz").json()["job_source"]
        assert health["reads"] >= 3 and health["missing"] == [] and health["last_error"] is None
        early = JobLoop(PrometheusLifecycle(prometheus.url, "team", since=timedelta(seconds=5),
                                            clock=lambda: datetime(2020, 1, 1, tzinfo=UTC)), Store(tmp_path / "e.db"))
        assert early.read_once()["jobs"] == 0
        assert [m.split(" ")[0] for m in early.state()["missing"]] == ["kube-state-metrics", "Kueue"]
    finally:
        prometheus.stop()
        pages.close()
        store.close()


def test_a_held_job_is_listed_as_waiting_but_is_no_demand_and_no_room_is_made_for_it(tmp_path):
    from gpuledger.analytics.usage import pending_jobs
    from gpuledger.analytics.workloads import waiting_demand, waiting_now
    from gpuledger.collector.jobs.lifecycle import events_of, jobs_frame
    store = Store(tmp_path / "h.duckdb")
    at = datetime(2026, 12, 1, 12, tzinfo=UTC)
    jobs = jobs_frame([
        {"job_id": f"slurm:{i}", "team": "nlp", "gpus": 4, "submit_ts": at - timedelta(hours=2), "state": "pending",
         "pending_reason": reason, "source": "slurm", "name": "train"}
        for i, reason in enumerate(["Resources", "BeginTime", "Dependency", None])])
    store.record_jobs(jobs, events_of(jobs))
    demand = waiting_demand(store, at - timedelta(days=1), at, at)
    assert demand["jobs_waited"].sum() == 2 and demand["waiting_gpu_hours"].sum() == pytest.approx(16.0)
    assert set(pending_jobs(store, at)["job_id"]) == {"slurm:0", "slurm:3"}
    assert len(waiting_now(store, at)) == 4  # still shown, with the scheduler's reason


def test_where_scheduler_records_and_telemetry_disagree_is_counted_and_named(tmp_path):
    from gpuledger.analytics.workloads import scheduler_coverage
    from gpuledger.collector.jobs.lifecycle import events_of, jobs_frame
    from tests.helpers import T0, gpu_rows, table
    store = Store(tmp_path / "d.duckdb")
    store.append_samples(table(gpu_rows("n1", 0, "H100", 120, util=50.0, job="ml/a", team="ml"),
                               gpu_rows("n1", 1, "H100", 120, util=50.0, job="ml/stray", team="ml")))
    store.fold()
    at = T0 + timedelta(hours=2)
    jobs = jobs_frame([
        {"job_id": "ml/a", "team": "ml", "gpus": 1, "state": "running", "start_ts": T0, "source": "kubernetes"},
        {"job_id": "ml/b", "team": "ml", "gpus": 2, "state": "running", "start_ts": T0, "source": "kubernetes"},
        {"job_id": "slurm:9", "team": "ml", "gpus": 4, "state": "completed", "start_ts": T0,
         "end_ts": T0 + timedelta(hours=1), "source": "slurm"},
        {"job_id": "slurm:10", "team": "ml", "gpus": 4, "state": "failed", "start_ts": T0,
         "end_ts": T0 + timedelta(minutes=2), "source": "slurm"}])  # too short to expect a sample
    store.record_jobs(jobs, events_of(jobs))
    seen = scheduler_coverage(store, T0, at, at)
    assert seen["running_without_samples"] == {"count": 1, "by_source": {"kubernetes": 1}, "examples": ["ml/b"]}
    assert seen["ended_without_samples"]["examples"] == ["slurm:9"]
    assert seen["samples_without_record"]["examples"] == ["ml/stray"]
    assert seen["samples_without_record"]["gpu_hours"] == pytest.approx(2.0)
    answer = TestClient(create_app(store, Config(), open_reads=True)).get(
        "/v1/workloads/coverage", params={"end": at.isoformat(), "days": 1})
    assert answer.status_code == 200 and answer.json()["ended_without_samples"]["count"] == 1


def test_restarts_seen_growing_between_reads_become_events(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    first, later = parse_kube_state(ksm_page(2), "team"), parse_kube_state(ksm_page(6), "team")
    t1, t2 = datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 1, 0, 5, tzinfo=UTC)
    assert store.record_restarts(first.jobs, t1, "kubernetes") == 0  # nothing stored yet: no growth seen
    store.record_jobs(first.jobs, first.events)
    grown = store.record_restarts(later.jobs, t2, "kubernetes")
    store.record_jobs(later.jobs, later.events)
    # serve: 1 -> 3 restarts, oom: 2 -> 4, the gang's pods: 0 -> 1 each
    assert grown == 2 + 2 + 1 + 1
    events = store.query("SELECT job_id, ts FROM job_events WHERE event = 'restarted'")
    assert len(events) == grown and set(pd.to_datetime(events["ts"], utc=True)) == {pd.Timestamp(t2)}


def test_records_no_scheduler_could_give_are_dropped_or_blanked_and_counted(tmp_path, capsys):
    from gpuledger.collector.jobs.sacct import parse_sacct
    from gpuledger.deploy.cli import main
    header = "JobID|State|Submit|Start|End|Account|AllocTRES|ReqTRES|Restarts\n"
    text = header + "\n".join([
        "1|COMPLETED|2026-12-01T10:00:00|2026-12-01T09:00:00|2026-12-01T11:00:00|a|gres/gpu=2||0",  # start < submit
        "2|COMPLETED|garbage|garbage|garbage|a|gres/gpu=1||0",
        "3|PENDING|2026-12-01T10:00:00|Unknown|Unknown|a||gres/gpu=99999999999|0",
        "4|PENDING|2026-12-01T10:00:00|Unknown|Unknown|a||gres/gpu=-3|0",
        "5|COMPLETED|2027-12-01T10:00:00|2027-12-01T10:00:00|2027-12-01T11:00:00|a|gres/gpu=1||0"])
    batch = parse_sacct(text)
    jobs = batch.jobs.set_index("job_id")
    assert set(jobs.index) == {"slurm:1", "slurm:2", "slurm:5"}
    assert batch.skipped["bad_gpus"] == 2 and batch.skipped["start_before_submit"] == 1
    assert pd.isna(jobs.loc["slurm:1", "submit_ts"])  # the wait is unknown, never -60 minutes
    assert batch.skipped["bad_time"] == 3 and batch.skipped["future_time"] == 3
    page = ksm_page(FINAL).replace('resource="nvidia_com_gpu",unit="integer"} 2', 'resource="nvidia_com_gpu",'
                                   'unit="integer"} 1e12').replace(
        'kube_pod_container_status_restarts_total{namespace="vision",pod="oom-0"', 'x{a="')
    pods = parse_kube_state(page, "team")
    assert "vision/serve-7d9f-abcde" not in set(pods.jobs["job_id"]) and pods.skipped["bad_gpus"] == 1
    queue = parse_kueue(kueue_page(3).replace('flavor="h100",resource="nvidia.com/gpu"} 8',
                                              'flavor="h100",resource="nvidia.com/gpu"} -5')
                        .replace('le="1"}', 'le="bogus"}'), datetime(2026, 12, 1, tzinfo=UTC))
    assert queue.skipped["bad_value"] == 4  # nlp's quota and usage (both 8 at step 3), both bogus buckets
    assert (queue.rows["value"].dropna() >= 0).all()
    db = tmp_path / "k.duckdb"
    (tmp_path / "junk.txt").write_text("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 5\n")
    assert main(["import", "kube-state", str(tmp_path / "junk.txt"), "--db", str(db)]) == 2
    assert "no kube-state-metrics pod series" in capsys.readouterr().err
    assert main(["import", "sacct", str(tmp_path), "--db", str(db)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert not db.exists()  # a refused import creates no store


def test_healthz_is_degraded_while_job_lifecycle_reads_keep_failing(tmp_path):
    from tests.procs import free_port
    store = Store(tmp_path / "f.duckdb")
    loop = JobLoop(PrometheusLifecycle(f"http://127.0.0.1:{free_port()}", timeout_s=1), store, interval_s=0.05)
    app = create_app(store, Config(), open_reads=True)
    app.state.job_source = loop
    client = TestClient(app)
    assert client.get("/healthz").json()["status"] == "ok"  # nothing tried yet
    loop.start()
    try:
        deadline = time.monotonic() + 20
        while not (loop.failures >= 2 and time.monotonic() - loop.started_at > 0.2):
            assert time.monotonic() < deadline, "the reads never failed"
            time.sleep(0.05)
        health = client.get("/healthz").json()
        assert health["status"] == "degraded" and "no job lifecycle read" in health["reason"]
        assert health["job_source"]["failures"] >= 2 and "cannot query Prometheus" in health["job_source"]["last_error"]
    finally:
        loop.stop()
        loop.join(timeout=5)
