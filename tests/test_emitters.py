"""Scheduler objects from the quota plan: every Kubernetes object valid against the real CRD's openAPIV3Schema,
only changes against what exists, and every field gpuledger does not own kept."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from gpuledger.analytics.config import Config, QuotaConfig
from gpuledger.policies.emitters import emitter_for, load_objects
from gpuledger.policies.emitters.slurm import parse_current
from gpuledger.policies.quota_plan import QuotaPlan, TeamPlan, build_plan
from tests.crds import assert_valid
from tests.helpers import T0, gpu_rows, table



PLAN = QuotaPlan(teams=[
    TeamPlan("vision", 30, "ml", {"H100": 5, "L4": 2}, {"H100": 16, "L4": 8}, always_busy={"H100": 3}),
    TeamPlan("nlp", 30, "ml", {"H100": 6}, {"H100": 16}),
    TeamPlan("Research Lab", 10, None, {"H100": 1.5}, {"H100": 16}),
], capacity={"H100": 16.0, "L4": 8.0}, made=T0)


@pytest.mark.parametrize("target", ["kai", "kueue", "volcano"])
def test_every_object_is_valid_against_the_real_crd(target):
    emitted = emitter_for(target).emit(PLAN)
    assert emitted.objects and load_objects(emitted.text) == emitted.objects
    assert_valid(emitted.objects)


def by_name(objects, kind=None):
    return {o["metadata"]["name"]: o for o in objects if kind is None or o["kind"] == kind}


def test_kai_queues_per_team_and_model_under_departments():
    queues = by_name(emitter_for("kai").emit(PLAN).objects)
    assert queues["vision-h100"]["spec"]["resources"]["gpu"] == {"quota": 5, "limit": 16, "overQuotaWeight": 30}
    assert queues["vision-h100"]["spec"]["parentQueue"] == "vision" and queues["vision"]["spec"]["parentQueue"] == "ml"
    assert queues["vision"]["spec"]["resources"]["gpu"]["quota"] == 7
    assert queues["ml"]["spec"]["resources"]["gpu"]["quota"] == 13 and "parentQueue" not in queues["ml"]["spec"]
    assert queues["research-lab-h100"]["spec"]["resources"]["gpu"]["quota"] == 1.5  # KAI takes fractions
    assert queues["vision"]["spec"]["resources"]["cpu"]["limit"] == -1  # a new queue is not starved of CPU


def test_kueue_cluster_queue_has_a_flavor_per_model():
    objects = emitter_for("kueue").emit(PLAN).objects
    flavors = by_name(objects, "ResourceFlavor")
    assert flavors["h100"]["spec"]["nodeLabels"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    vision = by_name(objects, "ClusterQueue")["vision"]["spec"]
    assert vision["cohortName"] == "ml" and vision["fairSharing"] == {"weight": 30}
    assert vision["resourceGroups"][0]["flavors"] == [
        {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 5, "borrowingLimit": 11}]},
        {"name": "l4", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 2, "borrowingLimit": 6}]}]
    assert by_name(objects, "Cohort")["ml"]["spec"]["parentName"] == "gpuledger"
    research = by_name(objects, "ClusterQueue")["research-lab"]["spec"]
    assert research["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == "1.5"


def test_volcano_queue_deserved_capability_weight_and_reserved_busy_gpus():
    queues = by_name(emitter_for("volcano").emit(PLAN).objects)
    spec = queues["vision"]["spec"]
    assert spec["deserved"] == {"nvidia.com/gpu": 7} and spec["capability"] == {"nvidia.com/gpu": 24}
    assert spec["weight"] == 30 and spec["parent"] == "ml"
    assert spec["guarantee"] == {"resource": {"nvidia.com/gpu": 3}}
    assert json.loads(queues["vision"]["metadata"]["annotations"]["gpuledger.io/guarantee-per-model"]) == \
        {"H100": 5, "L4": 2}


KAI_NOW = """
apiVersion: v1
kind: List
items:
- apiVersion: scheduling.run.ai/v2
  kind: Queue
  metadata: {name: vision-h100, resourceVersion: "812", uid: abc}
  spec:
    parentQueue: vision
    priority: 50
    preemptMinRuntime: 10m
    resources:
      gpu: {quota: 4, limit: 16, overQuotaWeight: 30}
      cpu: {quota: 2000, limit: 4000, overQuotaWeight: 1}
  status: {allocated: {gpu: "3"}}
- apiVersion: scheduling.run.ai/v2
  kind: Queue
  metadata: {name: nlp-h100}
  spec:
    parentQueue: nlp
    resources:
      gpu: {quota: 6, limit: 16, overQuotaWeight: 30}
"""


def test_kai_changes_only_and_keeps_what_it_does_not_own():
    emitted = emitter_for("kai").emit(PLAN, KAI_NOW)
    queues = by_name(emitted.objects)
    assert "nlp-h100" not in queues  # already as planned: no change to apply
    vision = queues["vision-h100"]
    assert vision["spec"]["resources"]["gpu"]["quota"] == 5
    assert vision["spec"]["priority"] == 50 and vision["spec"]["preemptMinRuntime"] == "10m"
    assert vision["spec"]["resources"]["cpu"] == {"quota": 2000, "limit": 4000, "overQuotaWeight": 1}
    assert "status" not in vision and "resourceVersion" not in vision["metadata"]
    assert "vision-l4" in queues and queues["vision-l4"]["spec"]["resources"]["cpu"]["limit"] == -1  # new: whole
    assert_valid(emitted.objects)


KUEUE_NOW = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: vision}
spec:
  cohortName: org
  namespaceSelector: {matchLabels: {team: vision}}
  preemption: {reclaimWithinCohort: Any}
  resourceGroups:
  - coveredResources: [cpu, memory, nvidia.com/gpu]
    flavors:
    - name: h100
      resources:
      - {name: cpu, nominalQuota: 64}
      - {name: memory, nominalQuota: 512Gi}
      - {name: nvidia.com/gpu, nominalQuota: 4, lendingLimit: 2}
  fairSharing: {weight: 2}
"""


def test_kueue_sets_only_gpu_quotas_in_an_existing_cluster_queue():
    emitted = emitter_for("kueue").emit(PLAN, KUEUE_NOW)
    vision = by_name(emitted.objects, "ClusterQueue")["vision"]["spec"]
    assert vision["cohortName"] == "org" and vision["preemption"] == {"reclaimWithinCohort": "Any"}
    assert vision["namespaceSelector"] == {"matchLabels": {"team": "vision"}} and vision["fairSharing"]["weight"] == 30
    group = vision["resourceGroups"][0]
    h100 = {r["name"]: r for r in group["flavors"][0]["resources"]}
    assert h100["cpu"] == {"name": "cpu", "nominalQuota": 64} and h100["memory"]["nominalQuota"] == "512Gi"
    assert h100["nvidia.com/gpu"] == {"name": "nvidia.com/gpu", "nominalQuota": 5, "lendingLimit": 2,
                                      "borrowingLimit": 11}
    l4 = group["flavors"][1]
    assert l4["name"] == "l4" and [r["name"] for r in l4["resources"]] == ["cpu", "memory", "nvidia.com/gpu"]
    assert_valid(emitted.objects)


SACCTMGR_NOW = """ml||root|60|
vision||ml|30|cpu=64,gres/gpu:h100=16,gres/gpu:l4=4
vision|alice|vision|1|
nlp||ml|25|gres/gpu:h100=16
"""


def test_slurm_script_and_only_changes_against_sacctmgr():
    full = emitter_for("slurm").emit(PLAN)
    assert "sacctmgr -i add account name=vision parent=ml fairshare=30" in full.text
    assert "sacctmgr -i modify account name=vision set GrpTRES=gres/gpu:h100=16,gres/gpu:l4=8" in full.text
    assert full.text.index("name=ml ") < full.text.index("name=vision ")  # departments first
    assert parse_current(SACCTMGR_NOW)["vision"]["grp_tres"]["cpu"] == "64"
    delta = emitter_for("slurm").emit(PLAN, SACCTMGR_NOW)
    accounts = {r["account"]: r for r in delta.objects}
    assert set(accounts) == {"vision", "nlp", "Research Lab"}
    assert accounts["vision"] == {"account": "vision", "parent": "ml", "fairshare": 30,
                                  "grp_tres": {"gres/gpu:l4": 8}, "action": "modify"}
    assert "sacctmgr -i modify account name=nlp set fairshare=30" in delta.text
    assert accounts["Research Lab"]["action"] == "add"


def test_the_plan_takes_open_recommendations_over_the_numbers_in_force(store):
    from datetime import timedelta

    from gpuledger.policies.recommender import decide, refresh
    store.upsert_teams(pd.DataFrame({"team": ["a", "b"], "share": [1.0, 1.0], "quota_gpus": [8, 1]}))
    store.set_team_quotas(pd.DataFrame({"team": ["a", "b"], "gpu_model": ["H100", "H100"],
                                        "guarantee_gpus": [6.0, 1.0], "limit_gpus": [8.0, 8.0]}))
    store.append_samples(table(*[gpu_rows("n", g, "H100", 180, util=90.0, job=f"b/{g}", team="b") for g in range(4)],
                               *[gpu_rows("n", g, "H100", 180) for g in range(4, 8)]))
    config = Config(quota=QuotaConfig(window_days=3 / 24))
    recs = {r.team: r for r in refresh(store, config, T0 + timedelta(hours=3)) if r.kind == "quota"}
    assert build_plan(store, config, ("accepted",)).teams[1].guarantee == {"H100": 1.0}  # nothing accepted yet
    decide(store, recs["b"].id, "accept", by="alice")
    plan = {t.team: t for t in build_plan(store, config, ("accepted",)).teams}
    assert plan["b"].guarantee["H100"] == recs["b"].action["guarantee_gpus"] == 2.0
    assert plan["b"].source["H100"].startswith(f"recommendation {recs['b'].id}")
    assert plan["a"].guarantee["H100"] == 6.0 and plan["a"].source["H100"] == "config"
