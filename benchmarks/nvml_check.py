"""Check the NVML source on a real GPU node before deploying the agent there.

The tests run the NVML source against a fake (tests/fake_nvml.py), since CI has no GPU. This script runs the
unchanged source against the node's real driver: it reads every GPU a few times (optionally while a load runs,
so utilisation, power and SM activity move), prints what each sample field read, compares utilisation, memory
and power with `nvidia-smi`, and checks that every name the driver reports (model, UUID, MIG profile) passes
the identifier rule ingest applies (collector/identifiers.py): a real driver's strings must never be refused.

    python benchmarks/nvml_check.py [--reads 4] [--interval 1] [--load-seconds 8] [--json FILE]

It needs only nvidia-ml-py and pyarrow (and torch for --load-seconds); it exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

from gpuledger.collector.identifiers import is_identifier
from gpuledger.collector.nvml_source import NvmlSource

NAME_FIELDS = {"gpu_model": "gpu_model", "model_name": "model_name", "gpu_uuid": "gpu_uuid",
               "mig_profile": "mig_profile", "node": "node", "source": "source"}


def _load(seconds: float, stop: threading.Event) -> str:
    """Keep the first GPU busy with bf16 matrix products (torch), so the readings are not all idle."""
    try:
        import torch
    except ImportError:
        return "no torch: readings taken idle"
    if not torch.cuda.is_available():
        return "torch sees no GPU: readings taken idle"
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        (a @ a).sum().item()
    return f"load ran on {torch.cuda.get_device_name(0)}"


def _smi() -> list[dict[str, float]]:
    """utilisation, memory used and power per GPU as nvidia-smi reads them (empty when it is missing)."""
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,power.draw",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30).stdout
    rows = []
    for line in out.strip().splitlines():
        util, mem, power = (part.strip() for part in line.split(","))
        rows.append({"util_pct": float(util), "mem_used_mib": float(mem), "power_w": float(power)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reads", type=int, default=4, help="collections to make (default 4)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between collections (default 1)")
    p.add_argument("--load-seconds", type=float, default=0.0, help="run a torch load on GPU 0 meanwhile")
    p.add_argument("--json", help="also write the readings to this file")
    args = p.parse_args(argv)
    stop = threading.Event()
    load_note: list[str] = []
    loader = None
    if args.load_seconds > 0:
        loader = threading.Thread(target=lambda: load_note.append(_load(args.load_seconds, stop)), daemon=True)
        loader.start()
        time.sleep(min(3.0, args.load_seconds / 2))  # let the load reach the GPU before the first read
    source = NvmlSource(interval_s=args.interval)
    failures: list[str] = []
    reads: list[list[dict[str, Any]]] = []
    smi: list[dict[str, float]] = []
    for i in range(args.reads):
        started = time.perf_counter()
        rows = source.collect().to_pylist()
        took = time.perf_counter() - started
        smi = _smi()
        reads.append(rows)
        print(f"read {i + 1}: {len(rows)} row(s) in {took * 1000:.1f} ms")
        time.sleep(args.interval)
    stop.set()
    if loader is not None:
        loader.join()
        print(load_note[0] if load_note else "load did not report")
    last = reads[-1]
    if not last:
        failures.append("the NVML source read no GPU")
    for row in last:
        print(f"\nGPU {row['gpu_index']} ({row['model_name']}, {row['gpu_uuid']}):")
        for key, value in row.items():
            shown = "—" if value is None or (isinstance(value, float) and math.isnan(value)) else value
            print(f"  {key:22} {shown}")
        for field, kind in NAME_FIELDS.items():
            value = row.get(field)
            if value is not None and not is_identifier(kind, value):
                failures.append(f"GPU {row['gpu_index']}: {field} {value!r} would be refused at ingest")
    whole = [r for r in last if r.get("mig_instance") is None]
    for row, ref in zip(whole, smi):
        for key, tolerance in (("mem_used_mib", 64.0), ("power_w", 150.0), ("util_pct", 60.0)):
            ours, theirs = row.get(key), ref[key]
            if ours is None:
                print(f"GPU {row['gpu_index']}: {key} not read (nvidia-smi: {theirs})")
            elif abs(ours - theirs) > tolerance:
                failures.append(f"GPU {row['gpu_index']}: {key} {ours} vs nvidia-smi {theirs}")
            else:
                print(f"GPU {row['gpu_index']}: {key} {ours} vs nvidia-smi {theirs}: agree within {tolerance}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"reads": reads, "nvidia_smi": smi, "failures": failures}, fh, default=str, indent=1)
    source.close()
    print("\n" + ("\n".join(f"FAIL {f}" for f in failures) if failures else "all checks passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
