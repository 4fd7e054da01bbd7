"""Emitters: the quota plan as objects a scheduler applies, one scheduler per file behind `Emitter`.

`kai` (KAI-Scheduler Queues), `kueue` (ClusterQueues, Cohorts, ResourceFlavors), `volcano` (Queues) and
`slurm` (a `sacctmgr -i` script, or the same as JSON); `topology` adds Kueue's or KAI's Topology object where
`[topology] scheduler_objects` is on. Given the objects that exist now (`current`: for
Kubernetes a YAML dump such as `kubectl get queues -o yaml`, for Slurm `sacctmgr -P show assoc` output),
an emitter outputs only the objects that change, each with every field gpuledger does not own kept as it is.

Every plan's text opens with a header of comments (`plan_header`): when it was made (UTC), from which advice
(each recommendation's id and status) or, with none, that it is the quotas in force unchanged, and every
adjustment gpuledger made so it can be applied (quota_plan.py `applicable_plan`). The JSON format holds the
objects only.
"""
from __future__ import annotations

from gpuledger.analytics.config import TopologyConfig
from gpuledger.collector.errors import InputError
from gpuledger.policies.emitters.base import (GPU_RESOURCE, MANAGED_BY, SCHEDULERS, TARGETS, Emitted, Emitter,
                                              advice_label, changes, check_k8s_names, comment, count, deep_merge,
                                              distinct_k8s_names, k8s_object, load_objects, plan_header, quantity,
                                              render_yaml, yaml_text)


def emitter_for(target: str, topology: TopologyConfig | None = None) -> Emitter:
    """The target's emitter; with a `topology` whose scheduler_objects is on, Kueue's and KAI's also output the
    Topology object (emitters/topology.py) and Kueue's flavors name it."""
    from gpuledger.policies.emitters.kai import KaiEmitter
    from gpuledger.policies.emitters.kueue import KueueEmitter
    from gpuledger.policies.emitters.slurm import SlurmEmitter
    from gpuledger.policies.emitters.topology import API_VERSIONS, TopologyEmitter
    from gpuledger.policies.emitters.volcano import VolcanoEmitter
    with_topology = topology is not None and topology.scheduler_objects
    kueue = KueueEmitter(topology.name if with_topology else None)
    emitters: dict[str, Emitter] = {e.target: e for e in (KaiEmitter(), kueue, VolcanoEmitter(), SlurmEmitter())}
    if target not in emitters:
        raise InputError(f"target must be one of {', '.join(emitters)}, got {target!r}")
    if with_topology and target in API_VERSIONS:
        return TopologyEmitter(emitters[target], topology)
    return emitters[target]


__all__ = ["emitter_for", "Emitted", "Emitter", "GPU_RESOURCE", "MANAGED_BY", "SCHEDULERS", "TARGETS", "advice_label",
           "changes", "check_k8s_names", "comment", "count", "deep_merge", "distinct_k8s_names", "k8s_object",
           "load_objects", "plan_header", "quantity", "render_yaml", "yaml_text"]
