"""A plan a scheduler can apply as is (issue 39): queues for every namespace a team submits from, Kueue told to
account GPUs only, no GPU left under no guarantee without saying so, every job shape of the window able to start,
Slurm's GPU types as the site names them, and a header that says when and from what the plan was made.

Before: the Kueue plan covered only `nvidia.com/gpu` (a pod that also asks for CPU is never admitted on a default
Kueue), emitted no LocalQueue (nobody could submit), assumed namespace == team, left GPUs outside every nominal
quota, and named Slurm's GPU types after gpuledger's models whatever the site's gres.conf said.
"""
from __future__ import annotations

import json
from datetime import timedelta

import pandas as pd
import pytest
import yaml
from fastapi.testclient import TestClient

from gpuledger.analytics.config import Config, ConfigError, QuotaConfig, load_config
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.jobs.sacct import gpu_types_of, parse_sacct
from gpuledger.deploy.api import create_app
from gpuledger.policies.emitters.kueue import configuration_in
from gpuledger.policies.exporting import export
from gpuledger.policies.quota_plan import PlanNotApplicable, applicable_plan
from gpuledger.policies.recommendation import ACCEPTED, Recommendation
from tests.helpers import gpu_rows, table

# the site's samples end half an hour before now, so the server's export (made as of now) sees the same GPUs
T0 = utc_now().replace(second=0, microsecond=0) - timedelta(hours=6)
AT = T0 + timedelta(hours=6)
CONFIG = Config(quota=QuotaConfig(window_days=1))


@pytest.fixture
def site(file_store):
    """8 H100: a runs 4 from namespace a-train, b runs 2 from b; the quotas in force guarantee a 4 and b 2 (2 GPUs
    under no guarantee). 8 L4 that b once ran a 4-GPU job on, with no L4 quota and no sample of it."""
    store = file_store
    store.upsert_teams(pd.DataFrame({"team": ["a", "b"], "share": [3.0, 1.0], "quota_gpus": [4, 2]}))
    store.set_team_quotas(pd.DataFrame({"team": ["a", "b"], "gpu_model": ["H100", "H100"],
                                        "guarantee_gpus": [4.0, 2.0], "limit_gpus": [8.0, 8.0]}))
    rows = [gpu_rows("h", g, "H100", 330, start=T0, util=90.0, job="a/train", team="a", namespace="a-train") for g in range(4)]
    rows += [gpu_rows("h", g, "H100", 330, start=T0, util=90.0, job="b/serve", team="b") for g in range(4, 6)]
    rows += [gpu_rows("h", g, "H100", 330, start=T0) for g in range(6, 8)]
    rows += [gpu_rows("l", g, "L4", 330, start=T0, mem_total=23034.0) for g in range(8)]
    store.append_samples(table(*rows))
    store.upsert_jobs(pd.DataFrame([{"job_id": "b/old-l4", "team": "b", "gpu_model": "L4", "gpus": 4,
                                     "state": "completed", "submit_ts": T0, "start_ts": T0,
                                     "end_ts": T0 + timedelta(minutes=30), "source": "test"}]))
    return store


def _objects(text: str) -> list[dict]:
    return [o for o in yaml.safe_load_all(text) if o]


def test_the_kueue_plan_queues_each_namespace_and_carries_the_configuration_it_needs(site):
    text = export(site, CONFIG, "kueue", at=AT).native
    objects = _objects(text)
    queues = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]["clusterQueue"]
              for o in objects if o["kind"] == "LocalQueue"}
    assert queues == {("a-train", "a"): "a", ("b", "b"): "b"}  # where each team's work was seen
    selectors = {o["metadata"]["name"]: o["spec"]["namespaceSelector"]["matchExpressions"][0]["values"]
                 for o in objects if o["kind"] == "ClusterQueue"}
    assert selectors == {"a": ["a-train"], "b": ["b"]}
    fragment = configuration_in(text)
    assert fragment["kind"] == "Configuration" and fragment["apiVersion"].startswith("config.kueue.x-k8s.io/")
    assert {"cpu", "memory"} <= set(fragment["resources"]["excludeResourcePrefixes"])
    assert "deviceClassMappings" not in fragment["resources"]  # no job claimed a GPU through DRA
    assert "No accepted advice: these are the quotas in force" in text and f"made {AT:%Y-%m-%d %H:%M:%S} UTC" in text


def test_a_site_that_claims_gpus_through_dra_gets_its_device_class_counted_as_gpus(file_store):
    """Issue 44 item 1: where the window's jobs claimed GPUs through DRA (dcgm-exporter's DRA labels), the Kueue
    plan's Configuration maps the driver's whole-GPU DeviceClass onto `nvidia.com/gpu`, so claims count against the
    same quotas, says so in its header, and every object stays valid against Kueue's CRDs."""
    from tests.crds import assert_valid
    store = file_store
    store.upsert_teams(pd.DataFrame({"team": ["a"], "share": [1.0], "quota_gpus": [2]}))
    store.set_team_quotas(pd.DataFrame({"team": ["a"], "gpu_model": ["H100"], "guarantee_gpus": [2.0],
                                        "limit_gpus": [2.0]}))
    rows = [gpu_rows("h", g, "H100", 330, start=T0, util=90.0, job=f"a/pod{g}", team="a", namespace="a",
                     dra_claim=f"a/claim-{g}", dra_device=f"gpu.nvidia.com/h/gpu-{g}") for g in range(2)]
    store.append_samples(table(*rows))
    store.fold()
    text = export(store, CONFIG, "kueue", at=AT).native
    fragment = configuration_in(text)
    assert fragment["resources"]["deviceClassMappings"] == [{"name": "nvidia.com/gpu",
                                                             "deviceClassNames": ["gpu.nvidia.com"]}]
    assert "DRA: the window's jobs claimed GPUs through DRA" in text
    assert_valid(_objects(text))


def test_no_gpu_is_left_under_no_guarantee_and_the_header_says_what_was_added(site):
    objects = _objects(export(site, CONFIG, "kueue", at=AT).native)
    nominal: dict[str, float] = {}
    for cq in (o for o in objects if o["kind"] == "ClusterQueue"):
        for flavor in cq["spec"]["resourceGroups"][0]["flavors"]:
            nominal[flavor["name"]] = nominal.get(flavor["name"], 0) + flavor["resources"][0]["nominalQuota"]
    assert nominal == {"h100": 8, "l4": 8}  # Kueue admits at most this: every GPU present
    plan = applicable_plan(site, CONFIG, at=AT)
    added = [a for a in plan.adjustments if a.startswith("H100: 2 of its 8 GPUs were under no guarantee")]
    assert added and "a +2" in added[0]  # by share (3:1), whole GPUs: both to a
    # the L4 job b ran keeps b an L4 entry though no sample showed it
    b = next(t for t in plan.teams if t.team == "b")
    assert b.limit["L4"] >= 4 and any(a.startswith("b L4: no quota, but ran 1 job(s) of 4 GPUs")
                                      for a in plan.adjustments)


def test_advice_that_strands_gpus_is_refused_unless_filled(site):
    site.set_team_quotas(pd.DataFrame({"team": ["a", "b"], "gpu_model": ["H100", "H100"],
                                       "guarantee_gpus": [6.0, 2.0], "limit_gpus": [8.0, 8.0]}))
    cut = Recommendation(kind="quota", team="a", action={"guarantee_gpus": 3.0, "limit_gpus": 8.0}, evidence={},
                         reason="lower a", gpu_model="H100", status=ACCEPTED, created=AT - timedelta(hours=1))
    site.add_recommendations(pd.DataFrame([cut.to_row()]))
    with pytest.raises(PlanNotApplicable, match=r"H100: 3 of its 8 GPUs would be under no guarantee, 3 of them left "
                                                r"so by advice"):
        applicable_plan(site, CONFIG, at=AT)
    with TestClient(create_app(site, CONFIG, open_reads=True)) as c:
        refused = c.get("/v1/recommendations/export", params={"target": "kueue"})
        filled = c.get("/v1/recommendations/export", params={"target": "kueue", "fill": "true", "format": "json"})
    assert refused.status_code == 422 and "fill" in refused.json()["detail"]
    assert filled.status_code == 200
    h100 = sum(f["resources"][0]["nominalQuota"] for o in json.loads(filled.text) if o["kind"] == "ClusterQueue"
               for f in o["spec"]["resourceGroups"][0]["flavors"] if f["name"] == "h100")
    assert h100 == 8
    plan = applicable_plan(site, CONFIG, at=AT, fill=True)
    assert any(a.startswith(f"{cut.id} (accepted): a H100") for a in plan.advice)


def test_slurm_names_gpus_by_the_type_sacct_recorded(site):
    assert gpu_types_of("billing=8,cpu=16,gres/gpu=4,gres/gpu:a100=4") == "a100"
    assert gpu_types_of("gres/gpu:h100=2,gres/gpu:a100_3g.20gb=1") == "a100_3g.20gb,h100"
    assert gpu_types_of("gres/gpu=2") is None and gpu_types_of("gres/gpu:bad;rm=1") is None
    header = "JobID|Account|User|State|Submit|Start|End|AllocTRES|NodeList|Partition"
    row = (f"41|b|bob|COMPLETED|{T0:%Y-%m-%dT%H:%M:%S}|{T0:%Y-%m-%dT%H:%M:%S}|"
           f"{T0 + timedelta(minutes=20):%Y-%m-%dT%H:%M:%S}|cpu=8,gres/gpu=2,gres/gpu:hopper=2|h|gpu")
    jobs = parse_sacct(f"{header}\n{row}\n").jobs
    assert jobs["gres_type"].tolist() == ["hopper"]
    site.upsert_jobs(jobs.assign(gpu_model="H100"))
    script = export(site, CONFIG, "slurm", at=AT).native
    assert "gres/gpu:hopper=" in script and "gres/gpu:h100=" not in script
    assert "H100: hopper (sacct AllocTRES of 1 job(s))" in script
    # where no record names a type, [slurm_gres] does, and else the model's name
    configured = Config(quota=CONFIG.quota, slurm_gres={"L4": "l4-24gb"})
    assert "L4: l4-24gb ([slurm_gres])" in export(site, configured, "slurm", at=AT).native


def test_namespaces_and_gpu_types_in_the_config_are_checked(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[teams.vision]\nshare = 1\nnamespaces = ["vision", "cv-prod"]\n[slurm_gres]\nH100 = "h100"\n')
    config = load_config(good)
    assert config.teams["vision"].namespaces == ("vision", "cv-prod") and config.slurm_gres == {"H100": "h100"}
    for bad, says in (('[teams.vision]\nshare = 1\nnamespaces = ["Vision_Prod"]\n', "not a Kubernetes namespace"),
                      ('[slurm_gres]\nH100 = "h100,cpu=4"\n', "must be a Slurm GPU type")):
        path = tmp_path / "bad.toml"
        path.write_text(bad)
        with pytest.raises(ConfigError, match=says):
            load_config(path)
