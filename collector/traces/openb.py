"""Alibaba's GPU-sharing trace, cluster-trace-gpu-v2023 ("openb"; CC BY 4.0, github.com/alibaba/clusterdata):
1,213 GPU nodes (6,212 GPUs of 7 models) and 8,152 pods with fractional `gpu_milli` requests, plus variants of
the pod list that stress GPU sharing, multi-GPU tasks or GPU-model constraints.

Columns: nodes `sn,cpu_milli,memory_mib,gpu,model`; pods `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,
qos,pod_phase,creation_time,deletion_time,scheduled_time` (seconds from the trace start).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpuledger.analytics.fragmentation import MILLI, NodeArrays, TaskShape
from gpuledger.collector.errors import InputError
from gpuledger.policies.placers.base import DEFAULT_CPU_MILLI, DEFAULT_MEM_MIB, Task

NODES = "openb_node_list_gpu_node.csv"
VARIANTS = ("default", "gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpushare100", "multigpu20",
            "multigpu30", "multigpu40", "multigpu50", "gpuspec05", "gpuspec10", "gpuspec20", "gpuspec25",
            "gpuspec33", "cpu0", "cpu037", "cpu050", "cpu072", "cpu100", "cpu200", "cpu235", "cpu250", "cpu300")
NODE_COLUMNS = {"sn", "cpu_milli", "memory_mib", "gpu", "model"}
POD_COLUMNS = {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"}


def _read(path: Path, columns: set[str]) -> pd.DataFrame:
    if not path.is_file():
        raise InputError(f"{path} not found: --data should be the trace's csv folder (e.g. ../shared/traces/openb/csv)")
    frame = pd.read_csv(path, dtype={"gpu_spec": str, "model": str})
    missing = columns - set(frame.columns)
    if missing:
        raise InputError(f"{path}: not an openb file, missing column(s) {sorted(missing)}")
    return frame


def load_nodes(data: Path) -> NodeArrays:
    """The GPU nodes, empty: free resources are the whole node."""
    frame = _read(Path(data) / NODES, NODE_COLUMNS)
    width = int(frame["gpu"].max())
    gpus = frame["gpu"].to_numpy(dtype=np.int64)
    free = np.where(np.arange(width)[None, :] < gpus[:, None], MILLI, 0).astype(np.int64)
    return NodeArrays(names=frame["sn"].tolist(), model=frame["model"].fillna("").to_numpy(dtype=object),
                      cpu_free=frame["cpu_milli"].to_numpy(dtype=np.int64),
                      mem_free=frame["memory_mib"].to_numpy(dtype=np.int64), gpu_free=free, gpu_count=gpus)


def load_tasks(data: Path, variant: str = "default") -> list[Task]:
    """The pods of one pod list, as tasks in name order: a request of 0 counts as Kubernetes' default, a
    `gpu_milli` over 1000 as a whole GPU (as the trace's own converter does), `gpu_spec` as allowed models."""
    if variant not in VARIANTS:
        raise InputError(f"unknown openb pod list {variant!r}; one of {', '.join(VARIANTS)}")
    frame = _read(Path(data) / f"openb_pod_list_{variant}.csv", POD_COLUMNS).sort_values("name", kind="stable")
    tasks = []
    for name, cpu, mem, gpus, milli, spec in frame[["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli",
                                                   "gpu_spec"]].itertuples(index=False):
        gpus = int(gpus)
        per_gpu = min(int(milli), MILLI) if gpus else 0
        models = frozenset(m for m in str(spec).split("|") if m and m != "nan") if gpus else frozenset()
        shape = TaskShape(int(cpu) or DEFAULT_CPU_MILLI, per_gpu, gpus if per_gpu else 0, models)
        tasks.append(Task(str(name), shape, int(mem) or DEFAULT_MEM_MIB))
    return tasks
