"""Kueue: `kueue.x-k8s.io/v1beta2` ClusterQueues, Cohorts, ResourceFlavors and LocalQueues.

One ResourceFlavor per GPU model (selecting nodes by the GPU feature discovery label
`nvidia.com/gpu.product`), one Cohort per department under a root cohort `gpuledger`, and one ClusterQueue
per team in its department's cohort: per flavor, `nvidia.com/gpu` `nominalQuota` = guarantee and
`borrowingLimit` = limit - guarantee (lendingLimit unset: all of it can be lent while unused), and
`fairSharing.weight` = the team's share. A new ClusterQueue admits the team's namespaces (`namespaceSelector` on
`kubernetes.io/metadata.name`), and each of those namespaces gets a LocalQueue named like the team that points
at it: a job submits with the label `kueue.x-k8s.io/queue-name: <team>`. The namespaces are the plan's
(`[teams.<team>] namespaces`, else those the team's work was seen in, else the team's name).
With `[topology] scheduler_objects`, each flavor names the Topology (`spec.topologyName`, emitters/topology.py).

Kueue accounts every resource a pod requests (cpu, memory, ...) unless its Configuration excludes it
(`resources.excludeResourcePrefixes`, config.kueue.x-k8s.io): a ClusterQueue that covers only GPUs admits no pod
that also asks for CPU or memory. gpuledger records GPUs only, so the plan's header carries the Configuration
fragment that leaves CPU, memory, ephemeral storage and huge pages out of Kueue's accounting (`kueue_configuration`)
and, where MIG instances are present, turns each MIG profile's resource (`nvidia.com/mig-<profile>`, the device
plugin's mixed strategy) into its share of an `nvidia.com/gpu` (`resources.transformations`), so MIG slices count
against the same GPU quotas. That fragment is not an object to apply: it goes into Kueue's own configuration.

On a ClusterQueue that exists, gpuledger sets only the `nvidia.com/gpu` quotas of its flavors and the fair
sharing weight: CPU and memory quotas, other flavors, selectors, preemption and the cohort stay as they are (a
ClusterQueue without a namespaceSelector, which admits no namespace, gets the plan's). A LocalQueue that exists
keeps everything but must point at the team's ClusterQueue (Kueue does not let `clusterQueue` change).
"""
from __future__ import annotations

import copy
import math
import re
from typing import Any

import yaml

from gpuledger.analytics.config import is_namespace
from gpuledger.collector.errors import InputError
from gpuledger.collector.gpu_catalog import MODELS, mig_fraction
from gpuledger.policies.emitters.base import (GPU_RESOURCE, Emitted, changes, check_k8s_names, comment, deep_merge,
                                        k8s_object, plan_header, quantity, yaml_text)
from gpuledger.policies.quota_plan import ROOT_GROUP, QuotaPlan, k8s_name

API_VERSION = "kueue.x-k8s.io/v1beta2"
CONFIG_API_VERSION = "config.kueue.x-k8s.io/v1beta2"  # Kueue's Configuration (its manager's config file)
PRODUCT_LABEL = "nvidia.com/gpu.product"
NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # every namespace carries its own name as this label
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
# the resources Kueue is told not to account: gpuledger records no CPU, memory or storage requests, so it can set
# no quota for them (Kueue matches each as a prefix of a requested resource's name)
EXCLUDED_PREFIXES = ("cpu", "memory", "ephemeral-storage", "hugepages-")
MIG_RESOURCE = "nvidia.com/mig-"  # the device plugin's mixed strategy: one resource per MIG profile
_RESOURCE_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")  # the name after a resource's prefix
# a DeviceClass name: a DNS label, optionally after a DNS subdomain and a slash (Kueue's rule for deviceClassNames)
_DEVICE_CLASS = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
CONFIG_BEGIN = "--- Kueue Configuration (config.kueue.x-k8s.io) ---"
CONFIG_END = "--- end of the Kueue Configuration ---"


# every kind this target's plan may hold (its Topology where [topology] scheduler_objects is on): a `--current`
# dump of any of them is taken (emitters/__init__.py `changes`)
KINDS = ("ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue", "Topology")

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
    if desired.get("kind") == "LocalQueue":
        _check_cluster_queue(existing, desired)
    if desired.get("kind") != "ClusterQueue":
        return deep_merge(existing, desired)
    merged = copy.deepcopy(existing)
    spec = merged.setdefault("spec", {})
    spec["fairSharing"] = {**spec.get("fairSharing", {}), **desired["spec"]["fairSharing"]}
    if spec.get("namespaceSelector") is None:  # Kueue reads none as "no namespace": the plan's, so its queues work
        spec["namespaceSelector"] = copy.deepcopy(desired["spec"]["namespaceSelector"])
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


def _check_cluster_queue(existing: dict[str, Any], desired: dict[str, Any]) -> None:
    """Refuse to point a LocalQueue that exists at another ClusterQueue: Kueue's CRD makes spec.clusterQueue
    immutable."""
    have, want = existing.get("spec", {}).get("clusterQueue"), desired["spec"]["clusterQueue"]
    if have and have != want:
        where = f"{existing.get('metadata', {}).get('namespace')}/{desired['metadata']['name']}"
        raise InputError(f"the LocalQueue {where} exists "
                         f"and points at the ClusterQueue {have!r}, which Kueue does not let change to {want!r}: "
                         f"delete that LocalQueue first, or drop the namespace from [teams] namespaces")


def _check_topology_name(existing: dict[str, Any], desired: dict[str, Any]) -> None:
    """Refuse to move a flavor to another Topology: Kueue's CRD makes spec.topologyName immutable once set."""
    have, want = existing.get("spec", {}).get("topologyName"), desired["spec"].get("topologyName")
    if have and want and have != want:
        raise InputError(f"the ResourceFlavor {desired['metadata']['name']!r} already uses the Topology {have!r}, "
                         f"which Kueue does not let change: set [topology] name = {have!r}")


def namespaces_of(plan: QuotaPlan, team: str) -> tuple[str, ...]:
    """The namespaces a team submits from (the plan's; a plan built without them: the team's name), each checked
    as a Kubernetes namespace name: it becomes a LocalQueue's namespace."""
    names = plan.namespaces.get(team) or (k8s_name(team),)
    for name in names:
        if not is_namespace(name):
            raise InputError(f"team {ascii(team)[:80]}: {ascii(name)[:80]} is not a Kubernetes namespace name")
    return tuple(names)


def mig_transformations(plan: QuotaPlan) -> tuple[list[dict[str, Any]], list[str]]:
    """Per MIG profile present: a Kueue resource transformation that counts `nvidia.com/mig-<profile>` as its share
    of an `nvidia.com/gpu` (compute slices over the card's, in thousandths rounded down, so the slices of a card
    never sum above one GPU; a profile on several cards: its smallest share), replacing it. And what could not be
    covered, in words (a profile whose resource name would not be a valid one)."""
    shares: dict[str, float] = {}
    skipped = []
    for model, profiles in sorted(plan.mig.items()):
        for profile in sorted(profiles):
            name = profile.replace("+", ".")  # the device plugin advertises `1g.10gb+me` as `mig-1g.10gb.me`
            if not _RESOURCE_NAME.fullmatch(f"mig-{name}") or len(f"mig-{name}") > 63:
                skipped.append(f"the MIG profile {ascii(profile)[:40]} of {model} (no valid resource name)")
                continue
            share = mig_fraction(model, profile)
            shares[name] = min(shares.get(name, share), share)
    out = []
    for name, share in sorted(shares.items()):
        milli = max(1, math.floor(share * 1000 + 1e-9))
        output = milli // 1000 if milli % 1000 == 0 else f"{milli}m"
        out.append({"input": f"{MIG_RESOURCE}{name}", "strategy": "Replace", "outputs": {GPU_RESOURCE: output}})
    return out, skipped


def dra_device_classes(plan: QuotaPlan) -> list[str]:
    """The DeviceClasses whose whole-GPU claims count against the GPU quota, for a site that allocates GPUs through
    DRA: per driver seen, the class named like it (NVIDIA's DRA driver names its whole-GPU class after itself,
    `gpu.nvidia.com`; MIG devices come through `mig.nvidia.com`, which is not a whole GPU and is left out)."""
    return [d for d in plan.dra_drivers if _DEVICE_CLASS.fullmatch(d)][:8]  # Kueue takes at most 8 per mapping


def kueue_configuration(plan: QuotaPlan) -> dict[str, Any]:
    """The part of Kueue's Configuration the plan needs: only GPUs accounted (`excludeResourcePrefixes`), MIG
    slices counted as GPUs (`transformations`) where the plan's models have MIG instances, and DRA claims of whole
    GPUs counted as `nvidia.com/gpu` (`deviceClassMappings`) where the window's jobs claimed GPUs through DRA, so the
    ClusterQueues' GPU quotas hold for both ways of asking for a GPU."""
    resources: dict[str, Any] = {"excludeResourcePrefixes": list(EXCLUDED_PREFIXES)}
    transformations, _ = mig_transformations(plan)
    if transformations:
        resources["transformations"] = transformations
    classes = dra_device_classes(plan)
    if classes:
        resources["deviceClassMappings"] = [{"name": GPU_RESOURCE, "deviceClassNames": classes}]
    return {"apiVersion": CONFIG_API_VERSION, "kind": "Configuration", "resources": resources}


def configuration_in(text: str) -> dict[str, Any] | None:
    """The Kueue Configuration fragment a plan's header carries (None: the text has none)."""
    lines = text.splitlines()
    try:
        begin, end = lines.index(f"# {CONFIG_BEGIN}"), lines.index(f"# {CONFIG_END}")
    except ValueError:
        return None
    return yaml.safe_load("\n".join(line[2:] for line in lines[begin + 1:end]))


def _header(plan: QuotaPlan) -> list[str]:
    """What a Kueue plan needs besides its objects: the Configuration fragment, and which namespaces get queues."""
    fragment = yaml.safe_dump(kueue_configuration(plan), sort_keys=False).splitlines()
    _, skipped = mig_transformations(plan)
    lines = ["GPUs only: Kueue accounts every resource a pod requests unless its Configuration excludes it, and",
             "gpuledger records GPUs only, so these ClusterQueues cover GPUs only. Without the fragment below Kueue",
             "admits no pod that also requests CPU or memory. Merge it into Kueue's Configuration (ConfigMap",
             "kueue-manager-config in kueue-system, key controller_manager_config.yaml), then restart",
             "kueue-controller-manager; it is not an object to kubectl apply."]
    if plan.mig:
        lines.append("MIG slices (the device plugin's mixed strategy, nvidia.com/mig-<profile>) count as their "
                     "share of an nvidia.com/gpu.")
    if dra_device_classes(plan):
        lines.append(f"DRA: the window's jobs claimed GPUs through DRA (drivers {', '.join(plan.dra_drivers)}); "
                     f"deviceClassMappings count each device of DeviceClass {', '.join(dra_device_classes(plan))} "
                     f"as one nvidia.com/gpu against the same quotas. Kueue needs its DynamicResourceAllocation "
                     f"feature gate for that; MIG devices claimed through mig.nvidia.com are not mapped.")
    lines += [CONFIG_BEGIN, *fragment, CONFIG_END]
    lines += [f"Not covered: {s}: a pod that requests it is not admitted." for s in skipped]
    lines.append(f"LocalQueues: one named like the team in each namespace it submits from (a job sets the label "
                 f"{QUEUE_NAME_LABEL}: <team>); its ClusterQueue admits those namespaces:")
    for team in plan.teams:
        if team.models():
            basis = plan.namespace_basis.get(team.team, "none given: the team's name")
            lines.append(f"  - {team.team}: {', '.join(namespaces_of(plan, team.team))} ({basis})")
    lines.append("A ClusterQueue that exists keeps its own namespaceSelector: it must admit the namespaces above.")
    return lines


class KueueEmitter:
    kinds = KINDS
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
        queues = []
        for team in plan.teams:
            flavors = [{"name": k8s_name(model), "resources": [_gpu_resource(
                team.guarantee.get(model, 0.0), plan.limit_of(team, model))]} for model in team.models()]
            namespaces = namespaces_of(plan, team.team)
            spec = {"cohortName": k8s_name(team.parent) if team.parent else ROOT_GROUP,
                    "namespaceSelector": {"matchExpressions": [
                        {"key": NAMESPACE_LABEL, "operator": "In", "values": list(namespaces)}]},
                    "resourceGroups": [{"coveredResources": [GPU_RESOURCE], "flavors": flavors}],
                    "fairSharing": {"weight": quantity(team.share)}}
            if flavors:
                objects.append(k8s_object(API_VERSION, "ClusterQueue", k8s_name(team.team), spec))
                queues += [_local_queue(team.team, namespace) for namespace in namespaces]
        objects = changes(objects + queues, current, merge=_merge_cluster_queue, target_kinds=KINDS)
        header = comment(plan_header(plan, self.target, _header(plan)))
        return Emitted(objects, yaml_text(header, objects, current), "application/yaml", header)


def _local_queue(team: str, namespace: str) -> dict[str, Any]:
    queue = k8s_object(API_VERSION, "LocalQueue", k8s_name(team), {"clusterQueue": k8s_name(team)})
    queue["metadata"] = {"name": queue["metadata"]["name"], "namespace": namespace,
                         "labels": queue["metadata"]["labels"]}
    return queue
