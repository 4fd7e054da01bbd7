"""Nothing a caller sends is dropped without a word (issue 45's silent successes, their siblings in the API): a
query parameter the route does not take, or a body field its model does not know, is refused with 422 naming it.
Before, `GET /v1/ledger/statements/2026-11?team=nlp` answered every team, `?status=accepted` on the advice listed
proposed advice too, a what-if edit's misspelt `limt` was answered 200 with the limit unchanged, and a budget's
`period` was dropped and the period in progress set."""
from __future__ import annotations

from gpuledger.analytics.config import Config
from tests.helpers import api_client


def test_every_route_refuses_a_query_parameter_it_does_not_take(file_store):
    with api_client(file_store, Config(), open_reads=True) as client:
        paths = client.get("/openapi.json").json()["paths"]
        refused = 0
        for path, operations in paths.items():
            if "get" not in operations or "{" in path:
                continue
            answer = client.get(path, params={"nosuch_filter": "1"})
            if path.startswith("/allocation"):  # OpenCost's clients send OpenCost's parameters: tolerated there
                assert answer.status_code != 422 or "nosuch_filter" not in answer.text, path
                continue
            assert answer.status_code == 422, (path, answer.status_code, answer.text[:200])
            assert "nosuch_filter" in answer.json()["detail"], path
            refused += 1
        assert refused >= 30, refused  # the walk reached the routes
        statement = client.get("/v1/ledger/statements/2026-11", params={"team": "nlp"})
        assert statement.status_code == 422 and "takes" in statement.json()["detail"]
        # what a route takes is still taken
        assert client.get("/v1/costs", params={"days": 1}).status_code == 200


def test_a_body_field_a_route_does_not_know_is_refused(file_store):
    admin = {"Authorization": "Bearer t0ken-for-tests"}
    with api_client(file_store, Config(), token="t0ken-for-tests") as client:
        edit = client.post("/v1/whatif", headers=admin, json={
            "use_recommendations": False, "edits": {"nlp": {"H100": {"guarantee": 4, "limt": 6}}}})
        assert edit.status_code == 422 and "limt" in edit.text
        budget = client.put("/v1/budgets/research", headers=admin, json={"usd": 5000, "period": "2027-01"})
        assert budget.status_code == 422 and "period" in budget.text
        placement = client.post("/v1/placement", headers=admin, json={"gpus": 1, "gpu_models": ["L4"]})
        assert placement.status_code == 422 and "gpu_models" in placement.text


def test_emit_current_refuses_a_file_that_holds_none_of_the_targets_objects():
    """`emit --current junk.yaml` came out as if the flag were absent, exit 0: the comparison compared nothing."""
    import pytest

    from gpuledger.collector.errors import InputError
    from gpuledger.policies.emitters import emitter_for
    from gpuledger.policies.quota_plan import QuotaPlan, TeamPlan
    from tests.helpers import T0
    PLAN = QuotaPlan([TeamPlan("nlp", 1, None, {"H100": 2}, {"H100": 4}), TeamPlan("cv", 1, None, {"H100": 2}, {})],
                     capacity={"H100": 4.0}, made=T0)
    for junk, says in (("hello: world\n", "kind and metadata.name"),
                       ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "they hold ConfigMap")):
        with pytest.raises(InputError, match=says):
            emitter_for("kueue").emit(PLAN, junk)
    kueue = emitter_for("kueue").emit(PLAN).text
    with pytest.raises(InputError, match="hold no .*Queue"):  # another scheduler's dump
        emitter_for("kai").emit(PLAN, kueue)
    assert emitter_for("kueue").emit(PLAN, kueue).objects == []  # its own dump: nothing to change
    assert emitter_for("kueue").emit(PLAN, "apiVersion: v1\nkind: List\nitems: []\n").objects  # none exist yet


def test_a_decision_on_held_back_advice_says_why_and_a_decision_needs_its_decider(file_store, tmp_path, capsys):
    """Held-back advice is listed with an id; deciding it answered 404 "no recommendation", as if the id were
    wrong. And `decide ID reject --by ""` recorded a decision by nobody."""
    import pandas as pd

    from gpuledger.analytics.windows import utc_now
    from gpuledger.deploy.cli import main
    from gpuledger.policies.recommendation import HELD_BACK, PROPOSED, Recommendation
    held = Recommendation(kind="quota", team="nlp", gpu_model="H100", action={"guarantee_gpus": 2}, evidence={},
                          reason="its simulated effect lengthens vision's p95 wait 30 -> 90 min", status=HELD_BACK)
    admin = {"Authorization": "Bearer t0ken-for-tests"}
    with api_client(file_store, Config(), token="t0ken-for-tests") as client:
        client.app.state.recommender.listed = lambda: [held]
        answer = client.post(f"/v1/recommendations/{held.id}/decision", headers=admin,
                             json={"decision": "accept", "by": "alice"})
        assert answer.status_code == 409, answer.text
        assert "held_back" in answer.json()["detail"] and "vision's p95 wait" in answer.json()["detail"]
        unknown = client.post("/v1/recommendations/abcdef123456/decision", headers=admin,
                              json={"decision": "accept", "by": "alice"})
        assert unknown.status_code == 404 and "lists the ids" in unknown.json()["detail"]
    proposed = Recommendation(kind="quota", team="nlp", gpu_model="H100", action={"guarantee_gpus": 3}, evidence={},
                              reason="r", status=PROPOSED, created=utc_now())
    file_store.add_recommendations(pd.DataFrame([proposed.to_row()]))
    file_store.close()
    assert main(["decide", proposed.id, "reject", "--by", " ", "--db", str(tmp_path / "file.duckdb")]) == 2
    assert "--by NAME" in capsys.readouterr().err


def test_token_refuses_a_flag_of_another_action(tmp_path, capsys):
    """`token list --role admin` listed every token (the flag was ignored); `token create --revoked` created one."""
    from gpuledger.deploy.cli import main
    db = str(tmp_path / "t.duckdb")
    assert main(["token", "create", "--role", "reader", "--db", db]) == 0
    capsys.readouterr()
    assert main(["token", "list", "--role", "admin", "--db", db]) == 2
    assert "token list does not take --role" in capsys.readouterr().err
    assert main(["token", "create", "--role", "reader", "--revoked", "--db", db]) == 2
    assert main(["token", "list", "--db", db]) == 0
