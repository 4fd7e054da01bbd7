"""Generated clusters and histories run through every surface, with the invariants a finance team and a scheduler
rely on checked on each.

The other suites look at tidy data at one moment; these shapes are what a user meets: live samples arriving after
a backfill (instants with and without fractional seconds), a history without utilisation (an imported trace),
teams using GPU models they have no quota for, MIG slices beside whole GPUs, and an empty window. Each is served
in process through FastAPI's TestClient (the routes are the point, not the HTTP server) and every GET route of the
OpenAPI spec is called on it, every export target and format, every kind of advice, and the weekly report.

Invariants on every scenario:
- no route answers 500, and every 4xx says why;
- the bill adds up: the cost lines sum to the total, to the cent, for an admin and for a team token;
- no physical GPU is billed over 1.0 in any minute;
- no advice rests on a missing value (its evidence's numbers are all present);
- no export takes away a GPU model a team used in the policy window;
- placement advice that cannot all be done together shares one group id, and the savings total counts each group
  once (the most valuable set of it that can all be done);
- every quota change's simulated effect is backtested and calibrated, gains someone, and lengthens no team's p95 wait
  beyond [whatif]'s bound; POST /v1/whatif carries its backtest;
- every Kueue plan (open advice, filled) either covers each whole-GPU model's GPUs with nominal quota and gives
  every job shape of the window a queue that can start it, or is refused with the reason.
Bounded: each scenario is a few hours of a small cluster (the whole module runs in well under a minute).
"""
from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from gpuledger.analytics.config import Config, QuotaConfig
from gpuledger.analytics.report import write_weekly_report
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import Role, create_token
from gpuledger.analytics.windows import iso_week, utc_now
from gpuledger.collector.simulator import SimulatorSource, default_simulator
from gpuledger.deploy.api import create_app
from gpuledger.policies.emitters import TARGETS
from gpuledger.policies.exporting import FORMATS
from gpuledger.policies.exporting import STATUSES as EXPORT_STATUSES
from gpuledger.analytics.plan_inputs import job_shapes
from gpuledger.collector.samples import UNATTRIBUTED
from gpuledger.policies.alternatives import CLAIMS, together
from gpuledger.policies.quota_plan import build_plan, k8s_name, peak_use
from gpuledger.policies.recommender import evaluate
from tests.helpers import gpu_rows, table

NOW = utc_now().replace(second=0, microsecond=0)
CONFIG = Config(quota=QuotaConfig(window_days=1))
# evidence keys that may be absent by meaning (nothing in force yet, no rate for the model, no fairshare state)
MAY_BE_ABSENT = {"current_guarantee_gpus", "current_limit_gpus", "current_from", "fairshare_factor",
                 "guarantee_usd_per_week", "effect_usd_per_week", "bounded_by"}


def _live_after_backfill(store: Store, seed: int) -> None:
    """The demo's cluster: a day of history folded into the rollups, then live collections at wall-clock instants
    (fractional seconds) on top, and the job records a scheduler would know now."""
    sim = default_simulator(days=1, seed=seed, now=NOW)
    store.upsert_teams(sim.team_frame())
    store.set_team_quotas(sim.quota_frame())
    for chunk in sim.history(NOW - timedelta(hours=8), NOW - timedelta(minutes=5), step_s=300.0):
        store.append_samples(chunk)
    store.fold()
    source = SimulatorSource(sim, interval_s=15.0)
    for _ in range(3):
        store.append_samples(source.collect())
    store.upsert_jobs(sim.jobs_frame(utc_now()))


def _hourly_rows(node: str, gpus: int, model: str, hours: float, **kw: Any) -> list[list[dict[str, Any]]]:
    start = NOW - timedelta(hours=hours)
    return [gpu_rows(node, g, model, int(hours * 60), step_s=300.0, start=start, **kw) for g in range(gpus)]


def _trace_without_utilisation(store: Store, seed: int) -> None:
    """An imported trace's shape: allocation and jobs, but no utilisation at all (Philly, Helios)."""
    store.upsert_teams(pd.DataFrame({"team": ["vc1", "vc2"], "share": [1.0, 2.0], "quota_gpus": [4, 4]}))
    rows = _hourly_rows("t1", 4, "V100", 6, util=None, job=f"vc1/{seed}", team="vc1", mem_total=32768.0)
    rows += _hourly_rows("t2", 2, "V100", 6, util=None, job="vc2/a", team="vc2", mem_total=32768.0)
    rows += _hourly_rows("t3", 2, "V100", 6, util=None, mem_total=32768.0)
    store.append_samples(table(*rows))


def _models_without_guarantees(store: Store, seed: int) -> None:
    """research runs on L40S with a quota only for H100; nlp over its limit on H100."""
    store.upsert_teams(pd.DataFrame({"team": ["research", "nlp"], "share": [1.0, 1.0], "quota_gpus": [2, 2]}))
    store.set_team_quotas(pd.DataFrame({"team": ["research", "nlp"], "gpu_model": ["H100", "H100"],
                                        "guarantee_gpus": [2.0, 2.0], "limit_gpus": [4.0, 2.0]}))
    rows = _hourly_rows("l", 3, "L40S", 6, util=70.0 + seed, job="research/x", team="research", mem_total=46068.0)
    rows += _hourly_rows("h", 4, "H100", 6, util=85.0, job="nlp/y", team="nlp")
    rows += _hourly_rows("h2", 4, "H100", 6, util=0.0)
    store.append_samples(table(*rows))


def _mixed_mig(store: Store, seed: int) -> None:
    """An A100 split into a 3g and a 1g slice (the rest of the card unpartitioned) beside whole H100s."""
    store.upsert_teams(pd.DataFrame({"team": ["inference", "train"], "share": [1.0, 1.0], "quota_gpus": [1, 2]}))
    rows = _hourly_rows("h", 2, "H100", 4, util=60.0, job="train/big", team="train")
    for instance, (profile, fraction) in enumerate((("3g.40gb", 3 / 7), ("1g.10gb", 1 / 7))):
        rows += [gpu_rows("a", 0, "A100-80GB", 240, step_s=300.0, start=NOW - timedelta(hours=4), util=30.0 + seed,
                          job=f"inference/{profile}", team="inference", mem_total=40960.0 * fraction * 7 / 3,
                          mig_profile=profile, mig_instance=instance, gpu_fraction=fraction)]
    store.append_samples(table(*rows))


def _empty(store: Store, seed: int) -> None:
    """A server that has received nothing yet."""


SCENARIOS: dict[str, Callable[[Store, int], None]] = {
    "live_after_backfill": _live_after_backfill,
    "trace_without_utilisation": _trace_without_utilisation,
    "models_without_guarantees": _models_without_guarantees,
    "mixed_mig": _mixed_mig,
    "empty": _empty,
}
CASES = [(name, seed) for name in SCENARIOS for seed in ((3, 11) if name == "live_after_backfill" else (5,))]


@pytest.fixture(params=CASES, ids=[f"{n}-{s}" for n, s in CASES])
def scenario(request, tmp_path):
    name, seed = request.param
    store = Store(tmp_path / f"{name}.duckdb")
    store.set_rates(CONFIG.rates)
    SCENARIOS[name](store, seed)
    app = create_app(store, CONFIG, open_reads=True)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield name, store, client
    if app.state.audit is not None:  # its flush thread must not outlive the store (a POST is audited)
        app.state.audit.close()
    store.close()


def _get_routes(client: TestClient) -> list[tuple[str, dict[str, Any]]]:
    """(path, parameters) for every GET route of the spec, path parameters filled from the store's teams (plus
    one that does not exist), each with its defaults and once with a short window ending now."""
    spec = client.get("/openapi.json").json()
    teams = [t["team"] for t in client.get("/v1/teams").json()] + ["nosuch"]
    calls = []
    for path, operations in spec["paths"].items():
        if "get" not in operations or path in ("/v1/backup",):
            continue
        names = {p["name"] for p in operations["get"].get("parameters", []) if p["in"] == "query"}
        paths = [path.replace("{team}", t) for t in teams] if "{team}" in path else [path]
        for filled in paths:
            calls.append((filled, {}))
            window = {k: v for k, v in (("days", 1), ("end", NOW.isoformat())) if k in names}
            if "target" in names:
                calls += [(filled, {"target": t, "format": f, "status": s})
                          for t in TARGETS for f in FORMATS for s in EXPORT_STATUSES]
            elif window:
                calls.append((filled, window))
    return calls


def test_no_route_answers_500_and_every_refusal_says_why(scenario):
    name, _, client = scenario
    answered = 0
    for path, params in _get_routes(client):
        got = client.get(path, params=params)
        assert got.status_code < 500, f"{name}: GET {path} {params} -> {got.status_code}: {got.text[:300]}"
        if got.status_code >= 400:
            assert got.json().get("detail"), f"{name}: GET {path} {params} refused without a reason"
        answered += 1
    assert answered > 40  # the walk reached the routes (a spec that lost them must not pass)
    placed = client.post("/v1/placement", json={"gpus": 1})
    assert placed.status_code == 200, placed.text


def test_the_bill_adds_up_to_the_cent(scenario, tmp_path):
    name, store, client = scenario
    costs = client.get("/v1/costs", params={"days": 1}).json()
    assert abs(sum(t["cost_usd"] for t in costs["teams"]) - costs["total_usd"]) < 0.005, name  # within a cent
    daily = client.get("/v1/costs/daily", params={"days": 1}).json()
    assert abs(sum(d["cost_usd"] for d in daily) - costs["total_usd"]) < 0.005, name
    teams = [t["team"] for t in costs["teams"] if t["team"] in set(store.team_table()["team"])]
    for team in teams[:2]:
        _, secret = create_token(store, f"lead-{team}", Role.parse(f"team:{team}"), "test")
        mine = client.get("/v1/costs", params={"days": 1}, headers={"Authorization": f"Bearer {secret}"}).json()
        assert abs(sum(t["cost_usd"] for t in mine["teams"]) - mine["total_usd"]) < 0.005, (name, team)


def test_no_physical_gpu_is_billed_over_one(scenario):
    """At no instant do a card's rows (MIG slices, time-sliced sharers) hold more than the card, and over the window
    no card is billed more GPU-seconds than the wall time its samples span."""
    name, store, _ = scenario
    store.fold()
    at_once = store.query("""SELECT node, gpu_uuid, ts, sum(gpu_fraction) AS held FROM samples
                             GROUP BY ALL HAVING sum(gpu_fraction) > 1.0 + 1e-9""")
    assert at_once.empty, f"{name}: cards held over 1.0 at an instant:\n{at_once.head()}"
    billed = store.query("""SELECT node, gpu_uuid, sum(gpu_s) AS gpu_s,
                                   epoch(max(end_ts)) - epoch(min(first_ts)) AS span_s
                            FROM usage_minute GROUP BY ALL HAVING sum(gpu_s) > (epoch(max(end_ts))
                                                                                - epoch(min(first_ts))) * 1.000001""")
    assert billed.empty, f"{name}: cards billed over their wall time:\n{billed.head()}"


def _numbers(value: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in _numbers(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list):
        return [pair for i, v in enumerate(value) for pair in _numbers(v, f"{path}[{i}]")]
    return [(path, value)]


def test_no_advice_rests_on_a_missing_value(scenario):
    name, _, client = scenario
    answer = client.get("/v1/recommendations")
    assert answer.status_code == 200, answer.text
    for rec in answer.json()["recommendations"]:
        if rec["status"] == "insufficient_data":
            assert rec["reason"], rec
            continue
        missing = [k for k, v in _numbers(rec["evidence"]) if (v is None or (isinstance(v, float) and math.isnan(v)))
                   and k.split(".")[0].split("[")[0] not in MAY_BE_ABSENT]
        assert not missing, f"{name}: {rec['kind']} advice for {rec['team']} rests on missing {missing}: {rec['reason']}"


def test_no_export_takes_away_a_model_a_team_uses(scenario):
    name, store, client = scenario
    used = peak_use(store, CONFIG, NOW + timedelta(minutes=1))
    plan = {t.team: t for t in build_plan(store, CONFIG, at=NOW + timedelta(minutes=1)).teams}
    for (team, model), peak in used.items():
        if team not in plan:
            continue
        assert model in plan[team].models(), f"{name}: {team} used {model} but the plan has no entry"
        assert plan[team].limit.get(model, math.inf) >= peak, f"{name}: {team}'s {model} limit under its use"
    for target in TARGETS:
        objects = json.loads(client.get("/v1/recommendations/export",
                                        params={"target": target, "format": "json"}).text)
        text = json.dumps(objects).lower()
        for (team, model), _ in used.items():
            if team in plan:
                assert model.lower().replace("-", "") in text.replace("-", ""), f"{name}/{target}: {team} {model}"


def test_the_weekly_report_renders_every_scenario(scenario, tmp_path):
    name, store, _ = scenario
    start, end, label = iso_week("current")
    files = write_weekly_report(store, CONFIG, tmp_path / "reports", start, end, label, [])
    html = Path(files.html).read_text()
    assert "Traceback" not in html and ">nan<" not in html.lower() and ">None<" not in html, name


def test_competing_advice_is_one_group_and_the_savings_total_counts_each_group_once(scenario):
    name, _, client = scenario
    answer = client.get("/v1/recommendations").json()
    placed = [r for r in answer["recommendations"] if r["kind"] in CLAIMS and r["status"] != "insufficient_data"]
    assert all(r["alternatives"] for r in placed), name
    if name == "live_after_backfill":
        assert placed, "the demo's cluster gives placement advice: the invariant below must not hold on nothing"
    claims = {r["id"]: CLAIMS[r["kind"]](r) for r in placed}
    for i, a in enumerate(placed):
        for b in placed[i + 1:]:
            if not together([claims[a["id"]], claims[b["id"]]]):
                assert a["alternatives"]["group"] == b["alternatives"]["group"], (name, a["reason"], b["reason"])
    total = 0.0
    for group in {r["alternatives"]["group"] for r in placed}:
        counted = [r for r in placed if r["alternatives"]["group"] == group and r["alternatives"]["counted"]]
        assert together([claims[r["id"]] for r in counted]), (name, group)
        total += sum(float(r["evidence"]["effect_usd_per_week"]) for r in counted)
    savings = answer["potential_savings"]
    if savings["priced"]:
        assert abs(savings["usd_per_week"] - total) < 0.011, name
    else:
        assert savings["usd_per_week"] is None if placed else savings["usd_per_week"] == 0.0, name


def test_quota_advice_rests_on_a_calibrated_replay_and_harms_no_team(scenario):
    name, store, client = scenario
    config = CONFIG
    for advice in evaluate(store, config, NOW + timedelta(minutes=1)).quota:
        if advice.status != "change":
            continue
        effect = advice.evidence["simulated_effect"]
        assert effect["calibrated"] and effect["gains"], (name, advice.reason)
        assert advice.evidence["backtest"]["calibrated"], (name, advice.reason)
        for row in [r for r in effect["gains"] + effect["pays"] if r["team"] != UNATTRIBUTED]:
            was, now = row["p95_wait_minutes"]["current"], row["p95_wait_minutes"]["proposed"]
            assert now - was <= max(config.whatif.harm_wait_minutes, config.whatif.harm_wait_fraction * was), \
                (name, advice.reason)
    answer = client.post("/v1/whatif", json={"days": 1})
    if answer.status_code == 200:
        assert "backtest" in answer.json() and "calibrated" in answer.json(), name
    else:
        assert answer.status_code in (404, 422) and answer.json()["detail"], (name, answer.text)


def test_each_kueue_plan_covers_every_gpu_and_starts_every_job_shape_or_says_why(scenario):
    name, store, client = scenario
    got = client.get("/v1/recommendations/export",
                     params={"target": "kueue", "status": "open", "fill": "true", "format": "json"})
    if got.status_code == 422:
        assert got.json()["detail"], name
        return
    assert got.status_code == 200, (name, got.text)
    objects = json.loads(got.text)
    queues = [o for o in objects if o["kind"] == "ClusterQueue"]
    plan = build_plan(store, CONFIG, at=NOW + timedelta(minutes=1))
    nominal: dict[str, float] = {}
    room: dict[tuple[str, str], float] = {}
    for queue in queues:
        for group in queue["spec"]["resourceGroups"]:
            for flavor in group["flavors"]:
                for resource in flavor["resources"]:
                    if resource["name"] == "nvidia.com/gpu":
                        quota = float(resource["nominalQuota"])
                        nominal[flavor["name"]] = nominal.get(flavor["name"], 0.0) + quota
                        room[(queue["metadata"]["name"], flavor["name"])] = \
                            quota + float(resource.get("borrowingLimit", math.inf))
    for model, capacity in plan.capacity.items():
        if capacity > 0 and float(capacity).is_integer() and k8s_name(model) in nominal:
            assert nominal[k8s_name(model)] >= capacity, f"{name}: {model}'s {capacity:g} GPUs stranded"
    for shape in job_shapes(store, NOW - timedelta(days=1), NOW + timedelta(minutes=1)).itertuples(index=False):
        flavor = k8s_name(str(shape.gpu_model)) if isinstance(shape.gpu_model, str) else None
        if flavor not in nominal:
            continue
        assert nominal[flavor] >= shape.gpus, (name, shape)
        mine = k8s_name(str(shape.team))
        # a team with no queue of its own (unattributed work) submits through some team's queue
        queues_of = [q for q, _ in room if q == mine] or [q for q, _ in room]
        assert max(room.get((q, flavor), 0.0) for q in queues_of) >= shape.gpus, (name, shape)
