"""A MIG slice is placed only on cards that offer its profile.

Before: `POST /v1/placement {"mig_profile": "1g.10gb"}` ranked H200 GPUs (whose smallest slice is 1g.18gb) and L4
GPUs (no MIG at all) among the candidates.
"""
from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from gpuledger.analytics.config import Config
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.gpu_catalog import models_with_profile
from gpuledger.deploy.api import create_app
from tests.helpers import gpu_rows, table


@pytest.fixture
def client(file_store):
    store = file_store
    start = utc_now().replace(second=0, microsecond=0) - timedelta(minutes=30)
    rows = []
    for node, model, mem in (("h100", "H100", 81559.0), ("h200", "H200", 143771.0), ("l4", "L4", 23034.0),
                             ("a100", "A100-80GB", 81920.0)):
        rows += [gpu_rows(node, 0, model, 30, start=start, util=50.0, job=f"{node}-job", team="nlp", mem_total=mem)]
        rows += [gpu_rows(node, g, model, 30, start=start, mem_total=mem) for g in range(1, 4)]
    store.append_samples(table(*rows))
    with TestClient(create_app(store, Config(), open_reads=True)) as c:
        yield c


def test_a_mig_slice_goes_only_to_cards_with_that_profile(client):
    answer = client.post("/v1/placement", json={"mig_profile": "1g.10gb", "limit": 50})
    assert answer.status_code == 200, answer.text
    offered = {c["gpu_model"] for c in answer.json()["candidates"]}
    assert offered and offered <= set(models_with_profile("1g.10gb"))
    assert not offered & {"H200", "L4"}


def test_the_h200_profile_goes_to_h200_only(client):
    offered = {c["gpu_model"] for c in client.post("/v1/placement", json={"mig_profile": "1g.18gb"}).json()
               ["candidates"]}
    assert offered == {"H200"}


def test_a_profile_the_asked_model_lacks_is_a_clear_422(client):
    answer = client.post("/v1/placement", json={"mig_profile": "1g.10gb", "gpu_model": ["L4"]})
    assert answer.status_code == 422
    assert "L4" in answer.json()["detail"] and "H100" in answer.json()["detail"]
