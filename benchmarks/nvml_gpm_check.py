"""Check the NVML source's GPM profiling columns on a real GPU node (Hopper or later for values).

The tests read GPM through a fake (tests/fake_nvml.py); this script runs the unchanged NVML source against the
node's driver: it collects a few times, `--interval` seconds apart, and prints per GPU (and MIG instance) whether
GPM was supported and what the profiling, PCIe and NVLink columns read. The first read has no profiling values
by design (GPM needs two samples); from the second on, a GPU that said it supports GPM must fill them.

    python benchmarks/nvml_gpm_check.py [--reads 3] [--interval 2] [--load]

--load keeps GPU 0 busy with bf16 matrix products (needs torch) so that sm_active and tensor_active move. It exits
0 with a message where there is no nvidia-ml-py, no driver or no GPU, and 1 when a GPM GPU left a column empty.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

COLUMNS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "util_pct",
           "pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps")
PROFILING = COLUMNS[:4]


def _busy(stop: threading.Event) -> str:
    """Run bf16 matrix products on GPU 0 until `stop`, so the tensor pipes have something to report."""
    try:
        import torch
    except ImportError:
        return "no torch: read idle"
    if not torch.cuda.is_available():
        return "torch sees no GPU: read idle"
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        (a @ a).sum().item()
    return f"load ran on {torch.cuda.get_device_name(0)}"


def _shown(column: str, value: Any) -> str:
    if value is None:
        return "—"
    return f"{value / 1e6:.1f} MB/s" if column.endswith("_bps") else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reads", type=int, default=3, help="collections to make (default 3)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between collections (default 2)")
    p.add_argument("--load", action="store_true", help="keep GPU 0 busy meanwhile (torch)")
    args = p.parse_args(argv)
    try:
        import pynvml  # noqa: F401  (only to say plainly when it is missing)
    except ImportError:
        print("no nvidia-ml-py (pynvml) here: nothing to check")
        return 0
    from gpuledger.collector.nvml_source import NvmlSource
    from gpuledger.collector.source import SourceError

    source = NvmlSource(interval_s=args.interval)
    stop, note, loader = threading.Event(), [], None
    if args.load:
        loader = threading.Thread(target=lambda: note.append(_busy(stop)), daemon=True)
        loader.start()
        time.sleep(3.0)  # let the load reach the GPU
    failures: list[str] = []
    try:
        for read in range(1, args.reads + 1):
            if read > 1:
                time.sleep(args.interval)
            try:
                rows = source.collect().to_pylist()
            except SourceError as exc:
                print(f"no NVML to read here ({exc}): nothing to check")
                return 0
            if not rows:
                print("NVML sees no GPU here: nothing to check")
                return 0
            print(f"\nread {read}:")
            for row in rows:
                mig = row["mig_instance"]
                where = f"GPU {row['gpu_index']}" + (f" MIG {mig}" if mig is not None else "")
                gpm = source.gpm_support.get(row["gpu_uuid"])
                print(f"  {where} ({row['model_name']}), GPM supported: {'not asked' if gpm is None else gpm}")
                print("    " + "  ".join(f"{c}={_shown(c, row.get(c))}" for c in COLUMNS))
                empty = [c for c in PROFILING if row.get(c) is None]
                if gpm and read > 1 and empty:
                    failures.append(f"read {read}, {where}: GPM supported but {', '.join(empty)} empty")
                bad = [c for c in PROFILING if row.get(c) is not None and not 0.0 <= row[c] <= 1.0]
                failures += [f"read {read}, {where}: {c}={row[c]} is not a fraction" for c in bad]
    finally:
        stop.set()
        if loader is not None:
            loader.join()
            print("\n" + (note[0] if note else "load did not report"))
        source.close()
    print("\n" + ("\n".join(f"FAIL {f}" for f in failures) if failures else "all checks passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
