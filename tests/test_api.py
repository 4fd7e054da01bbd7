"""The real API server (uvicorn on 127.0.0.1) over a real DuckDB file of simulated history."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client import generate_latest

from gpuledger.analytics.store.metrics import REGISTRY as STORE_METRICS
from gpuledger.collector.metrics import REGISTRY as COLLECTOR_METRICS
from gpuledger.collector.metrics import exported as exported_by
from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED
from gpuledger.deploy.api.live_metrics import StoreGauges
from gpuledger.deploy.server import ApiServer
from tests.conftest import SIM_END, SITE
from tests.procs import TOKEN


def get(url: str, path: str, **params):
    response = requests.get(url + path, params=params, timeout=60)
    return response


def test_health_docs_and_metrics(api_url):
    health = get(api_url, "/healthz").json()
    assert health["status"] == "ok" and health["samples"] == 48 * 12 * 24 * 3
    assert get(api_url, "/docs").status_code == 200
    spec = get(api_url, "/openapi.json").json()
    assert {"/v1/recommendations", "/v1/teams/{team}/usage", "/v1/costs"} <= set(spec["paths"])
    metrics = get(api_url, "/metrics").text
    assert "gpuledger_ingest_rows_total" in metrics and "gpuledger_collector_samples_read_total" in metrics
    assert "gpuledger_agent_" not in metrics  # a server exports the parts it runs, not an agent's series


def test_docs_describe_every_answer(api_url):
    """Every JSON endpoint has a response model and a description, so /docs documents each field."""
    spec = get(api_url, "/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            assert operation.get("description"), f"{method} {path} has no docstring"
            content = next(r for code, r in operation["responses"].items() if code.startswith("2"))["content"]
            if "application/json" not in content:
                continue
            shown = str(content["application/json"]["schema"])
            assert "$ref" in shown, f"{method} {path} has no response model"
    for name in ("Costs", "Waste", "Recommendations", "TeamUsage", "NodeStatus", "BatchAnswer"):
        fields = schemas[name]["properties"]
        assert fields and all("type" in f or "$ref" in f or "anyOf" in f or "items" in f
                              for f in fields.values()), name
    assert schemas["TeamCost"]["properties"]["unpriced_gpu_hours"]["description"]


def test_team_usage_agrees_with_costs(api_url):
    teams = {t["team"] for t in get(api_url, "/v1/teams").json()}
    assert {"nlp", "vision", UNATTRIBUTED} <= teams
    costs = get(api_url, "/v1/costs", days=3, end=SIM_END.isoformat()).json()
    by_team = {row["team"]: row for row in costs["teams"]}
    usage = get(api_url, "/v1/teams/nlp/usage", days=3, end=SIM_END.isoformat()).json()
    assert usage["totals"]["allocated_gpu_hours"] == pytest.approx(by_team["nlp"]["gpu_hours"])
    assert usage["totals"]["cost_usd"] == pytest.approx(by_team["nlp"]["cost_usd"])
    assert 0 < usage["totals"]["efficiency"] <= 1 and usage["series"]
    assert costs["total_usd"] == pytest.approx(sum(r["cost_usd"] for r in costs["teams"]))
    assert IDLE_CAPACITY in by_team


def test_bad_input_gets_clear_4xx(api_url):
    missing = get(api_url, "/v1/teams/no-such-team/usage")
    assert missing.status_code == 404 and "unknown team" in missing.json()["detail"]
    assert get(api_url, "/v1/costs", days=0).status_code == 422
    assert get(api_url, "/v1/recommendations", kind="delete-everything").status_code == 422
    assert get(api_url, "/v1/cluster/utilization", end="yesterday-ish").status_code == 422


def test_recommendations_for_schedulers(api_url):
    body = get(api_url, "/v1/recommendations").json()
    recs = body["recommendations"]
    assert recs and {r["kind"] for r in recs} <= {"quota", "reclaim", "resize", "efficiency"}  # the sim has starved jobs
    assert {r["status"] for r in recs} <= {"proposed", "accepted", "insufficient_data", "held_back"}
    for rec in recs:
        assert rec["id"] and rec["reason"] and isinstance(rec["evidence"], dict)
    quota = [r for r in recs if r["kind"] == "quota" and r["status"] == "proposed"]
    assert quota and all({"guarantee_gpus", "limit_gpus"} <= set(r["action"]) and r["gpu_model"] for r in quota)
    assert all("effect_gpu_hours_per_week" in r["evidence"] for r in quota)
    # guarantees of one model never add up to more than the GPUs of that model
    for model in {r["gpu_model"] for r in quota}:
        mine = [r for r in quota if r["gpu_model"] == model]
        assert sum(r["action"]["guarantee_gpus"] for r in mine) <= mine[0]["evidence"]["capacity_gpus"]
    again = get(api_url, "/v1/recommendations", kind="quota").json()["recommendations"]
    assert {r["id"] for r in again if r["status"] == "proposed"} == {r["id"] for r in quota}  # stored, stable
    history = get(api_url, "/v1/recommendations/history", limit=1000).json()
    assert {r["id"] for r in quota} <= {r["id"] for r in history}


def test_a_window_without_samples_gets_reasons_not_cuts(api_url):
    body = get(api_url, "/v1/recommendations", end="2030-01-01T00:00:00Z").json()
    recs = body["recommendations"]
    assert recs and {r["status"] for r in recs} == {"insufficient_data"}
    assert all(r["action"] == {} and "not enough data" in r["reason"] for r in recs)


def test_the_view_window_does_not_change_the_advice(api_url):
    views = [get(api_url, "/v1/recommendations", end=SIM_END.isoformat()).json()["recommendations"] for _ in (1, 2)]
    assert views[0] and views[0] == views[1]
    # the dashboard's view window is no parameter of advice: a `days` is refused, naming it, never read as a filter
    windowed = get(api_url, "/v1/recommendations", days=7, end=SIM_END.isoformat())
    assert windowed.status_code == 422 and "days" in windowed.json()["detail"]
    fair = [get(api_url, "/v1/fairshare", days=days, end=SIM_END.isoformat()).json()["history"] for days in (1, 3)]
    short = {(r["hour"], r["team"]): r["fairshare"] for r in fair[0]}
    long = {(r["hour"], r["team"]): r["fairshare"] for r in fair[1]}
    assert short and set(short) < set(long) and all(short[k] == pytest.approx(long[k]) for k in short)


def test_decisions_need_the_admin_token_and_are_kept(sim_store, tmp_path):
    server = ApiServer(sim_store, SITE, port=0, token=TOKEN, open_reads=True)
    url = server.start()
    try:
        rec = next(r for r in get(url, "/v1/recommendations").json()["recommendations"] if r["status"] == "proposed")
        path = f"{url}/v1/recommendations/{rec['id']}/decision"
        body = {"decision": "accept", "by": "alice", "note": "reviewed with the team"}
        assert requests.post(path, json=body, timeout=30).status_code == 401
        assert requests.post(path, json={"decision": "maybe", "by": "alice"}, timeout=30,
                             headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 422
        done = requests.post(path, json=body, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"})
        assert done.status_code == 200 and done.json()["status"] == "accepted" and done.json()["decided_by"] == "alice"
        again = requests.post(path, json={"decision": "accept", "by": "bob"}, timeout=30,
                              headers={"Authorization": f"Bearer {TOKEN}"})
        assert again.status_code == 409 and "cannot become accepted" in again.json()["detail"]
        missing = requests.post(f"{url}/v1/recommendations/nope/decision", json=body, timeout=30,
                                headers={"Authorization": f"Bearer {TOKEN}"})
        assert missing.status_code == 404
        kept = get(url, "/v1/recommendations/history", status="accepted").json()
        assert any(r["id"] == rec["id"] and r["note"] == "reviewed with the team" for r in kept)
    finally:
        server.stop()


def test_waste_fairshare_and_utilization(api_url):
    waste = get(api_url, "/v1/waste", days=3, end=SIM_END.isoformat()).json()
    assert waste["idle_runs"] and waste["oversized_jobs"] and waste["by_team"]
    assert all(run["idle_minutes"] >= waste["thresholds"]["idle_minutes"] for run in waste["idle_runs"])
    fair = get(api_url, "/v1/fairshare", days=3, end=SIM_END.isoformat()).json()
    assert {row["team"] for row in fair["history"]} == {"vision", "nlp", "speech", "recsys", "research"}
    assert all(0 < row["fairshare"] <= 1 for row in fair["history"])
    util = get(api_url, "/v1/cluster/utilization", days=1, end=SIM_END.isoformat(), bucket_minutes=60).json()
    assert len(util) == 24 and all(row["total_gpus"] == pytest.approx(48) for row in util)
    assert all(0 <= row["used_gpus"] <= row["allocated_gpus"] <= 48 for row in util)


def test_exports_for_each_scheduler(api_url):
    # fill: an accepted cut elsewhere in this module may leave GPUs under no guarantee (refused without it, 422)
    kai = get(api_url, "/v1/recommendations/export", target="kai", fill="true")
    assert kai.status_code == 200 and kai.headers["content-type"].startswith("application/yaml"), kai.text
    queues = [o for o in yaml.safe_load_all(kai.text) if o]
    assert {q["kind"] for q in queues} == {"Queue"} and any("parentQueue" in q["spec"] for q in queues)
    slurm = get(api_url, "/v1/recommendations/export", target="slurm", format="json", fill="true").json()
    assert {r["account"] for r in slurm} >= {"vision", "nlp"} and all(r["fairshare"] >= 1 for r in slurm)
    assert get(api_url, "/v1/recommendations/export", target="yarn").status_code == 422


def test_docs_work_offline_and_the_root_leads_there(api_url):
    page = get(api_url, "/docs")
    assert page.status_code == 200 and "cdn.jsdelivr" not in page.text and "/static/swagger-ui/" in page.text
    assert get(api_url, "/static/swagger-ui/swagger-ui-bundle.js").status_code == 200
    root = requests.get(api_url + "/", timeout=10, allow_redirects=False)
    assert root.status_code in (302, 307) and root.headers["location"] == "/docs"


def test_grafana_dashboard_queries_only_metrics_the_server_exports(api_url, sim_store):
    dashboard = json.loads((Path(__file__).resolve().parents[1] / "deploy" / "grafana-dashboard.json").read_text())
    # the gauges describe the hour before "now"; pinned to the simulated history's end, so they have data
    # whatever the wall clock says when the suite runs
    text = generate_latest(exported_by(COLLECTOR_METRICS, STORE_METRICS,
                                       StoreGauges(sim_store, SITE, clock=lambda: SIM_END))).decode()
    assert "# TYPE gpuledger_team_allocated_gpus gauge" in get(api_url, "/metrics").text  # the server has them too
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"gpuledger_[a-z0-9_]+", target["expr"])}
    # every panel's series is on /metrics: declared at least (a family with no data yet, like the queues of a store
    # without job records, is declared with no series), and those the simulated cluster feeds have series
    assert queried and queried <= exported | declared, sorted(queried - exported - declared)
    fed = {"gpuledger_team_cost_usd_per_hour", "gpuledger_team_busy_gpus", "gpuledger_team_idle_gpus",
           "gpuledger_team_allocated_gpus", "gpuledger_team_fairshare", "gpuledger_node_gpus",
           "gpuledger_node_allocated_gpus", "gpuledger_node_busy_gpus", "gpuledger_cluster_fragmented_gpus"}
    assert fed <= exported, sorted(fed - exported)
    team = [line for line in text.splitlines() if line.startswith("gpuledger_team_")]
    assert any('team="__idle__"' in line for line in team) and any("gpuledger_team_fairshare{" in x for x in team)
    # and it covers what /metrics exports: every live family (budgets, queues, gangs, inference SLOs, profiling...)
    from gpuledger.deploy.api import live_metrics as live
    families = {name for specs in (live.TEAM_GAUGES, live.NODE_GAUGES, live.QUEUE_GAUGES, live.SERVICE_GAUGES,
                                   live.TEAM_INFERENCE_GAUGES, live.BUDGET_GAUGES) for _, name, _ in specs}
    families |= {name + ("_total" if kind == "counter" else "") for name, kind, _, _ in live.OTHER_FAMILIES}
    assert families <= queried, sorted(families - queried)


def test_gpu_heatmap_points_agree_with_the_raw_samples(api_url, sim_store):
    """Per GPU and hour: mean utilisation, peak memory and the hottest temperature, as the raw samples give them
    (the rollups keep the temperature since schema 8)."""
    body = get(api_url, "/v1/gpus", days=1, bucket_minutes=60, end=SIM_END.isoformat()).json()
    points = {(p["gpu_uuid"], p["bucket"][:13]): p for p in body["series"]}
    assert len(points) == 48 * 24 and len(body["holders"]) >= 48
    raw = sim_store.query("""SELECT gpu_uuid, strftime(date_trunc('hour', ts), '%Y-%m-%dT%H') AS hour,
                                    avg(util_pct) AS util, max(mem_used_mib) AS mem, max(temp_c) AS temp
                             FROM samples WHERE ts >= ? - INTERVAL 1 DAY AND ts < ? GROUP BY ALL""",
                          [SIM_END, SIM_END])
    assert len(raw) == len(points)
    for row in raw.itertuples():
        point = points[(row.gpu_uuid, row.hour)]
        assert point["util_pct"] == pytest.approx(row.util) and point["mem_used_mib"] == pytest.approx(row.mem)
        assert point["temp_c"] == pytest.approx(row.temp) and 20 < point["temp_c"] < 100
