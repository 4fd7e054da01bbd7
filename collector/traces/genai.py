"""Alibaba's GenAI serving trace (cluster-trace-v2026-GenAI, CC BY 4.0): per-pod GPU duty cycle and memory used,
about once a minute for a day, 143 inference pods. Real utilisation over time, so idle-GPU detection and
allocated-but-idle chargeback run on it; there is no team, GPU model or node, so every pod is one GPU of team
`genai-serving` on a node of its own name."""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

from gpuledger.collector.errors import InputError
from gpuledger.collector.samples import SAMPLE_SCHEMA
from gpuledger.collector.traces.history import Imported, jobs_frame, shift_to

SOURCE = "trace:genai"
TEAM = "genai-serving"
DUTY, MEMORY = "pod_gpu_duty_cycle_anon.csv", "pod_gpu_memory_used_bytes_anon.csv"


def load(folder: Path) -> pd.DataFrame:
    """One row per pod and minute: duty cycle (%) and memory used (MiB, where the memory table has the minute)."""
    folder = Path(folder)
    for name in (DUTY, MEMORY):
        if not (folder / name).is_file():
            raise InputError(f"{folder / name} not found: give the alibaba_genai_2026 folder")
    duty = pd.read_csv(folder / DUTY)
    memory = pd.read_csv(folder / MEMORY)
    for frame, name in ((duty, DUTY), (memory, MEMORY)):
        if set(frame.columns) != {"value", "timestamp_anon", "container_ip"}:
            raise InputError(f"{folder / name}: not the GenAI trace's columns (value, timestamp_anon, container_ip)")
    duty = duty.rename(columns={"value": "util_pct"}).groupby(["container_ip", "timestamp_anon"], as_index=False).mean()
    memory = memory.rename(columns={"value": "mem_bytes"}).groupby(["container_ip", "timestamp_anon"],
                                                                   as_index=False).mean()
    return duty.merge(memory, on=["container_ip", "timestamp_anon"], how="left").sort_values(
        ["container_ip", "timestamp_anon"])


def import_history(folder: Path, days: float | None = None, end: datetime | None = None) -> Imported:
    frame = load(folder)
    trace_end = float(frame["timestamp_anon"].max())
    if days is not None:
        frame = frame[frame["timestamp_anon"] >= trace_end - days * 86400.0]
    step = frame.groupby("container_ip")["timestamp_anon"].diff()
    interval = step.shift(-1).fillna(step.median()).clip(upper=120.0)  # a sample stands until the next (≤ 2 min)
    shift = shift_to(trace_end + float(interval.iloc[-1]), end)
    pods = frame["container_ip"].astype(str)
    n = len(frame)
    columns = {name: [None] * n for name in SAMPLE_SCHEMA.names}
    columns.update(ts=pd.to_datetime(np.round((frame["timestamp_anon"].to_numpy() + shift) * 1e6).astype(np.int64),
                                     unit="us", utc=True),
                   interval_s=interval.to_numpy(), node=("genai-" + pods.str[:8]).to_numpy(),
                   gpu_uuid=("GPU-" + pods).to_numpy(), gpu_model=["unknown"] * n, gpu_fraction=np.ones(n),
                   allocated=[True] * n, util_pct=frame["util_pct"].to_numpy(),
                   mem_used_mib=(frame["mem_bytes"] / 2**20).to_numpy(), job_id=("genai/" + pods).to_numpy(),
                   team=[TEAM] * n, namespace=[TEAM] * n, pod=pods.to_numpy(), source=[SOURCE] * n)
    table = pa.Table.from_pydict(columns, schema=SAMPLE_SCHEMA)
    spans = frame.groupby("container_ip")["timestamp_anon"].agg(["min", "max"])
    jobs = [{"job_id": f"genai/{pod}", "team": TEAM, "user": None, "namespace": TEAM, "pod": pod,
             "node": f"genai-{pod[:8]}", "gpu_model": None, "gpus": 1, "submit_ts": lo, "start_ts": lo,
             "end_ts": hi, "state": "running"} for pod, (lo, hi) in spans.iterrows()]

    def tables() -> Iterator[pa.Table]:
        yield table
    return Imported(tables(), jobs_frame(jobs, shift), [
        f"{len(spans):,} inference pods, {n:,} per-minute samples of real GPU duty cycle and memory",
        "no GPU model (unpriced) and no team: all pods are team genai-serving"])
