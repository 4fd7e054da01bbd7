"""Workload classes: what kind of work a job is, so its waits, cost, efficiency and waste can be read per kind (a
notebook idle most of the day is not the failure a training job idle most of the day is).

A class comes from the site first: a label or annotation (`--class-label`), a Kubernetes priority class, or a Slurm
partition or QOS named like a class (aliases in ALIASES). Else from the job's name and owner (NAME_RULES, first
match wins). A job neither places stays `unclassified`: its telemetry may place it later (analytics/workloads.py
class_usage: sustained activity on several GPUs, long idle with bursts, a request-driven duty cycle), and where it
cannot, it stays unclassified: never guessed. Every class comes with the rule that decided it (`class_rule`), the
evidence a user can check.
"""
from __future__ import annotations

import re

WORKLOAD_CLASSES = ("training", "fine_tuning", "batch_inference", "online_inference", "interactive", "agentic")
UNCLASSIFIED = "unclassified"
# the words sites use for a class, as a label value, priority class, partition or QOS
ALIASES = {
    **{c: c for c in WORKLOAD_CLASSES},
    "train": "training", "pretrain": "training", "pretraining": "training",
    "fine-tuning": "fine_tuning", "finetuning": "fine_tuning", "finetune": "fine_tuning", "fine-tune": "fine_tuning",
    "sft": "fine_tuning",
    "batch-inference": "batch_inference", "offline-inference": "batch_inference", "batch_inference": "batch_inference",
    "eval": "batch_inference", "evaluation": "batch_inference",
    "inference": "online_inference", "online-inference": "online_inference", "serving": "online_inference",
    "serve": "online_inference",
    "notebook": "interactive", "jupyter": "interactive", "dev": "interactive", "debug": "interactive",
    "agent": "agentic", "agents": "agentic",
}
_SERVICE_OWNERS = r"^(Deployment|ReplicaSet|StatefulSet|LeaderWorkerSet|InferenceService)/"
_TRAINING_OWNERS = r"^(PyTorchJob|TFJob|MPIJob|JAXJob|XGBoostJob|PaddleJob|TrainJob|RayJob|JobSet)/"
# (class, pattern over the job's name, which for a pod is its owner as Kind/name, what the rule says)
NAME_RULES: tuple[tuple[str, re.Pattern, str], ...] = tuple((c, re.compile(p, re.I), why) for c, p, why in (
    ("interactive", r"^(bash|sh|zsh|tcsh|fish|srun)$", "a login shell"),
    ("interactive", r"interactive|jupyter|notebook|\bdebug\b|\bdev\b|sys/dashboard|vscode", "a notebook or dev name"),
    ("agentic", r"agent|swe-?bench|tool-?use|browser-?use", "an agent's name"),
    ("fine_tuning", r"fine-?tun|\bsft\b|lora|\bdpo\b|rlhf|\bppo\b|grpo", "a fine-tuning name"),
    ("online_inference", _SERVICE_OWNERS, "owned by a long-running service"),
    ("online_inference", r"\bserv(e|ing|er)\b|vllm|triton|tgi|sglang", "an inference server's name"),
    ("batch_inference", r"batch-?infer|offline|\beval|embed|scor(e|ing)|predict|infer", "a batch inference name"),
    ("training", _TRAINING_OWNERS, "a training operator's pod"),
    ("training", r"train", "a training name"),
))


def class_of_label(value: str | None) -> str | None:
    """The class a site's label, priority class, partition or QOS names, if it names one."""
    return ALIASES.get(value.strip().lower()) if value else None


def infer_class(name: str | None, partition: str | None = None, qos: str | None = None,
                priority_class: str | None = None) -> tuple[str, str]:
    """(class, the rule that decided it) for a job without a class label: a priority class, partition or QOS named
    like a class, else NAME_RULES over the job's name, else unclassified."""
    for what, given in (("priority class", priority_class), ("partition", partition), ("QOS", qos)):
        found = class_of_label(given)
        if found:
            return found, f"{what} {given}"
    for workload_class, pattern, why in NAME_RULES:
        if name and pattern.search(name):
            return workload_class, f"name {name!r}: {why}"
    return UNCLASSIFIED, "no label, and the name says nothing" if name else "no label and no name"
