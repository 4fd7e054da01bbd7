"""Render GPU samples as a dcgm-exporter /metrics page.

This is the inverse of DcgmPageConverter. It lets the simulator stand in for a real
dcgm-exporter over HTTP (for tests, benchmarks and multi-node demos), with the same label
layout dcgm-exporter uses: gpu, UUID, pci_bus_id, device, modelName, Hostname, MIG
GPU_I_PROFILE/GPU_I_ID, and pod/namespace/container when a pod holds the GPU.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from gpuledger.collector.dcgm_source import FIELD_COLUMNS

# The fields we render, in dcgm-exporter's usual order, with their HELP text; columns come from FIELD_COLUMNS.
_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "gauge"),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge"),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge"),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", "gauge"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", "gauge"),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", "gauge"),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.", "gauge"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", "gauge"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active.", "gauge"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus.", "gauge"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus.", "gauge"),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "The rate of data transmitted over NVLink.", "gauge"),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "The rate of data received over NVLink.", "gauge"),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "gauge"),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons.", "gauge"),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", "counter"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", "counter"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors.", "counter"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors.", "counter"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed.", "gauge"),
)


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(row: dict[str, Any], driver: str) -> str:
    index = row.get("gpu_index")
    parts = [
        ("gpu", index), ("UUID", row.get("gpu_uuid")), ("pci_bus_id", f"00000000:{(index or 0) + 0x18:02X}:00.0"),
        ("device", f"nvidia{index}"), ("modelName", row.get("model_name")), ("Hostname", row.get("node")),
    ]
    if row.get("mig_profile"):
        parts += [("GPU_I_PROFILE", row["mig_profile"]), ("GPU_I_ID", row.get("mig_instance"))]
    parts.append(("DCGM_FI_DRIVER_VERSION", driver))
    if row.get("pod"):
        parts += [("container", row.get("container") or ""), ("namespace", row.get("namespace") or ""),
                  ("pod", row["pod"])]
    return ",".join(f'{k}="{_escape(v)}"' for k, v in parts if v is not None)


def render_page(samples: pa.Table, driver: str = "550.54.15", help_lines: bool = True) -> str:
    rows = samples.to_pylist()
    labels = [_labels(row, driver) for row in rows]
    out: list[str] = []
    for name, help_text, kind in _FIELDS:
        column = FIELD_COLUMNS.get(name, (None,))[0]
        if help_lines:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
        for row, label in zip(rows, labels):
            if name == "DCGM_FI_DEV_SM_CLOCK":
                value = 1980
            elif name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
                value = (row.get("util_pct") or 0) / 100.0
            else:
                value = row.get(column)
                if value is None:
                    continue
                if isinstance(value, bool):
                    value = int(value)
            out.append(f"{name}{{{label}}} {value:.6g}" if isinstance(value, float) else f"{name}{{{label}}} {value}")
    return "\n".join(out) + "\n"
