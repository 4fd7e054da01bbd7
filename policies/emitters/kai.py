"""KAI-Scheduler: `scheduling.run.ai/v2` Queues.

One queue per team (`parentQueue`: its department, which gets a queue of its own) and, under it, one leaf
queue per GPU model (`<team>-<model>`), since only leaf queues run jobs and a model's GPUs are a node pool of
their own. GPUs: `quota` = guarantee, `limit` = limit, `overQuotaWeight` = the team's share. A parent's quota
and limit are its children's sums (its limit capped at the cluster). New queues get unlimited CPU and memory
(`limit: -1`, KAI's "no limit"; an unset limit would mean no CPU at all); an existing queue keeps its own.
"""
from __future__ import annotations

from gpuledger.policies.emitters.base import (Emitted, changes, check_k8s_names, comment, count, k8s_object,
                                        plan_header, yaml_text)
from gpuledger.policies.quota_plan import QuotaPlan, k8s_name

API_VERSION = "scheduling.run.ai/v2"
UNLIMITED = -1


# every kind this target's plan may hold (its Topology where [topology] scheduler_objects is on): a `--current`
# dump of any of them is taken (emitters/__init__.py `changes`)
KINDS = ("Queue", "Topology")

def _queue(name: str, parent: str | None, quota: float, limit: float, weight: float, display: str) -> dict:
    weight = count(weight)
    spec: dict = {"displayName": display,
                  "resources": {"gpu": {"quota": count(quota), "limit": count(limit), "overQuotaWeight": weight},
                                "cpu": {"quota": 0, "limit": UNLIMITED, "overQuotaWeight": weight},
                                "memory": {"quota": 0, "limit": UNLIMITED, "overQuotaWeight": weight}}}
    if parent:
        spec["parentQueue"] = parent
    return k8s_object(API_VERSION, "Queue", name, spec)


def _owned_only(desired: dict) -> dict:
    """What gpuledger sets on a queue that already exists: the GPU numbers and the parent, nothing else."""
    spec = {"resources": {"gpu": desired["spec"]["resources"]["gpu"]}}
    if "parentQueue" in desired["spec"]:
        spec["parentQueue"] = desired["spec"]["parentQueue"]
    return {**desired, "spec": spec}


class KaiEmitter:
    kinds = KINDS
    target = "kai"

    def emit(self, plan: QuotaPlan, current: str | None = None) -> Emitted:
        check_k8s_names(plan)
        objects = []
        for department, teams in sorted(plan.departments().items()):
            objects.append(_queue(k8s_name(department), None, sum(t.total_guarantee() for t in teams),
                                  plan.total_limit(teams), sum(t.share for t in teams), department))
        for team in plan.teams:
            parent = k8s_name(team.parent) if team.parent else None
            objects.append(_queue(k8s_name(team.team), parent, team.total_guarantee(), plan.total_limit([team]),
                                  team.share, team.team))
            for model in team.models():
                objects.append(_queue(f"{k8s_name(team.team)}-{k8s_name(model)}", k8s_name(team.team),
                                      team.guarantee.get(model, 0.0), plan.limit_of(team, model), team.share,
                                      f"{team.team} {model}"))
        objects = changes(objects, current, owned=_owned_only, target_kinds=KINDS)
        header = comment(plan_header(plan, self.target))
        return Emitted(objects, yaml_text(header, objects, current), "application/yaml", header)
