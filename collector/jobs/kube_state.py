"""Kubernetes pods as jobs, from a kube-state-metrics page (`/metrics` of kube-state-metrics, or the same families
as Prometheus holds them): one job row per GPU pod, so its id (`<namespace>/<pod>`) is the one the GPU telemetry
attributes samples to (collector/dcgm_source.py), with its owner (Job, PyTorchJob, RayJob, JobSet, ...) as `name`.

Families read, each optional (facts from kube-state-metrics' docs/metrics/workload/pod-metrics.md):
- `kube_pod_created`, `kube_pod_status_scheduled_time`, `kube_pod_start_time`, `kube_pod_completion_time`: unix
  seconds (submitted, scheduled, started, finished).
- `kube_pod_status_phase{phase}` = 1 for the pod's phase (Pending, Running, Succeeded, Failed, Unknown);
  `kube_pod_status_reason{reason}` = 1 for Evicted, NodeLost, UnexpectedAdmissionError, ...
- `kube_pod_status_unschedulable` = 1 while the scheduler cannot place it (the pending reason `Unschedulable`).
- `kube_pod_container_status_restarts_total` (summed over containers) and
  `kube_pod_container_status_last_terminated_reason{reason}` = 1 (OOMKilled, Error, DeadlineExceeded, ...).
- `kube_pod_owner{owner_kind, owner_name}` (`<none>` for a bare pod), `kube_pod_labels{label_*}` and
  `kube_pod_annotations{annotation_*}` (the team and the workload class), `kube_pod_info{node, priority_class}`.
- GPUs asked: `kube_pod_container_resource_requests{resource="nvidia_com_gpu"}` summed over containers (v1.5 on;
  also HAMi's vGPU count), or the older family `kube_pod_container_resource_requests_nvidia_gpu_devices`.
- `kube_node_labels{node, label_*}` (docs/metrics/cluster/node-metrics.md; only the labels the deployment's
  --metric-labels-allowlist lets through): a node's labels, which may name its node pool (cloud.google.com/
  gke-nodepool, eks.amazonaws.com/nodegroup, node.kubernetes.io/instance-type) and so its rate.
A family missing from the page leaves its field unknown (null), never zero. A phase the page does not give leaves
the state null and is counted.
"""
from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from datetime import datetime, timezone
from typing import Any, Iterable

from gpuledger.collector.jobs.classes import class_of_label
from gpuledger.collector.identifiers import is_identifier
from gpuledger.collector.jobs.lifecycle import JobBatch, events_of, jobs_frame
from gpuledger.collector.prom_text import parse

Sample = tuple[str, dict[str, str], float, Any]  # (family, labels, value, timestamp), as prom_text gives them

SOURCE = "kubernetes"
GPU_RESOURCES = ("nvidia_com_gpu",)
LEGACY_GPU_REQUESTS = "kube_pod_container_resource_requests_nvidia_gpu_devices"
PHASES = {"Pending": "pending", "Running": "running", "Succeeded": "completed", "Failed": "failed"}
# a Failed pod's outcome from what ended it: the pod's own reason first, then its containers' last one
POD_REASONS = {"Evicted": "preempted", "NodeLost": "node_fail", "Preempting": "preempted",
               "DeadlineExceeded": "timeout"}
CONTAINER_REASONS = {"OOMKilled": "out_of_memory", "DeadlineExceeded": "timeout", "Evicted": "preempted"}
TIMES = {"kube_pod_created": "created", "kube_pod_status_scheduled_time": "scheduled",
         "kube_pod_start_time": "started", "kube_pod_completion_time": "completed"}


def _ts(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, timezone.utc) if seconds and seconds > 0 else None


def parse_kube_state(text: str, team_label: str | None = None, gpu_pods_only: bool = True,
                     class_label: str | None = None) -> JobBatch:
    """The pods of a kube-state-metrics page as jobs. `team_label`: the pod label naming the team (its
    `label_<key>` in kube_pod_labels), else the namespace is the team. `gpu_pods_only`: skip (and count) pods
    that ask for no GPU. `class_label`: the pod label giving the workload class (else it is inferred)."""
    page = parse(text)
    return pods_as_jobs(page.samples, team_label, gpu_pods_only, page.skipped(), class_label)


def label_key(label: str) -> str:
    """kube_pod_labels' (and kube_node_labels') name for a label: `label_` and the key with every character not
    allowed in a
    Prometheus label name made `_` (app.kubernetes.io/name -> label_app_kubernetes_io_name)."""
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def pods_as_jobs(samples: Iterable[Sample], team_label: str | None = None, gpu_pods_only: bool = True,
                 skipped: Counter | None = None, class_label: str | None = None) -> JobBatch:
    """The pods of kube-state-metrics samples as jobs: a page's (parse_kube_state) or what Prometheus returns for
    the same families (collector/jobs/prometheus_jobs.py), so both read a pod the same way."""
    skipped = Counter() if skipped is None else skipped
    pods: dict[tuple[str, str], dict[str, Any]] = defaultdict(lambda: {"gpus": None, "restarts": None})
    for name, labels, value, _ in samples:
        key = (labels.get("namespace", ""), labels.get("pod", ""))
        if not key[1]:
            continue
        pod = pods[key]
        if name in TIMES:
            pod[TIMES[name]] = value
        elif name == "kube_pod_status_phase" and value == 1:
            pod["phase"] = labels.get("phase")
        elif name == "kube_pod_status_reason" and value == 1:
            pod["reason"] = labels.get("reason")
        elif name == "kube_pod_status_unschedulable" and value == 1:
            pod["unschedulable"] = True
        elif name == "kube_pod_container_status_restarts_total":
            if not math.isfinite(value):
                skipped["bad_restarts"] += 1
                continue
            pod["restarts"] = (pod["restarts"] or 0) + int(value)
        elif name == "kube_pod_container_status_last_terminated_reason" and value == 1:
            pod["terminated"] = labels.get("reason")
        elif name == "kube_pod_owner" and labels.get("owner_kind") not in (None, "", "<none>"):
            pod["owner"] = f"{labels['owner_kind']}/{labels.get('owner_name', '')}"
        elif name == "kube_pod_labels":
            if team_label:
                pod["team"] = labels.get(label_key(team_label))
            if class_label and labels.get(label_key(class_label)):
                pod["class"] = (f"label {class_label}", labels[label_key(class_label)])
        elif name == "kube_pod_annotations" and class_label:
            key = "annotation_" + label_key(class_label)[len("label_"):]
            if labels.get(key) and "class" not in pod:
                pod["class"] = (f"annotation {class_label}", labels[key])
        elif (name == "kube_pod_container_resource_requests" and labels.get("resource") in GPU_RESOURCES) \
                or name == LEGACY_GPU_REQUESTS:
            pod["gpus"] = (pod["gpus"] or 0) + value
        elif name == "kube_pod_info":
            pod["node"] = labels.get("node") or None
            pod["priority_class"] = labels.get("priority_class") or None
    unknown: Counter = Counter()
    records = []
    for (namespace, name), pod in pods.items():
        if gpu_pods_only and not pod["gpus"]:
            skipped["no_gpus"] += 1
            continue
        phase = pod.get("phase")
        state = PHASES.get(phase) if phase else None
        if phase and state is None:
            unknown[phase] += 1
        if state == "failed":
            state = (POD_REASONS.get(pod.get("reason") or "") or CONTAINER_REASONS.get(pod.get("terminated") or "")
                     or "failed")
        records.append({
            "job_id": f"{namespace}/{name}", "team": pod.get("team") or namespace or None, "user": None,
            "namespace": namespace or None, "pod": name, "node": pod.get("node"), "gpu_model": None,
            "gpus": pod["gpus"] if pod["gpus"] else None,  # a count that is no whole number is dropped (jobs_frame)
            "submit_ts": _ts(pod.get("created")), "start_ts": _ts(pod.get("started")),
            "end_ts": _ts(pod.get("completed")) if state not in ("pending", "running") else None,
            "state": state, "eligible_ts": _ts(pod.get("scheduled")), "partition": None, "qos": None,
            "account": None, "exit_code": pod.get("terminated"), "restarts": pod["restarts"],
            "pending_reason": ("Unschedulable" if pod.get("unschedulable") else pod.get("reason"))
            if state == "pending" else None,
            "name": pod.get("owner"), "source": SOURCE,
            "priority_class": pod.get("priority_class"), **_class_of(pod.get("class"), skipped),
        })
    jobs = jobs_frame(records, skipped)
    return JobBatch(jobs, events_of(jobs), skipped, unknown, node_labels(samples, skipped))


NODE_LABELS = "kube_node_labels"


def node_labels(samples: Iterable[Sample], skipped: Counter) -> dict[str, dict[str, str]]:
    """Each node's `label_*` labels from kube_node_labels series. Telemetry names every later query, price and
    page: a node name or label value outside the identifier rules is skipped and counted (`bad_node_label`)."""
    nodes: dict[str, dict[str, str]] = {}
    for name, labels, _, _ in samples:
        if name != NODE_LABELS:
            continue
        node = labels.get("node")
        if not is_identifier("node", node):
            skipped["bad_node_label"] += 1
            continue
        for key, value in labels.items():
            if not key.startswith("label_") or not value:
                continue
            if is_identifier("node_pool", value) and len(key) <= 253:
                nodes.setdefault(node, {})[key] = value
            else:
                skipped["bad_node_label"] += 1
    return nodes


def _class_of(labelled: tuple[str, str] | None, skipped: Counter) -> dict[str, str]:
    """The class a pod's label or annotation gives (where, value), if it names one (classes.py ALIASES); another
    value is counted and the class inferred instead (jobs_frame)."""
    if not labelled:
        return {}
    found = class_of_label(labelled[1])
    if found:
        return {"workload_class": found, "class_rule": f"{labelled[0]}={labelled[1]}"}
    skipped["unknown_class_label"] += 1
    return {}
