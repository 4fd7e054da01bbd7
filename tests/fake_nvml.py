"""A small stand-in for the hardware behind pynvml: the one thing faked, since no GPU is here.

Only device functions are replaced. Constants, error classes (NVMLError_NotSupported, ...)
and the ctypes result structures are the real ones from nvidia-ml-py, so NvmlSource sees
exactly the types and exceptions it would see on a real node.

GPM (nvmlGpm*) is faked the same way: samples are real `c_nvmlGpmSample_t` pointers (to
buffers the fake owns), so they fit the real `c_nvmlGpmMetricsGet_t` the source fills, and a
metric is computed from what the GPU did between its two samples (`FakeGpmActivity.run`), so a
source that reused or leaked samples reads wrong values or fails the alloc/free count. Stricter
than NVML documents, it refuses a sample1 taken after sample2 (Invalid Argument), and a sample
freed twice fails the test (AssertionError) where the real library would corrupt memory.
`FakeNvml(gpm_library=False)` is an nvidia-ml-py from before GPM (the names are absent: the
module raises AttributeError); `gpm_driver=False` a new one on a driver without GPM (every
nvmlGpm* raises NVMLError_FunctionNotFound, as pynvml's _nvmlGetFunctionPointer does).
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

MIB = 1024 * 1024
# names of GPU models whose NVML answers isSupportedDevice=1 (Hopper and later), for FakeGpu(gpm=None)
HOPPER_OR_LATER = re.compile(r"\b(?:G?H(?:100|200|800|20)|G?B(?:100|200|300))\b")
GPM_NAMES = ("nvmlGpm", "NVML_GPM_", "c_nvmlGpm", "struct_c_nvmlGpm")  # what an nvidia-ml-py before GPM lacks


@dataclass
class FakeGpmActivity:
    """What a GPU (or a MIG instance) did, as GPM's counters see it: per metric the integral of its value over
    the GPU's own time, so a metric between two samples is (counter2 - counter1) / (time2 - time1)."""

    clock_s: float = 0.0
    integrals: dict[int, float] = field(default_factory=dict)  # GPM metric id -> value x seconds so far

    def run(self, seconds: float, values: dict[int, float]) -> None:
        """The GPU spends `seconds` at `values` (GPM metric id -> percent or MiB/s; others 0)."""
        self.clock_s += seconds
        for metric_id, value in values.items():
            self.integrals[metric_id] = self.integrals.get(metric_id, 0.0) + value * seconds


@dataclass
class FakeGpmSample:
    owner: int  # id() of the FakeGpu or FakeMig sampled
    taken: int  # the fake's count of samples read when this one was: which of two samples is the earlier
    clock_s: float
    integrals: dict[int, float]


@dataclass
class FakeMig:
    uuid: str
    gi_id: int
    slices: int
    memory_mb: int
    used_mib: float
    processes: list[tuple[int, float]] = field(default_factory=list)  # (pid, used MiB)
    activity: FakeGpmActivity = field(default_factory=FakeGpmActivity)  # read by nvmlGpmMigSampleGet


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
    # per-process utilisation samples NVML keeps: (pid, smUtil %); their timeStamps are the fake's clock (µs)
    process_util: list[tuple[int, int]] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)  # names of nvml functions raising NotSupported
    migs: list[FakeMig] | None = None
    lost: bool = False
    clocks_event_reasons: int = 0  # NVML's bitmask
    ecc_corrected: int = 0  # volatile ECC counts since boot
    ecc_uncorrected: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # (correctable, uncorrectable, pending, failure)
    gpm: bool | None = None  # nvmlGpmQueryDeviceSupport's isSupportedDevice; None: Hopper or later by the name
    activity: FakeGpmActivity = field(default_factory=FakeGpmActivity)
    gpm_failing: dict[int, int] = field(default_factory=dict)  # GPM metric id -> the nvmlReturn NVML gives it
    # topology: None bus id: the fake numbers GPUs 00000000:<index + 1>:00.0 in its list's order
    pci_bus_id: str | None = None
    numa_node: int | None = 0  # None: NVML answers NotSupported (a system without NUMA information)
    cpus: tuple[int, ...] = ()  # the CPUs close to the GPU (nvmlDeviceGetCpuAffinity's bitmask)
    nvlinks: dict[int, tuple[int, str]] = field(default_factory=dict)  # active link -> (remote type, remote bus id)
    nvlink_ports: int = 18  # NVLink links of the card (a higher index: Invalid Argument); 0: no NVLink at all
    fabric: tuple[bytes, int] | None = None  # (cluster UUID's 16 bytes, clique id) of a multi-node NVLink GPU

    def gpm_supported(self) -> bool:
        return self.gpm if self.gpm is not None else bool(HOPPER_OR_LATER.search(self.name))


@dataclass
class FakeEventSet:
    registered: set[int] = field(default_factory=set)  # id() of the GPUs registered for XID events
    pending: list[Any] = field(default_factory=list)  # events not yet waited for (c_nvmlEventData_t's fields)


class FakeNvml:
    """Module-like object: attribute lookups fall back to the real pynvml for constants and errors."""

    def __init__(self, gpus: list[FakeGpu], gpm_library: bool = True, gpm_driver: bool = True) -> None:
        self.gpus = gpus
        self.initialised = False
        self.init_error: int | None = None
        self.event_sets: list[FakeEventSet] = []
        self.gpm_library = gpm_library  # False: an nvidia-ml-py without the GPM names
        self.gpm_driver = gpm_driver  # False: a driver whose libnvidia-ml has no nvmlGpm* symbols
        self.gpm_samples: dict[int, FakeGpmSample | None] = {}  # address -> what it holds (None: not yet read)
        self._gpm_buffers: dict[int, ctypes.Array] = {}  # keeps every live sample's memory (and address) owned
        self.gpm_allocs = 0
        self.gpm_frees = 0
        self.gpm_reads = 0
        self.levels: dict[frozenset[str], int] = {}  # GPU pair -> NVML_TOPOLOGY_* (default: by NUMA node)

    def raise_xid(self, gpu: FakeGpu, code: int) -> None:
        """The driver reports XID `code` on `gpu`: every event set it is registered with gets it."""
        for events in self.event_sets:
            if id(gpu) in events.registered:
                events.pending.append(SimpleNamespace(device=gpu, eventType=pynvml.nvmlEventTypeXidCriticalError,
                                                      eventData=code, gpuInstanceId=0xFFFFFFFF,
                                                      computeInstanceId=0xFFFFFFFF))

    def __getattribute__(self, name: str) -> Any:
        if name.startswith(GPM_NAMES) and not object.__getattribute__(self, "gpm_library"):
            raise AttributeError(f"module 'pynvml' has no attribute '{name}'")  # as an old nvidia-ml-py says
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("nvmlDevice", "nvmlEventSet", "nvmlGpm")) or name in ("nvmlInit", "nvmlShutdown"):
            raise AttributeError(f"fake NVML does not implement {name}")
        if name.startswith(GPM_NAMES) and not self.gpm_library:  # GPM's constants and structs, too
            raise AttributeError(f"module 'pynvml' has no attribute '{name}'")
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

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list:  # noqa: N803 - pynvml's name
        """As nvidia-ml-py returns them: c_nvmlProcessUtilizationSample_t structs newer than `timeStamp`; NotFound
        where there are none (NVML's answer for a GPU without process samples), NotSupported on a MIG device."""
        self._check("nvmlDeviceGetProcessUtilization", handle)
        if not isinstance(handle, FakeGpu):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        samples = []
        for i, (pid, sm) in enumerate(handle.process_util):
            stamp = 1_000_000 * (i + 1)
            if stamp > timeStamp:
                samples.append(pynvml.c_nvmlProcessUtilizationSample_t(pid=pid, timeStamp=stamp, smUtil=sm, memUtil=0,
                                                                       encUtil=0, decUtil=0))
        if not samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return samples

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

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return handle.clocks_event_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, error_type: int, counter_type: int) -> int:
        self._check("nvmlDeviceGetTotalEccErrors", handle)
        assert counter_type in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC)
        return handle.ecc_corrected if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else handle.ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, handle: FakeGpu) -> tuple[int, int, int, int]:
        self._check("nvmlDeviceGetRemappedRows", handle)
        return handle.remapped_rows

    # topology

    def bus_id(self, gpu: FakeGpu) -> str:
        return gpu.pci_bus_id or f"00000000:{self.gpus.index(gpu) + 1:02x}:00.0"

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> Any:
        self._check("nvmlDeviceGetPciInfo", handle)
        bus = self.bus_id(handle).upper().encode()  # NVML writes the hex digits in upper case
        return pynvml.nvmlPciInfo_t(busIdLegacy=bus[-16:], busId=bus)

    def nvmlDeviceGetNumaNodeId(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetNumaNodeId", handle)
        if handle.numa_node is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle.numa_node

    def nvmlDeviceGetCpuAffinity(self, handle: FakeGpu, cpuSetSize: int) -> Any:  # noqa: N803 - pynvml's name
        self._check("nvmlDeviceGetCpuAffinity", handle)
        words = (ctypes.c_ulonglong * cpuSetSize)()
        for cpu in handle.cpus:
            if cpu < 64 * cpuSetSize:
                words[cpu // 64] |= 1 << (cpu % 64)
        return words

    def _link(self, handle: FakeGpu, link: int) -> tuple[int, str] | None:
        self._check("nvlink", handle)
        if not handle.nvlink_ports:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < handle.nvlink_ports:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.nvlinks.get(link)

    def nvmlDeviceGetNvLinkState(self, device: FakeGpu, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState", device)
        return pynvml.NVML_FEATURE_ENABLED if self._link(device, link) else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: FakeGpu, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkRemoteDeviceType", handle)
        remote = self._link(handle, link)
        if remote is None:  # an inactive link has no remote end
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return remote[0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: FakeGpu, link: int) -> Any:
        self._check("nvmlDeviceGetNvLinkRemotePciInfo", device)
        remote = self._link(device, link)
        if remote is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.nvmlPciInfo_t(busId=remote[1].upper().encode())

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: FakeGpu, device2: FakeGpu) -> int:
        self._check("nvmlDeviceGetTopologyCommonAncestor", device1)
        self._check("nvmlDeviceGetTopologyCommonAncestor", device2)
        key = frozenset((device1.uuid, device2.uuid))
        if key in self.levels:
            return self.levels[key]
        same = device1.numa_node is not None and device1.numa_node == device2.numa_node
        return pynvml.NVML_TOPOLOGY_NODE if same else pynvml.NVML_TOPOLOGY_SYSTEM

    def nvmlDeviceGetP2PStatus(self, device1: FakeGpu, device2: FakeGpu, p2pIndex: int) -> int:  # noqa: N803
        """NVLink peer-to-peer as device1 sees it: a link of its own to device2, or a switch both are linked to."""
        self._check("nvmlDeviceGetP2PStatus", device1)
        self._check("nvmlDeviceGetP2PStatus", device2)
        if p2pIndex != pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
            return pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
        mine = set(device1.nvlinks.values())
        theirs = {bus for kind, bus in device2.nvlinks.values() if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH}
        direct = (pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, self.bus_id(device2)) in mine
        switched = any(kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH and bus in theirs for kind, bus in mine)
        return pynvml.NVML_P2P_STATUS_OK if direct or switched else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetGpuFabricInfo(self, device: FakeGpu, gpuFabricInfo: Any) -> int:  # noqa: N803
        """Fills the c_nvmlGpuFabricInfo_t passed by reference (ctypes.byref), as the C function does."""
        self._check("nvmlDeviceGetGpuFabricInfo", device)
        if device.fabric is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = gpuFabricInfo._obj
        cluster, clique = device.fabric
        ctypes.memmove(info.clusterUuid, cluster, 16)
        info.cliqueId, info.status = clique, pynvml.NVML_SUCCESS
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        return pynvml.NVML_SUCCESS

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._check("nvmlEventSetCreate", None)
        events = FakeEventSet()
        self.event_sets.append(events)
        return events

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, event_types: int, event_set: FakeEventSet) -> None:
        self._check("nvmlDeviceRegisterEvents", handle)
        if event_types & pynvml.nvmlEventTypeXidCriticalError:
            event_set.registered.add(id(handle))

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeout_ms: int) -> Any:
        self._check("nvmlEventSetWait_v2", None)
        if not event_set.pending:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return event_set.pending.pop(0)

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._check("nvmlEventSetFree", None)
        self.event_sets.remove(event_set)

    # GPM

    def live_gpm_samples(self) -> int:
        """Samples allocated and not yet freed."""
        return len(self.gpm_samples)

    def _gpm_check(self, fn: str, target: Any) -> None:
        if not self.gpm_driver:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        self._check(fn, target)

    def _gpm_address(self, sample: Any) -> int:
        address = ctypes.cast(sample, ctypes.c_void_p).value
        if address not in self.gpm_samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # freed, or never allocated here
        return address

    def nvmlGpmQueryDeviceSupport(self, handle: FakeGpu) -> Any:
        self._gpm_check("nvmlGpmQueryDeviceSupport", handle)
        return pynvml.c_nvmlGpmSupport_t(version=pynvml.NVML_GPM_SUPPORT_VERSION,
                                         isSupportedDevice=int(handle.gpm_supported()))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._gpm_check("nvmlGpmSampleAlloc", None)
        buffer = ctypes.create_string_buffer(16)
        address = ctypes.addressof(buffer)
        self._gpm_buffers[address] = buffer
        self.gpm_samples[address] = None
        self.gpm_allocs += 1
        return ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._gpm_check("nvmlGpmSampleFree", None)
        address = ctypes.cast(sample, ctypes.c_void_p).value
        assert address in self.gpm_samples, "a GPM sample freed twice, or one NVML never allocated"
        del self.gpm_samples[address]
        del self._gpm_buffers[address]
        self.gpm_frees += 1

    def _gpm_read(self, sample: Any, target: FakeGpu | FakeMig) -> Any:
        self.gpm_reads += 1
        self.gpm_samples[self._gpm_address(sample)] = FakeGpmSample(
            owner=id(target), taken=self.gpm_reads, clock_s=target.activity.clock_s,
            integrals=dict(target.activity.integrals))
        return sample

    def nvmlGpmSampleGet(self, device: FakeGpu, sample: Any) -> Any:
        self._gpm_check("nvmlGpmSampleGet", device)
        if not device.gpm_supported():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._gpm_read(sample, device)

    def nvmlGpmMigSampleGet(self, device: FakeGpu, gpu_instance_id: int, sample: Any) -> Any:
        self._gpm_check("nvmlGpmMigSampleGet", device)
        if not device.gpm_supported():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mig = next((m for m in device.migs or [] if m.gi_id == gpu_instance_id), None)
        if mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return self._gpm_read(sample, mig)

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._gpm_check("nvmlGpmMetricsGet", None)
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self.gpm_samples[self._gpm_address(request.sample1)]
        second = self.gpm_samples[self._gpm_address(request.sample2)]
        if first is None or second is None or first.owner != second.owner:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if second.taken <= first.taken:  # stricter than NVML documents: sample1 must be the earlier one
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        owner = next((g for g in self.gpus if id(g) == first.owner), None)
        failing = owner.gpm_failing if owner is not None else {}
        elapsed = second.clock_s - first.clock_s
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in failing:
                metric.nvmlReturn, metric.value = failing[metric.metricId], 0.0
                continue
            done = second.integrals.get(metric.metricId, 0.0) - first.integrals.get(metric.metricId, 0.0)
            metric.nvmlReturn = pynvml.NVML_SUCCESS
            metric.value = done / elapsed if elapsed else 0.0
        return request


def nvswitch_board(nvml: FakeNvml, gpus: list[FakeGpu], switches: int = 4, links: int = 18,
                   switch_bus: str = "00000000:e0:00.0") -> None:
    """An HGX board: every GPU's links go to the board's NVSwitches (remote type SWITCH), none to a GPU."""
    base = int(switch_bus.split(":")[1], 16)
    for gpu in gpus:
        gpu.nvlink_ports = links
        gpu.nvlinks = {link: (pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH,
                              f"{switch_bus[:9]}{base + link % switches:02x}:00.0") for link in range(links)}


def bridge(nvml: FakeNvml, a: FakeGpu, b: FakeGpu, links: int = 4, first: int = 0) -> None:
    """An NVLink bridge between two cards: `links` direct links each way."""
    for gpu, peer in ((a, b), (b, a)):
        gpu.nvlink_ports = max(gpu.nvlink_ports, first + links) if gpu.nvlink_ports else first + links
        for link in range(first, first + links):
            gpu.nvlinks[link] = (pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, nvml.bus_id(peer))
