"""Volcano: `scheduling.volcano.sh/v1beta1` Queues.

One queue per team (`parent`: its department's queue, for the capacity plugin with `enableHierarchy`):
`deserved` = the team's guarantees summed over GPU models, `capability` = its limits summed (capped at the
cluster), `weight` = its share (an integer from 1 to 65535, for the proportion plugin), and
`guarantee.resource` = the GPUs it kept busy in at least 95% of the policy window's hours, up to its
guarantee: Volcano holds a guarantee back from every other queue even while unused, so only GPUs the team
uses all the time are reserved. Volcano sees one `nvidia.com/gpu` resource, so the split per model is in the
annotation `gpuledger.io/guarantee-per-model`. On a queue that exists, only these fields are set.
"""
from __future__ import annotations

import json
from typing import Any

from gpuledger.policies.emitters.base import (GPU_RESOURCE, Emitted, changes, check_k8s_names, comment, k8s_object,
                                        plan_header, quantity, yaml_text)
from gpuledger.policies.quota_plan import QuotaPlan, TeamPlan, k8s_name

API_VERSION = "scheduling.volcano.sh/v1beta1"
PER_MODEL = "gpuledger.io/guarantee-per-model"


# every kind this target's plan may hold (its Topology where [topology] scheduler_objects is on): a `--current`
# dump of any of them is taken (emitters/__init__.py `changes`)
KINDS = ("Queue",)

def _weight(share: float) -> int:
    return max(1, min(65535, round(share)))


def _queue(name: str, parent: str | None, deserved: float, capability: float, weight: float, reserved: float,
           per_model: dict[str, float]) -> dict[str, Any]:
    spec: dict[str, Any] = {"weight": _weight(weight), "deserved": {GPU_RESOURCE: quantity(deserved)},
                            "capability": {GPU_RESOURCE: quantity(capability)},
                            "guarantee": {"resource": {GPU_RESOURCE: quantity(reserved)}}}
    if parent:
        spec["parent"] = parent
    queue = k8s_object(API_VERSION, "Queue", name, spec)
    if per_model:
        queue["metadata"]["annotations"] = {PER_MODEL: json.dumps(per_model, sort_keys=True)}
    return queue


class VolcanoEmitter:
    kinds = KINDS
    target = "volcano"

    def emit(self, plan: QuotaPlan, current: str | None = None) -> Emitted:
        check_k8s_names(plan)
        objects = []
        for department, teams in sorted(plan.departments().items()):
            objects.append(_queue(k8s_name(department), None, sum(t.total_guarantee() for t in teams),
                                  plan.total_limit(teams), sum(t.share for t in teams),
                                  sum(self._reserved(t) for t in teams), {}))
        for team in plan.teams:
            objects.append(_queue(k8s_name(team.team), k8s_name(team.parent) if team.parent else None,
                                  team.total_guarantee(), plan.total_limit([team]), team.share,
                                  self._reserved(team), team.guarantee))
        objects = changes(objects, current, target_kinds=KINDS)
        header = comment(plan_header(plan, self.target))
        return Emitted(objects, yaml_text(header, objects, current), "application/yaml", header)

    @staticmethod
    def _reserved(team: TeamPlan) -> float:
        return sum(min(team.guarantee.get(m, 0.0), floor) for m, floor in team.always_busy.items())
