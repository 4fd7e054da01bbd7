"""What every emitter shares (policies/emitters/__init__.py has the registry, `emitter_for`): the Emitted result and
the Emitter protocol, the targets, the plan header, Kubernetes object and name helpers, and the merge of a plan
with the objects that exist now. In a module of its own so the emitters import it, not the package that imports
them (an import circle the architecture test refuses)."""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from datetime import timezone
from typing import Any, Callable, Protocol

import yaml

from gpuledger.collector.errors import InputError
from gpuledger.policies.quota_plan import QuotaPlan, k8s_name

GPU_RESOURCE = "nvidia.com/gpu"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuledger"}


@dataclass
class Emitted:
    """What an emitter produced: the objects (Kubernetes dicts, or Slurm association records) and their text."""
    objects: list[dict[str, Any]]
    text: str
    media_type: str
    header: str = ""  # the comment lines the text opens with (plan_header)


class Emitter(Protocol):
    target: str

    def emit(self, plan: QuotaPlan, current: str | None = None) -> Emitted:
        """The objects that make the scheduler run `plan`; with `current`, only those that change."""


def check_k8s_names(plan: QuotaPlan) -> None:
    """The plan's teams, departments and GPU models each map to a Kubernetes name of their own (see
    `distinct_k8s_names`); teams and departments share one namespace of queue names."""
    groups = sorted({t.team for t in plan.teams} | {t.parent for t in plan.teams if t.parent})
    distinct_k8s_names(groups, "the team or department names")
    distinct_k8s_names(sorted(set(plan.capacity) | {m for t in plan.teams for m in t.models()}), "the GPU models")


TARGETS = ("kai", "kueue", "volcano", "slurm")
SCHEDULERS = {"kai": "KAI-Scheduler", "kueue": "Kueue", "volcano": "Volcano", "slurm": "Slurm"}


def advice_label(statuses: tuple[str, ...]) -> str:
    """`accepted`, or `open (proposed or accepted)`: which advice a plan was asked to apply."""
    return "accepted" if tuple(statuses) == ("accepted",) else f"open ({' or '.join(statuses)})"


def plan_header(plan: QuotaPlan, target: str, more: list[str] | None = None) -> list[str]:
    """The lines every plan's text opens with, as comments: what made it and from what, and each adjustment."""
    made = plan.made.astimezone(timezone.utc) if plan.made.tzinfo else plan.made
    lines = [f"gpuledger quota plan for {SCHEDULERS.get(target, target)}, made {made:%Y-%m-%d %H:%M:%S} UTC."]
    label = advice_label(plan.statuses)
    if plan.advice:
        lines.append(f"From {label} advice: the recommendations below; the quotas in force for everything else.")
        lines += [f"  - recommendation {a}" for a in plan.advice]
    else:
        lines.append(f"No {label} advice: these are the quotas in force (the last applied decision, else the site "
                     f"config), unchanged.")
    if plan.adjustments:
        lines.append("Adjusted so that the plan can be applied:")
        lines += [f"  - {a}" for a in plan.adjustments]
    return lines + (more or [])


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")


def comment(lines: list[str]) -> str:
    """`lines` as `# ` comments for YAML or a shell script; a control character (a newline in a hostile name) is
    shown as `?`, so nothing a name holds can end the comment."""
    return "".join(f"# {_UNPRINTABLE.sub('?', line)}".rstrip() + "\n" for line in lines)


# --- Kubernetes objects: shared by the kai, kueue and volcano emitters ---------------------------------------
def k8s_object(api_version: str, kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "labels": dict(MANAGED_BY)},
            "spec": spec}


def distinct_k8s_names(names: list[str], what: str) -> None:
    """Refuse two different names that become the same Kubernetes name (`k8s_name` folds case and turns every
    other character into '-'): one object would silently take the other's numbers. Names come from telemetry
    and the config, so a crafted one (`Vision` next to `vision`) must not overwrite another team's queue."""
    seen: dict[str, str] = {}
    for name in names:
        folded = k8s_name(name)
        if seen.setdefault(folded, name) != name:
            raise InputError(f"{what} {ascii(seen[folded])[:80]} and {ascii(name)[:80]} both become the Kubernetes "
                             f"name {folded!r}; rename one of them")


def load_objects(text: str) -> list[dict[str, Any]]:
    """Objects from a YAML (or JSON) dump: several documents, or a `kind: List` with `items`."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        raise InputError(f"the current objects are not YAML: {exc}") from exc
    objects: list[dict[str, Any]] = []
    for document in documents:
        if not isinstance(document, dict):
            raise InputError(f"expected Kubernetes objects, got {type(document).__name__}")
        objects += document.get("items", []) if document.get("kind", "").endswith("List") else [document]
    return objects


def deep_merge(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """`current` with `desired`'s leaves laid over it: fields gpuledger does not set are kept."""
    merged = copy.deepcopy(current)
    for key, value in desired.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    """An object's identity: group, kind, namespace (none for a cluster-scoped kind) and name."""
    metadata = obj.get("metadata", {})
    return (obj.get("apiVersion", "").split("/")[0], obj.get("kind", ""), metadata.get("namespace") or "",
            metadata.get("name", ""))


def changes(desired: list[dict[str, Any]], current_text: str | None,
            owned: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
            merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] = deep_merge,
            target_kinds: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Of the desired objects, those that change what exists now.

    An object that does not exist is output whole. One that exists gets only the fields gpuledger owns
    (`owned` narrows a desired object to them) merged into it, everything else kept, and is output only if that
    changes it. Server-side fields of a dump (status, resourceVersion, uid, managedFields) are dropped.
    `target_kinds`: every kind the target's plan may hold (Kueue's queues and its Topology), so a dump of some of
    them is taken by each part of the plan."""
    if current_text is None:
        return desired
    loaded = load_objects(current_text)
    _check_current(loaded, {o.get("kind", "") for o in desired} | set(target_kinds))
    current = {_key(o): o for o in loaded}
    out = []
    for obj in desired:
        existing = current.get(_key(obj))
        if existing is None:
            out.append(obj)
            continue
        merged = _clean(merge(existing, _name_only(owned(obj) if owned else obj)))
        if merged != _clean(existing):
            out.append(merged)
    return out


def _check_current(current: list[dict[str, Any]], kinds: set[str]) -> None:
    """`--current` that holds no object of a kind the plan writes compared nothing, and the plan came out as if the
    flag were absent (a wrong file, another scheduler's dump): refused, naming what it holds and what was wanted.
    An empty dump (`kind: List` with no items: none exist yet) is the cluster as it is, and is taken."""
    for obj in current:
        if not isinstance(obj, dict) or not obj.get("kind") or not isinstance(obj.get("metadata"), dict) \
                or not obj["metadata"].get("name"):
            raise InputError("the current objects must be Kubernetes objects, each with kind and metadata.name "
                             f"(as `kubectl get ... -o yaml` dumps them); got {ascii(obj)[:120]}")
    wanted = sorted(k for k in kinds if k)
    found = sorted({o["kind"] for o in current})
    if current and wanted and not set(found) & set(wanted):
        raise InputError(f"the current objects hold no {', '.join(wanted)} (they hold {', '.join(found)[:200]}): "
                         f"give a dump of `kubectl get {','.join(k.lower() for k in wanted)} -A -o yaml`")


def _name_only(obj: dict[str, Any]) -> dict[str, Any]:
    """An object to lay over an existing one: its metadata narrowed to the name and gpuledger's own annotations
    (an existing object's labels are its owner's)."""
    metadata = {"name": obj["metadata"]["name"]}
    mine = {k: v for k, v in obj["metadata"].get("annotations", {}).items() if k.startswith("gpuledger.io/")}
    if mine:
        metadata["annotations"] = mine
    return {**obj, "metadata": metadata}


def _clean(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj.pop("status", None)
    metadata = obj.get("metadata", {})
    for field in ("resourceVersion", "uid", "generation", "creationTimestamp", "managedFields"):
        metadata.pop(field, None)
    return obj


def render_yaml(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False) if objects else ""


def yaml_text(header: str, objects: list[dict[str, Any]], current: str | None) -> str:
    """A Kubernetes plan's text: its header, then the objects. Against `current` with nothing to change, nothing at
    all (there is no plan to apply, and `kubectl apply` of an empty input changes nothing either way)."""
    return "" if current is not None and not objects else header + render_yaml(objects)


def count(value: float) -> int | float:
    """A GPU count as a number field: an integer when it is one."""
    return int(value) if float(value).is_integer() else float(value)


def quantity(value: float) -> int | str:
    """A Kubernetes quantity for a GPU count: an integer, or a decimal string for a fraction."""
    return int(value) if float(value).is_integer() else f"{value:g}"
