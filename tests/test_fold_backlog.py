"""A server that is catching up never stops answering (issue 26): a backlog is folded in bounded steps off the
request path, liveness and readiness are separate, and a kill -9 in the middle of the catch-up loses nothing."""
from __future__ import annotations

import shutil
import time
from datetime import timedelta

import pytest
import requests

from gpuledger.analytics.cost import cost_by_team
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.database import CATCH_UP_LAG, FOLD_STEP_S
from gpuledger.analytics.windows import utc_now
from tests.backlog import backlog_store
from tests.procs import Server, wait_until

ANSWER_S = 1.0  # the bound: /healthz and a cost read answer within a second throughout the catch-up


def bill(store: Store, start, end) -> dict[str, float]:
    """Cost per bill line to the cent."""
    frame = cost_by_team(store, start, end)
    return {team: round(cost, 2) for team, cost in zip(frame["team"], frame["cost_usd"])}


def timed_get(url: str, **params) -> tuple[int, float, dict]:
    began = time.monotonic()
    answer = requests.get(url, params=params, timeout=10)
    return answer.status_code, time.monotonic() - began, answer.json()


def test_a_bounded_fold_commits_step_by_step_and_resumes(tmp_path):
    """fold(budget_s) stops after the step that passes the budget with the watermark where that step left it;
    fold_if_due goes on at once while behind, and the result equals one uninterrupted fold."""
    end = utc_now() - timedelta(minutes=5)
    backlog_store(tmp_path / "a.duckdb", end, days=2, nodes=4)
    shutil.copy(tmp_path / "a.duckdb", tmp_path / "b.duckdb")
    with Store(tmp_path / "a.duckdb") as whole:
        whole.fold()
        want = bill(whole, end - timedelta(days=3), end + timedelta(hours=1))
        assert not whole.fold_behind and not whole.catching_up()
    with Store(tmp_path / "b.duckdb") as stepped:
        stepped.note_backlog()
        assert stepped.fold_behind and stepped.catching_up()  # two days behind
        marks = []
        while stepped.fold_behind:
            stepped.fold(budget_s=0.0)  # one step per call
            marks.append(stepped.fold_lag()[0])
        assert len(marks) > 2 and marks == sorted(marks)
        assert stepped.fold_lag()[1] < CATCH_UP_LAG and not stepped.catching_up()
        assert bill(stepped, end - timedelta(days=3), end + timedelta(hours=1)) == want
        assert stepped.sample_count() == stepped.query("SELECT count(*) AS n FROM samples")["n"].iloc[0]


def test_kill_9_in_the_middle_of_a_catch_up_keeps_answering_and_loses_nothing(tmp_path):
    end = utc_now() - timedelta(minutes=5)
    rows = backlog_store(tmp_path / "central.duckdb", end, days=4)
    shutil.copy(tmp_path / "central.duckdb", tmp_path / "reference.duckdb")
    server = Server(tmp_path).start()
    statuses: list[int] = []
    slowest = 0.0

    def probe() -> dict:
        nonlocal slowest
        for path, params in (("/healthz", {}), ("/v1/costs", {"days": 7})):
            status, took, body = timed_get(server.url + path, **params)
            slowest = max(slowest, took)
            if path == "/healthz":
                health = body
            else:
                statuses.append(status)
        assert requests.get(server.url + "/livez", timeout=10).json() == {"status": "ok"}
        return health

    try:
        # a step committed and the fold still far behind: the moment to pull the plug
        seen = wait_until(lambda: (h := probe())["folded_until"] and h["catching_up"] and h, 60,
                          "a first fold step while catching up", step_s=0.05)
        ready = requests.get(server.url + "/readyz", timeout=10)
        assert ready.status_code == 503 and ready.headers["Retry-After"] and not ready.json()["ready"]
        server.proc.kill9()
        server.start()
        after = probe()
        assert after["folded_until"] >= seen["folded_until"]  # the committed steps stayed
        wait_until(lambda: not probe()["catching_up"], 180, "the catch-up to end", step_s=0.2)
        assert requests.get(server.url + "/readyz", timeout=10).json()["ready"]
        status, _, costs = timed_get(server.url + "/v1/costs", days=7)
        assert status == 200 and costs["total_usd"] > 0
        metrics = requests.get(server.url + "/metrics", timeout=10,
                               headers={"Authorization": "Bearer test-token-123"}).text
        assert "gpuledger_rollup_behind_seconds" in metrics and "gpuledger_rollup_fold_minutes_per_second" in metrics
    finally:
        server.proc.stop()
    assert 503 in statuses  # refused at once while catching up, not scanned for minutes
    assert slowest < ANSWER_S, f"slowest answer during the catch-up: {slowest:.2f} s"
    log = server.proc.text()
    assert "folding a backlog" in log
    window = (end - timedelta(days=5), end + timedelta(hours=1))
    with Store(tmp_path / "reference.duckdb") as reference:
        reference.fold()
        want = bill(reference, *window)
    with Store(tmp_path / "central.duckdb") as central:
        assert central.sample_count() == rows
        assert bill(central, *window) == want  # to the cent, as one uninterrupted fold
    assert FOLD_STEP_S <= ANSWER_S


@pytest.mark.parametrize("path", ["/livez", "/readyz", "/healthz"])
def test_probes_need_no_token_and_say_what_they_check(tmp_path, path):
    from fastapi.testclient import TestClient

    from gpuledger.analytics.config import Config
    from gpuledger.deploy.api import create_app

    with Store(tmp_path / "s.duckdb") as store, TestClient(create_app(store, Config(), token="t")) as client:
        answer = client.get(path)
        assert answer.status_code == 200, answer.text
        if path == "/readyz":
            assert answer.json()["ready"] is True


def test_the_manifest_probes_liveness_and_readiness_apart():
    """Liveness on /healthz restarted a server folding a backlog before its fold committed, in a loop."""
    from pathlib import Path

    import yaml

    manifest = Path(__file__).parent.parent / "deploy" / "kubernetes" / "base" / "server.yaml"
    containers = [c for doc in yaml.safe_load_all(manifest.read_text()) if doc and doc.get("kind") == "Deployment"
                  for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "server"]
    assert len(containers) == 1
    for container in containers:
        assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
