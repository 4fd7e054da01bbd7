"""Topology: the objects that give Kueue's Topology Aware Scheduling and KAI's topology support the levels of a
node's place (`[topology] levels`, outermost first), and the annotations that keep one job's pods inside a level.

Kueue: a `kueue.x-k8s.io/v1beta2` Topology, which a ResourceFlavor names in `spec.topologyName`; a PodSet asks
for a level with `kueue.x-k8s.io/podset-required-topology` (or `-preferred-topology`) on its pod template.
KAI: a `kai.scheduler/v1alpha1` Topology; a workload asks with `kai.scheduler/topology` (the Topology's name) and
`kai.scheduler/topology-required-placement` (or `-preferred-placement`) on its top-level object, since KAI's pod
grouper reads them from the pod's top owner (the Job, PyTorchJob, ...; a bare pod is its own top owner).
Both CRDs take `spec.levels[].nodeLabel`; both refuse `kubernetes.io/hostname` anywhere but last.
"""
from __future__ import annotations

from typing import Any

from gpuledger.analytics.config import TopologyConfig, is_label_key, topology_problem
from gpuledger.collector.errors import InputError
from gpuledger.policies.emitters.base import Emitted, Emitter, changes, k8s_object, yaml_text
from gpuledger.policies.quota_plan import QuotaPlan

API_VERSIONS = {"kueue": "kueue.x-k8s.io/v1beta2", "kai": "kai.scheduler/v1alpha1"}  # each CRD's served version
KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
KAI_TOPOLOGY = "kai.scheduler/topology"
KAI_REQUIRED = "kai.scheduler/topology-required-placement"
KAI_PREFERRED = "kai.scheduler/topology-preferred-placement"


def checked(topology: TopologyConfig) -> TopologyConfig:
    """`topology`, or an InputError: a TopologyConfig built in code skips the file's loader, and a label with odd
    characters must be refused, not written into an object a scheduler applies."""
    problem = topology_problem(topology)
    if problem:
        raise InputError(f"[topology] {problem}")
    return topology


def topology_objects(target: str, topology: TopologyConfig) -> list[dict[str, Any]]:
    """The scheduler's Topology object for the configured levels: one for "kueue" or "kai", none for a scheduler
    without one (Volcano's and Slurm's topology live elsewhere: HyperNodes, topology.conf)."""
    if target not in API_VERSIONS:
        return []
    checked(topology)
    levels = [{"nodeLabel": label} for label in topology.levels]
    return [k8s_object(API_VERSIONS[target], "Topology", topology.name, {"levels": levels})]


def podset_annotations(target: str, topology: TopologyConfig, level_label: str,
                       required: bool = True) -> dict[str, str]:
    """The annotations that make the scheduler keep a job's pods inside one domain of the level `level_label`
    (a node label of `topology.levels`, e.g. `topology.level_label("island")`): required, or only preferred so
    the scheduler may go a level up when no domain fits. Kueue's go on each PodSet's pod template, KAI's on the
    workload's own metadata. A label the Topology does not list is refused: the scheduler would never admit the job.
    """
    checked(topology)
    if not is_label_key(level_label) or level_label not in topology.levels:
        raise InputError(f"the topology level {ascii(level_label)[:80]} is not one of [topology] levels "
                         f"({', '.join(topology.levels)})")
    if target == "kueue":
        return {KUEUE_REQUIRED if required else KUEUE_PREFERRED: level_label}
    if target == "kai":
        return {KAI_TOPOLOGY: topology.name, KAI_REQUIRED if required else KAI_PREFERRED: level_label}
    raise InputError(f"topology annotations are for {' or '.join(API_VERSIONS)}, got {target!r}")


def _check_levels_may_change(existing: dict[str, Any], desired: dict[str, Any]) -> None:
    """Refuse new levels for a Topology that exists with others where its CRD forbids the change: KAI's levels
    are immutable, Kueue's change only while kubernetes.io/hostname is the last level before and after. Applying
    it would fail anyway; the message says what to do instead."""
    old = [level.get("nodeLabel") for level in existing.get("spec", {}).get("levels", [])]
    new = [level["nodeLabel"] for level in desired["spec"]["levels"]]
    if old == new:
        return
    hostname_last = old[-1:] == new[-1:] == ["kubernetes.io/hostname"]
    if desired["apiVersion"].startswith("kai.") or not hostname_last:
        raise InputError(f"the Topology {desired['metadata']['name']!r} exists with levels {old} and its scheduler "
                         f"does not let them change to {new}: set [topology] name to a new name (and move the "
                         f"flavors or jobs over), or delete the old Topology first")


class TopologyEmitter:
    """Another emitter's objects (Kueue's or KAI's) led by the scheduler's Topology object, which with `current`
    is output only if it changes, like the rest."""

    def __init__(self, inner: Emitter, topology: TopologyConfig) -> None:
        self.inner = inner
        self.target = inner.target
        self.topology = checked(topology)

    def emit(self, plan: QuotaPlan, current: str | None = None) -> Emitted:
        desired = topology_objects(self.target, self.topology)

        def merge(existing: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
            _check_levels_may_change(existing, wanted)
            return {**existing, "spec": {**existing.get("spec", {}), "levels": wanted["spec"]["levels"]}}

        emitted = self.inner.emit(plan, current)
        objects = changes(desired, current, merge=merge, target_kinds=getattr(self.inner, "kinds", ())) + emitted.objects
        return Emitted(objects, yaml_text(emitted.header, objects, current), emitted.media_type, emitted.header)
