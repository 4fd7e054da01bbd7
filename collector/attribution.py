"""Decide which team owns a sample.

Kubernetes clusters usually give each team a namespace, Slurm clusters an account or a
user. The mapping is configurable, and anything allocated that no rule claims goes to the
explicit "unattributed" bucket so that its GPU-hours stay visible on the bill.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from gpuledger.collector.samples import UNATTRIBUTED

# Namespaces that belong to the platform, not to a team: their pods are counted but unattributed.
SYSTEM_NAMESPACES = frozenset({"", "default", "kube-system", "gpu-operator", "nvidia-gpu-operator"})


@dataclass(frozen=True)
class Attributor:
    namespace_to_team: Mapping[str, str] = field(default_factory=dict)
    user_to_team: Mapping[str, str] = field(default_factory=dict)
    namespace_is_team: bool = True

    def team_for(self, namespace: str | None = None, user: str | None = None) -> str:
        if namespace:
            if namespace in self.namespace_to_team:
                return self.namespace_to_team[namespace]
            if self.namespace_is_team and namespace not in SYSTEM_NAMESPACES:
                return namespace
        if user and user in self.user_to_team:
            return self.user_to_team[user]
        return UNATTRIBUTED
