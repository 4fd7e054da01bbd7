"""No export takes away what a team uses, the targets agree on it, and an export serves accepted advice only unless
asked otherwise.

Before: research ran on L40S for days with no quota for it; the Kueue and KAI plans gave it no L40S entry (read as
zero: locked out once applied) while the Slurm plan omitted it (read as unlimited). And the HTTP export included
proposals no admin had accepted unless `status` was given.
"""
from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from gpuledger.analytics.config import Config, QuotaConfig
from gpuledger.deploy.api import create_app
from gpuledger.policies.emitters import TARGETS
from gpuledger.policies.exporting import export
from gpuledger.policies.quota_plan import build_plan, peak_use
from gpuledger.policies.recommendation import PROPOSED, Recommendation
from tests.helpers import T0, gpu_rows, table

AT = T0 + timedelta(hours=6)


@pytest.fixture
def used_store(file_store):
    """research holds 3 L40S for 5 hours and has a quota only for H100; nlp holds 6 H100 over a limit of 4."""
    store = file_store
    store.upsert_teams(pd.DataFrame({"team": ["research", "nlp"], "share": [1.0, 1.0], "quota_gpus": [2, 4]}))
    store.set_team_quotas(pd.DataFrame({"team": ["research", "nlp"], "gpu_model": ["H100", "H100"],
                                        "guarantee_gpus": [2.0, 2.0], "limit_gpus": [8.0, 4.0]}))
    rows = [gpu_rows("l", g, "L40S", 300, util=80.0, job="research/train", team="research", mem_total=46068.0)
            for g in range(3)]
    rows += [gpu_rows("l", g, "L40S", 300) for g in range(3, 8)]
    rows += [gpu_rows("h", g, "H100", 300, util=90.0, job="nlp/big", team="nlp") for g in range(6)]
    rows += [gpu_rows("h", g, "H100", 300) for g in range(6, 8)]
    store.append_samples(table(*rows))
    return store


def test_every_model_a_team_used_has_an_entry_at_least_its_use(used_store):
    config = Config(quota=QuotaConfig(window_days=1))
    assert peak_use(used_store, config, AT) == {("research", "L40S"): 3.0, ("nlp", "H100"): 6.0}
    plan = {t.team: t for t in build_plan(used_store, config, at=AT).teams}
    assert plan["research"].guarantee["L40S"] == 0.0 and plan["research"].limit["L40S"] >= 3.0
    assert "no quota" in plan["research"].source["L40S"]
    assert plan["nlp"].limit["H100"] == 6.0  # raised from 4: applying it must not evict a running job


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_grants_what_is_used(used_store, target):
    config = Config(quota=QuotaConfig(window_days=1))
    text = export(used_store, config, target, at=AT).native.lower()
    assert "l40s" in text, f"{target}: research's L40S is missing from the plan"


def test_the_export_serves_accepted_advice_unless_asked(used_store):
    rec = Recommendation(kind="quota", team="research", action={"guarantee_gpus": 7.0, "limit_gpus": 7.0},
                         evidence={}, reason="proposed, not accepted", gpu_model="H100", status=PROPOSED, created=AT)
    used_store.add_recommendations(pd.DataFrame([rec.to_row()]))
    with TestClient(create_app(used_store, Config(), open_reads=True)) as c:
        default = c.get("/v1/recommendations/export", params={"target": "kueue", "format": "json"})
        opened = c.get("/v1/recommendations/export", params={"target": "kueue", "format": "json", "status": "open"})
    assert default.status_code == opened.status_code == 200
    assert "7" not in _research_h100(default.text) and "7" in _research_h100(opened.text)


def _research_h100(text: str) -> str:
    """The nominal quota Kueue's plan gives research for H100, as text."""
    import json
    for obj in json.loads(text):
        if obj.get("kind") == "ClusterQueue" and obj["metadata"]["name"] == "research":
            for group in obj["spec"]["resourceGroups"]:
                for flavor in group["flavors"]:
                    if flavor["name"] == "h100":
                        return str(flavor["resources"][0]["nominalQuota"])
    return ""
