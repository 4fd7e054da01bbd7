"""Microsoft's Philly trace (ATC '19, CC BY 4.0): the 4,206 real job-log entries of `sampled_jobs.json` (DRE's
sample: finished multi-GPU jobs of at least an hour, 2017-10-03 … 2017-12-15), each with the machines and GPUs it
ran on. Teams are the virtual clusters (`vc`), users the hashed `user`. The sample is biased towards large, long
jobs and holds no utilisation, so it is history for allocation, cost and queueing only."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pyarrow as pa

from gpuledger.collector.errors import InputError
from gpuledger.collector.traces.history import Holding, Imported, jobs_frame, samples_of, shift_to, window_start

SOURCE = "trace:philly"
JOBS = "sampled_jobs.json"
STATES = {"Pass": "completed", "Failed": "failed", "Killed": "cancelled"}


def _seconds(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()


def load_jobs(path: Path) -> list[dict]:
    """The job-log entries; `path` is the file or the folder holding it."""
    path = Path(path)
    path = path / JOBS if path.is_dir() else path
    if not path.is_file():
        raise InputError(f"{path} not found: give the philly folder (with {JOBS}) or the file")
    try:
        jobs = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not JSON: {exc}") from exc
    if not isinstance(jobs, list) or not all(isinstance(j, dict) and "detail" in j for j in jobs):
        raise InputError(f"{path}: not Philly's job log (a list of jobs with 'detail')")
    return jobs


def import_history(path: Path, days: float | None = None, end: datetime | None = None) -> Imported:
    """Every job's GPUs while it ran (the last `days` of the sample; None: all of it)."""
    jobs = load_jobs(path)
    holdings, records = [], []
    ends = [_seconds(j["end_time"]) for j in jobs if j.get("end_time")]
    trace_end = max(ends)
    lo = window_start(trace_end, days)
    for job in jobs:
        if not job.get("start_time") or not job.get("end_time"):
            continue
        start, stop = _seconds(job["start_time"]), _seconds(job["end_time"])
        gpus = [(d["ip"], g) for d in job["detail"] for g in d.get("gpus", [])]
        if stop < lo:
            continue
        for node, gpu in gpus:
            holdings.append(Holding(job["jobid"], job["vc"], job.get("user"), node, gpu, "unknown", 1.0,
                                    max(start, lo), stop))
        records.append({"job_id": job["jobid"], "team": job["vc"], "user": job.get("user"), "namespace": job["vc"],
                        "pod": None, "node": job["detail"][0]["ip"] if job["detail"] else None, "gpu_model": None,
                        "gpus": len(gpus), "submit_ts": _seconds(job["submitted_time"]), "start_ts": start,
                        "end_ts": stop, "state": STATES.get(job.get("status"), str(job.get("status")).lower())})
    shift = shift_to(trace_end, end)

    def tables() -> Iterator[pa.Table]:
        yield from samples_of(holdings, shift, SOURCE)
    return Imported(tables(), jobs_frame(records, shift), [
        f"{len(records):,} jobs on {len({h.node for h in holdings}):,} machines, {len({r['team'] for r in records})} "
        "virtual clusters as teams", "Philly's sample has no utilisation and no GPU model (unpriced): allocation, "
        "GPU-hours and queueing are evidence, cost and idle waste are not"])
