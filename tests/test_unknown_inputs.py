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
