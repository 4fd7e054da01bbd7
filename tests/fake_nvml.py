"""A small stand-in for the hardware behind pynvml: the one thing faked, since no GPU is here.

Only device functions are replaced. Constants, error classes (NVMLError_NotSupported, ...)
and the ctypes result structures are the real ones from nvidia-ml-py, so NvmlSource sees
exactly the types and exceptions it would see on a real node.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml

MIB = 1024 * 1024


@dataclass
class FakeMig:
    uuid: str
    gi_id: int
    slices: int
    memory_mb: int
    used_mib: float
    processes: list[tuple[int, float]] = field(default_factory=list)  # (pid, used MiB)


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    util: int = 50
    total_mib: float = 81559
    used_mib: float = 1000
    reserved_mib: float = 300
    power_mw: int = 350_000
    temp_c: int = 55
    energy_mj: int = 1_000_000
    pcie_tx_kbps: int = 1000
    pcie_rx_kbps: int = 2000
    nvlink_kib: dict[int, int] = field(default_factory=dict)  # link -> cumulative KiB (tx and rx alike)
    processes: list[tuple[int, float]] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)  # names of nvml functions raising NotSupported
    migs: list[FakeMig] | None = None
    lost: bool = False


class FakeNvml:
    """Module-like object: attribute lookups fall back to the real pynvml for constants and errors."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.initialised = False
        self.init_error: int | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvmlDevice") or name in ("nvmlInit", "nvmlShutdown"):
            raise AttributeError(f"fake NVML does not implement {name}")
        return getattr(pynvml, name)

    def _check(self, fn: str, target: Any) -> None:
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if isinstance(target, FakeGpu) and fn in target.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if isinstance(target, FakeGpu) and target.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._check("count", None)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check("handle", None)
        gpu = self.gpus[index]
        self._check("nvmlDeviceGetHandleByIndex", gpu)
        return gpu

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._check("nvmlDeviceGetUUID", handle)
        return handle.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._check("nvmlDeviceGetName", handle)
        return handle.name

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> pynvml.c_nvmlUtilization_t:
        self._check("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=handle.util, memory=handle.util // 2)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        self._check("nvmlDeviceGetMemoryInfo", handle)
        if isinstance(handle, FakeMig):
            total, used, reserved = handle.memory_mb, handle.used_mib, 0
        else:
            total, used, reserved = handle.total_mib, handle.used_mib, handle.reserved_mib
        if version:
            return pynvml.c_nvmlMemory_v2_t(version=version, total=int(total * MIB), reserved=int(reserved * MIB),
                                            free=int((total - used - reserved) * MIB), used=int(used * MIB))
        return pynvml.c_nvmlMemory_t(total=int(total * MIB), free=int((total - used) * MIB), used=int(used * MIB))

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetPowerUsage", handle)
        return handle.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetTotalEnergyConsumption", handle)
        return handle.energy_mj

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature", handle)
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return handle.temp_c

    def nvmlDeviceGetPcieThroughput(self, handle: FakeGpu, counter: int) -> int:
        self._check("nvmlDeviceGetPcieThroughput", handle)
        return handle.pcie_tx_kbps if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else handle.pcie_rx_kbps

    def nvmlDeviceGetFieldValues(self, handle: FakeGpu, field_ids: list) -> Any:
        self._check("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, (fid, link) in enumerate(field_ids):
            values[i].fieldId, values[i].scopeId = fid, link
            if link in handle.nvlink_kib:
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[i].value.ullVal = handle.nvlink_kib[link]
            else:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list:
        self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        out = []
        for pid, used in handle.processes:
            info = pynvml.c_nvmlProcessInfo_v3_t(pid=pid, usedGpuMemory=int(used * MIB))
            out.append(pynvml.nvmlStructToFriendlyObject(info))
        return out

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> list[int]:
        self._check("nvmlDeviceGetMigMode", handle)
        enabled = pynvml.NVML_DEVICE_MIG_ENABLE if handle.migs is not None else pynvml.NVML_DEVICE_MIG_DISABLE
        return [enabled, enabled]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, index: int) -> FakeMig:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if handle.migs is None or index >= len(handle.migs):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return handle.migs[index]

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeMig) -> int:
        self._check("nvmlDeviceGetGpuInstanceId", handle)
        return handle.gi_id

    def nvmlDeviceGetAttributes(self, handle: FakeMig) -> Any:
        self._check("nvmlDeviceGetAttributes", handle)
        return pynvml.c_nvmlDeviceAttributes(gpuInstanceSliceCount=handle.slices, memorySizeMB=handle.memory_mb)
