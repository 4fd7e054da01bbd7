"""Attribute a GPU process to its owner, Slurm job or Kubernetes pod from /proc.

NVML reports only pids. The owner comes from /proc/PID's uid; a Slurm job from the
cgroup path (slurm/uid_U/job_J) or SLURM_JOB_ID in the environment; a pod from the
kubepods cgroup path, which carries the pod UID. Every step tolerates a process that
vanished or a file we may not read: a half-known process is still counted.
"""
from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass
from pathlib import Path

_SLURM_JOB = re.compile(r"/job_(\d+)")
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER = re.compile(r"(?:cri-containerd-|docker-|crio-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    user: str | None = None
    slurm_job: str | None = None
    pod_uid: str | None = None
    container_id: str | None = None

    @property
    def job_id(self) -> str | None:
        if self.slurm_job:
            return f"slurm:{self.slurm_job}"
        if self.pod_uid:
            return f"pod:{self.pod_uid}"
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def describe_process(pid: int, proc_root: str | os.PathLike[str] = "/proc") -> ProcessInfo:
    base = Path(proc_root) / str(pid)
    user = None
    try:
        uid = base.stat().st_uid
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
    except OSError:
        pass
    slurm_job = pod_uid = container = None
    cgroup = _read(base / "cgroup") or ""
    for line in cgroup.splitlines():
        path = line.rsplit(":", 1)[-1]
        if slurm_job is None and (m := _SLURM_JOB.search(path)):
            slurm_job = m.group(1)
        if pod_uid is None and (m := _POD_UID.search(path)):
            pod_uid = m.group(1).replace("_", "-")
        if container is None and (m := _CONTAINER.search(path.rsplit("/", 1)[-1])):
            container = m.group(1)
    if slurm_job is None:
        environ = _read(base / "environ") or ""
        for item in environ.split("\0"):
            if item.startswith("SLURM_JOB_ID="):
                slurm_job = item.split("=", 1)[1] or None
                break
    return ProcessInfo(pid=pid, user=user, slurm_job=slurm_job, pod_uid=pod_uid, container_id=container)
