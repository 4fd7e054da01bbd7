"""SenseTime's Helios trace (SC '21, CC BY 4.0), Earth cluster, May 2020: the per-minute replay of each virtual
cluster's job log (HeliosArtifact's `cluster_sequence_vc.csv`: running, pending and idle GPUs per VC) and the
official per-day GPU quota of each VC. The raw job log is not in the shared copy, so there are no jobs: each VC is a
team whose hourly GPU-hours (Σ running GPUs / 60) are stored on the VC's GPUs, and its quota on the last day is its
guarantee. No GPU model (unpriced) and no utilisation."""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

from gpuledger.collector.errors import InputError
from gpuledger.collector.samples import SAMPLE_SCHEMA
from gpuledger.collector.traces.history import HOUR, Imported, shift_to

SOURCE = "trace:helios"
SEQUENCES = "earth_vc_sequences_2020-05"
QUOTAS = "Earth_gpu_number.csv"


def load(folder: Path) -> dict[str, pd.DataFrame]:
    """Each VC's per-minute sequence, by VC name."""
    folder = Path(folder) / SEQUENCES
    files = sorted(folder.glob("vc*.csv"))
    if not files:
        raise InputError(f"no vc*.csv under {folder}: give the helios folder")
    out = {}
    for path in files:
        frame = pd.read_csv(path, usecols=["time", "running_gpu_num", "idle_gpu_num", "total_gpu_num"])
        frame["time"] = pd.to_datetime(frame["time"], utc=True)
        out[path.stem] = frame
    return out


def _rows(vc: str, hours: pd.Series, gpu_hours: pd.Series, allocated: bool, shift: float) -> dict[str, list]:
    """GPU-hours of each clock hour as rows of one whole GPU each plus one for the remainder."""
    out: dict[str, list] = {"ts": [], "gpu": [], "fraction": []}
    for hour, amount in zip(hours, gpu_hours):
        whole = int(np.floor(amount + 1e-9))
        parts = [1.0] * whole + ([amount - whole] if amount - whole > 1e-9 else [])
        offset = 0 if allocated else 10_000  # free GPUs numbered apart from held ones
        for k, fraction in enumerate(parts):
            out["ts"].append(hour.timestamp() + shift)
            out["gpu"].append(f"{vc}/gpu{offset + k}")
            out["fraction"].append(fraction)
    return out


def import_history(folder: Path, days: float | None = None, end: datetime | None = None) -> Imported:
    sequences = load(folder)
    trace_end = max(f["time"].max() for f in sequences.values()).timestamp() + 60.0
    shift = shift_to(trace_end, end)
    tables = []
    for vc, frame in sequences.items():
        if days is not None:
            frame = frame[frame["time"].map(lambda t: t.timestamp()) >= trace_end - days * 86400.0]
        hourly = frame.groupby(frame["time"].dt.floor("h"))[["running_gpu_num", "idle_gpu_num"]].sum() / 60.0
        for allocated, column in ((True, "running_gpu_num"), (False, "idle_gpu_num")):
            rows = _rows(vc, hourly.index, hourly[column], allocated, shift)
            n = len(rows["ts"])
            data = {name: [None] * n for name in SAMPLE_SCHEMA.names}
            data.update(ts=pd.to_datetime(np.round(np.array(rows["ts"]) * 1e6).astype(np.int64), unit="us", utc=True),
                        interval_s=[HOUR] * n, node=[vc] * n, gpu_uuid=rows["gpu"], gpu_model=["unknown"] * n,
                        gpu_fraction=rows["fraction"], allocated=[allocated] * n,
                        team=[vc if allocated else None] * n, namespace=[vc if allocated else None] * n,
                        job_id=[f"{vc}/running" if allocated else None] * n, source=[SOURCE] * n)
            tables.append(pa.Table.from_pydict(data, schema=SAMPLE_SCHEMA))
    quotas = None
    quota_file = Path(folder) / QUOTAS
    if quota_file.is_file():
        daily = pd.read_csv(quota_file)
        last = daily[daily["date"] <= "2020-05-31"].iloc[-1]
        quotas = pd.DataFrame([{"team": vc, "gpu_model": "unknown", "guarantee_gpus": float(last[vc]),
                                "limit_gpus": None} for vc in sequences if vc in last.index])

    def gen() -> Iterator[pa.Table]:
        yield from tables
    return Imported(gen(), pd.DataFrame(), [
        f"{len(sequences)} virtual clusters of Earth as teams, hourly GPU-hours from their per-minute sequences",
        "no job log, GPU model or utilisation: allocation per VC and quotas are evidence, jobs and cost are not"],
        quotas, capacity=True)
