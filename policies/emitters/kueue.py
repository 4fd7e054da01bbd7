"""Kueue: `kueue.x-k8s.io/v1beta2` ClusterQueues, Cohorts and ResourceFlavors.

One ResourceFlavor per GPU model (selecting nodes by the GPU feature discovery label
`nvidia.com/gpu.product`), one Cohort per department under a root cohort `gpuledger`, and one ClusterQueue
per team in its department's cohort: per flavor, `nvidia.com/gpu` `nominalQuota` = guarantee and
`borrowingLimit` = limit - guarantee (lendingLimit unset: all of it can be lent while unused), and
`fairSharing.weight` = the team's share. A new ClusterQueue admits the namespace named like the team.
With `[topology] scheduler_objects`, each flavor names the Topology (`spec.topologyName`, emitters/topology.py).

On a ClusterQueue that exists, gpuledger sets only the `nvidia.com/gpu` quotas of its flavors and the fair
sharing weight: CPU and memory quotas, other flavors, selectors, preemption and the cohort stay as they are.
"""
from __future__ import annotations

import copy
from typing import Any

from gpuledger.collector.errors import InputError
from gpuledger.collector.gpu_catalog import MODELS
from gpuledger.policies.emitters import (GPU_RESOURCE, Emitted, changes, check_k8s_names, deep_merge, k8s_object,
                                        quantity, render_yaml)
from gpuledger.policies.quota_plan import ROOT_GROUP, QuotaPlan, k8s_name

API_VERSION = "kueue.x-k8s.io/v1beta2"
PRODUCT_LABEL = "nvidia.com/gpu.product"


def _flavor(model: str, topology_name: str | None = None) -> dict[str, Any]:
    """A model's flavor; with `topology_name`, one that Topology Aware Scheduling places by that Topology, which
    the CRD allows only on a flavor with nodeLabels (a model outside the catalogue has none and gets no topology)."""
    spec: dict[str, Any] = {}
    if model in MODELS:
        spec["nodeLabels"] = {PRODUCT_LABEL: MODELS[model].driver_name.replace(" ", "-")}
        if topology_name:
            spec["topologyName"] = topology_name
    return k8s_object(API_VERSION, "ResourceFlavor", k8s_name(model), spec)


def _gpu_resource(guarantee: float, limit: float) -> dict[str, Any]:
    return {"name": GPU_RESOURCE, "nominalQuota": quantity(guarantee),
            "borrowingLimit": quantity(max(0.0, limit - guarantee))}


def _merge_cluster_queue(existing: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """Set the GPU quota of each flavor in the group that covers GPUs; keep everything else."""
    if desired.get("kind") == "ResourceFlavor":
        _check_topology_name(existing, desired)
    if desired.get("kind") != "ClusterQueue":
        return deep_merge(existing, desired)
    merged = copy.deepcopy(existing)
    spec = merged.setdefault("spec", {})
    spec["fairSharing"] = {**spec.get("fairSharing", {}), **desired["spec"]["fairSharing"]}
    wanted = desired["spec"]["resourceGroups"][0]
    groups = spec.setdefault("resourceGroups", [])
    group = next((g for g in groups if GPU_RESOURCE in g.get("coveredResources", [])), None)
    if group is None:
        groups.append(copy.deepcopy(wanted))
        return merged
    flavors = group.setdefault("flavors", [])
    for flavor in wanted["flavors"]:
        gpu = flavor["resources"][0]
        found = next((f for f in flavors if f.get("name") == flavor["name"]), None)
        if found is None:  # a new flavor must list every resource the group covers
            found = {"name": flavor["name"], "resources": [
                {"name": r, "nominalQuota": 0} for r in group["coveredResources"] if r != GPU_RESOURCE]}
            flavors.append(found)
        resources = found.setdefault("resources", [])
        current = next((r for r in resources if r.get("name") == GPU_RESOURCE), None)
        if current is None:
            resources.append(copy.deepcopy(gpu))
        else:
            current.update({"nominalQuota": gpu["nominalQuota"], "borrowingLimit": gpu["borrowingLimit"]})
    return merged


def _check_topology_name(existing: dict[str, Any], desired: dict[str, Any]) -> None:
    """Refuse to move a flavor to another Topology: Kueue's CRD makes spec.topologyName immutable once set."""
    have, want = existing.get("spec", {}).get("topologyName"), desired["spec"].get("topologyName")
    if have and want and have != want:
        raise InputError(f"the ResourceFlavor {desired['metadata']['name']!r} already uses the Topology {have!r}, "
                         f"which Kueue does not let change: set [topology] name = {have!r}")


class KueueEmitter:
    target = "kueue"

    def __init__(self, topology_name: str | None = None) -> None:
        self.topology_name = topology_name  # the Topology its flavors name ([topology] scheduler_objects)

    def emit(self, plan: QuotaPlan, current: str | None = None) -> Emitted:
        check_k8s_names(plan)
        models = sorted(set(plan.capacity) | {m for t in plan.teams for m in t.models()})
        objects = [_flavor(model, self.topology_name) for model in models]
        objects.append(k8s_object(API_VERSION, "Cohort", ROOT_GROUP, {}))
        for department, teams in sorted(plan.departments().items()):
            objects.append(k8s_object(API_VERSION, "Cohort", k8s_name(department), {
                "parentName": ROOT_GROUP, "fairSharing": {"weight": quantity(sum(t.share for t in teams))}}))
        for team in plan.teams:
            flavors = [{"name": k8s_name(model), "resources": [_gpu_resource(
                team.guarantee.get(model, 0.0), plan.limit_of(team, model))]} for model in team.models()]
            spec = {"cohortName": k8s_name(team.parent) if team.parent else ROOT_GROUP,
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": k8s_name(team.team)}},
                    "resourceGroups": [{"coveredResources": [GPU_RESOURCE], "flavors": flavors}],
                    "fairSharing": {"weight": quantity(team.share)}}
            if flavors:
                objects.append(k8s_object(API_VERSION, "ClusterQueue", k8s_name(team.team), spec))
        objects = changes(objects, current, merge=_merge_cluster_queue)
        return Emitted(objects, render_yaml(objects), "application/yaml")
