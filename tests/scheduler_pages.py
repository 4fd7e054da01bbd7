"""Pages shaped like kube-state-metrics v2's pod families, Kueue's controller metrics and KAI's queue metrics
(names, label sets, HELP/TYPE lines and histogram layout as their sources define them), whose values move with a
step counter the way a cluster's do: pods go from pending to running to an outcome, restarts grow, Kueue's usage,
waiting workloads and admission-wait histogram change. The steps stop changing at FINAL, so a test can compare a
store with the page as it stands at the end."""
from __future__ import annotations

FINAL = 10
T0 = 1_790_000_000  # the pods' creation, unix seconds (2026-09)
KUEUE_BUCKETS = [1.0] + [2.5 * 2 ** i for i in range(13)]  # Kueue's generateExponentialBuckets(14)


def _pod(ns: str, pod: str, owner: tuple[str, str], gpus: int, phase: str, labels: str = "",
         created: float = T0, scheduled: float | None = None, started: float | None = None,
         completed: float | None = None, restarts: int = 0, last_reason: str | None = None,
         reason: str | None = None, unschedulable: bool = False) -> dict[str, list[str]]:
    key = f'namespace="{ns}",pod="{pod}"'
    uid = f'uid="{abs(hash((ns, pod))) % 10**8:08d}"'
    out: dict[str, list[str]] = {
        "kube_pod_created": [f"kube_pod_created{{{key},{uid}}} {created:.9e}"],
        "kube_pod_owner": [f'kube_pod_owner{{{key},{uid},owner_kind="{owner[0]}",owner_name="{owner[1]}",'
                           f'owner_is_controller="true"}} 1'],
        "kube_pod_labels": [f"kube_pod_labels{{{key},{uid}{',' + labels if labels else ''}}} 1"],
        "kube_pod_status_phase": [f'kube_pod_status_phase{{{key},{uid},phase="{p}"}} {int(p == phase)}'
                                  for p in ("Pending", "Succeeded", "Failed", "Unknown", "Running")],
        "kube_pod_container_resource_requests": [
            f'kube_pod_container_resource_requests{{{key},{uid},container="main",node="",'
            f'resource="nvidia_com_gpu",unit="integer"}} {gpus}',
            f'kube_pod_container_resource_requests{{{key},{uid},container="main",node="",resource="cpu",'
            f'unit="core"}} 4'],
        "kube_pod_container_status_restarts_total": [
            f'kube_pod_container_status_restarts_total{{{key},{uid},container="main"}} {restarts}'],
    }
    if scheduled:
        out["kube_pod_status_scheduled_time"] = [f"kube_pod_status_scheduled_time{{{key},{uid}}} {scheduled:.9e}"]
    if started:
        out["kube_pod_start_time"] = [f"kube_pod_start_time{{{key},{uid}}} {started:.9e}"]
    if completed:
        out["kube_pod_completion_time"] = [f"kube_pod_completion_time{{{key},{uid}}} {completed:.9e}"]
    if last_reason:
        out["kube_pod_container_status_last_terminated_reason"] = [
            f'kube_pod_container_status_last_terminated_reason{{{key},{uid},container="main",'
            f'reason="{last_reason}"}} 1']
    if reason:
        out["kube_pod_status_reason"] = [f'kube_pod_status_reason{{{key},{uid},reason="{r}"}} {int(r == reason)}'
                                         for r in ("Evicted", "NodeAffinity", "NodeLost", "Shutdown",
                                                   "UnexpectedAdmissionError")]
    if unschedulable:
        out["kube_pod_status_unschedulable"] = [f"kube_pod_status_unschedulable{{{key},{uid}}} 1"]
    return out


def ksm_page(step: int) -> str:
    """GPU pods of two teams and a CPU pod, at `step` (capped at FINAL)."""
    n = min(step, FINAL)
    pods = []
    for i in range(2):  # a 2-pod PyTorchJob gang: waits, runs, restarts once, succeeds
        running = n >= 3
        pods.append(_pod("nlp", f"bert-worker-{i}", ("PyTorchJob", "bert"), 4,
                         "Succeeded" if n >= 8 else "Running" if running else "Pending", 'label_team="nlp"',
                         scheduled=T0 + 300 if running else None, started=T0 + 310 if running else None,
                         completed=T0 + 3600 if n >= 8 else None, restarts=1 if n >= 5 else 0,
                         unschedulable=not running))
    pods.append(_pod("vision", "oom-0", ("Job", "resize"), 1, "Failed" if n >= 4 else "Running",
                     'label_team="vision"', scheduled=T0 + 5, started=T0 + 6, completed=T0 + 900 if n >= 4 else None,
                     restarts=min(n, 4), last_reason="OOMKilled" if n >= 4 else None))
    pods.append(_pod("vision", "serve-7d9f-abcde", ("ReplicaSet", "serve-7d9f"), 2, "Running",
                     'label_team="vision",label_gpuledger_io_class="inference"', scheduled=T0 + 1, started=T0 + 2,
                     restarts=n // 2))
    pods.append(_pod("vision", "evicted-0", ("Job", "sweep"), 1, "Failed" if n >= 6 else "Running",
                     'label_team="vision"', scheduled=T0 + 10, started=T0 + 11,
                     completed=T0 + 2000 if n >= 6 else None, reason="Evicted" if n >= 6 else None))
    if n < 5:  # deleted while it waited: it leaves the page at step 5
        pods.append(_pod("nlp", "gone-0", ("Job", "gone"), 8, "Pending", 'label_team="nlp"', unschedulable=True))
    cpu = _pod("web", "nginx-0", ("ReplicaSet", "nginx"), 0, "Running", scheduled=T0, started=T0)
    cpu["kube_pod_container_resource_requests"] = cpu["kube_pod_container_resource_requests"][1:]
    pods.append(cpu)
    families: dict[str, list[str]] = {}
    for pod in pods:
        for family, lines in pod.items():
            families.setdefault(family, []).extend(lines)
    out = []
    # the nodes' labels (what node pool each is in: its rate)
    families["kube_node_labels"] = [
        'kube_node_labels{node="gpu-a-1",label_cloud_google_com_gke_nodepool="a3-spot",label_zone="z1"} 1',
        'kube_node_labels{node="gpu-b-1",label_cloud_google_com_gke_nodepool="a3-reserved"} 1']
    for family, lines in families.items():
        out += [f"# HELP {family} {family.replace('_', ' ')}.", f"# TYPE {family} gauge", *lines]
    return "\n".join(out) + "\n"


def kueue_page(step: int) -> str:
    """Two ClusterQueues in a cohort with an H100 flavor (GPU and CPU resources), waiting workloads and a
    growing admission-wait histogram, at `step` (capped at FINAL)."""
    n = min(step, FINAL)
    lines = ["# HELP kueue_pending_workloads The number of pending workloads, per 'cluster_queue' and 'status'.",
             "# TYPE kueue_pending_workloads gauge"]
    queues = {"nlp": (8, 4, max(0, 5 - n // 2), 8 if n >= 3 else 0), "vision": (4, 0, n % 3, 3)}
    for cq, (_, _, pending, _) in queues.items():
        lines += [f'kueue_pending_workloads{{cluster_queue="{cq}",status="active"}} {pending}',
                  f'kueue_pending_workloads{{cluster_queue="{cq}",status="inadmissible"}} {int(cq == "nlp")}']
    lines += ["# HELP kueue_admitted_active_workloads The number of admitted Workloads that are active",
              "# TYPE kueue_admitted_active_workloads gauge"]
    lines += [f'kueue_admitted_active_workloads{{cluster_queue="{cq}"}} {1 + n % 4}' for cq in queues]
    for family, index in (("nominal_quota", 0), ("borrowing_limit", 1), ("resource_usage", 3)):
        lines += [f"# HELP kueue_cluster_queue_{family} Reports the cluster_queue's {family}",
                  f"# TYPE kueue_cluster_queue_{family} gauge"]
        for cq, figures in queues.items():
            lines.append(f'kueue_cluster_queue_{family}{{cohort="research",cluster_queue="{cq}",flavor="h100",'
                         f'resource="nvidia.com/gpu"}} {figures[index]}')
            lines.append(f'kueue_cluster_queue_{family}{{cohort="research",cluster_queue="{cq}",'
                         f'flavor="default-cpu",resource="cpu"}} 64')
    lines += ["# HELP kueue_admission_wait_time_seconds The time between a workload was created or requeued until "
              "admission, per 'cluster_queue'", "# TYPE kueue_admission_wait_time_seconds histogram"]
    for cq, scale in (("nlp", 40.0), ("vision", 3.0)):
        waits = [scale * (1 + (k % 5)) for k in range(2 * n + 2)]  # two more admissions per step
        for bound in KUEUE_BUCKETS:
            lines.append(f'kueue_admission_wait_time_seconds_bucket{{cluster_queue="{cq}",le="{bound:g}"}} '
                         f"{sum(w <= bound for w in waits)}")
        lines.append(f'kueue_admission_wait_time_seconds_bucket{{cluster_queue="{cq}",le="+Inf"}} {len(waits)}')
        lines.append(f'kueue_admission_wait_time_seconds_sum{{cluster_queue="{cq}"}} {sum(waits)}')
        lines.append(f'kueue_admission_wait_time_seconds_count{{cluster_queue="{cq}"}} {len(waits)}')
    lines += ["# HELP kueue_evicted_workloads_total The number of evicted workloads per 'cluster_queue'",
              "# TYPE kueue_evicted_workloads_total counter",
              f'kueue_evicted_workloads_total{{cluster_queue="nlp",reason="Preempted"}} {n // 3}']
    return "\n".join(lines) + "\n"


def kai_page(step: int) -> str:
    """KAI's queue controller and scheduler families (default `kai` namespace) for a team queue, its leaf per GPU
    model, and an unlimited default queue, at `step` (capped at FINAL)."""
    n = min(step, FINAL)
    queues = {"nlp": (8, 4 + n % 5, 9), "nlp-h100": (8, 4 + n % 5, 9), "default-queue": (-1, 0, 0)}
    lines = ["# HELP kai_queue_deserved_gpus Queue deserved GPUs", "# TYPE kai_queue_deserved_gpus gauge"]
    lines += [f'kai_queue_deserved_gpus{{queue_name="{q}"}} {v[0]}' for q, v in queues.items()]
    lines += ["# HELP kai_queue_allocated_gpus Queue allocated GPUs", "# TYPE kai_queue_allocated_gpus gauge"]
    lines += [f'kai_queue_allocated_gpus{{queue_name="{q}"}} {v[1]}' for q, v in queues.items()]
    lines += ["# HELP kai_queue_fair_share_gpu Queue fair share GPU", "# TYPE kai_queue_fair_share_gpu gauge"]
    lines += [f'kai_queue_fair_share_gpu{{queue_name="{q}"}} {v[2] + n / 10}' for q, v in queues.items()]
    return "\n".join(lines) + "\n"
