"""Alibaba's GPU-sharing trace, cluster-trace-gpu-v2023 ("openb"; CC BY 4.0, github.com/alibaba/clusterdata):
1,213 GPU nodes (6,212 GPUs of 7 models) and 8,152 pods with fractional `gpu_milli` requests, plus variants of
the pod list that stress GPU sharing, multi-GPU tasks or GPU-model constraints.

Columns: nodes `sn,cpu_milli,memory_mib,gpu,model`; pods `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,
qos,pod_phase,creation_time,deletion_time,scheduled_time` (seconds from the trace start).

This module only reads the files (a reader of the collector room); placing the pods on the nodes, which the trace
does not record, is policy: policies/openb_placement.py turns them into tasks, nodes and an FGD-placed history.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from gpuledger.collector.errors import InputError

NODES = "openb_node_list_gpu_node.csv"
VARIANTS = ("default", "gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpushare100", "multigpu20",
            "multigpu30", "multigpu40", "multigpu50", "gpuspec05", "gpuspec10", "gpuspec20", "gpuspec25",
            "gpuspec33", "cpu0", "cpu037", "cpu050", "cpu072", "cpu100", "cpu200", "cpu235", "cpu250", "cpu300")
NODE_COLUMNS = {"sn", "cpu_milli", "memory_mib", "gpu", "model"}
POD_COLUMNS = {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"}
HISTORY_COLUMNS = POD_COLUMNS | {"qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time"}
SOURCE = "trace:openb"
STATES = {"Running": "running", "Succeeded": "completed", "Failed": "failed", "Pending": "pending"}


def _read(path: Path, columns: set[str]) -> pd.DataFrame:
    if not path.is_file():
        raise InputError(f"{path} not found: --data should be the trace's csv folder (e.g. ../shared/traces/openb/csv)")
    frame = pd.read_csv(path, dtype={"gpu_spec": str, "model": str})
    missing = columns - set(frame.columns)
    if missing:
        raise InputError(f"{path}: not an openb file, missing column(s) {sorted(missing)}")
    return frame


def read_nodes(data: Path) -> pd.DataFrame:
    """The GPU node list: `sn, cpu_milli, memory_mib, gpu, model`."""
    return _read(Path(data) / NODES, NODE_COLUMNS)


def read_pods(data: Path, variant: str = "default", history: bool = False) -> pd.DataFrame:
    """One pod list in name order; with `history`, also the columns that say when each pod ran."""
    if variant not in VARIANTS:
        raise InputError(f"unknown openb pod list {variant!r}; one of {', '.join(VARIANTS)}")
    frame = _read(Path(data) / f"openb_pod_list_{variant}.csv", HISTORY_COLUMNS if history else POD_COLUMNS)
    return frame.sort_values("name", kind="stable").reset_index(drop=True)
