"""HAMi's vGPU monitor (`/metrics` of hami-vgpu-monitor, the per-node DaemonSet): what each container uses of a
GPU it shares.

Facts from HAMi's source (cmd/vGPUmonitor/metrics.go) and docs (dashboards/README.md):
- Per container (one series per container and virtual device): memory used in BYTES as
  `hami_vgpu_memory_used_bytes` and `hami_container_device_memory_bytes` (the same value; names of 2.8+, from
  2026-03), legacy `vGPU_device_memory_usage_in_bytes` and `Device_memory_desc_of_container` (the latter typed a
  COUNTER in older releases although it is a gauge, with its context/module/data/offset sizes as labels);
  SM use in PERCENT 0-100 (summed over the container's processes) as `hami_container_device_utilization_ratio`
  (despite the name), legacy `Device_utilization_desc_of_container`: divided by 100 into a fraction.
- Labels: new `namespace`, `pod`, `container`, `vdevice_index`, `device_uuid`; legacy `podnamespace`,
  `podname`, `ctrname`, `vdeviceid`, `deviceuuid`: the legacy names are renamed to the new ones, so the two
  generations of one series (a monitor run with --legacy-metrics writes both) are one series and the new name wins.
  The pod is the WORKLOAD's: where a Prometheus scrape attached the monitor's own `namespace`/`pod` it renamed the
  page's to `exported_namespace`/`exported_pod`, which therefore come first. A constant `zone` label is summed over.
- Per host GPU figures (`hami_host_gpu_*`, legacy `HostGPUMemoryUsage`, `HostCoreUtilization`) are not a
  container's and are read past (dcgm-exporter reads whole GPUs); `hami_vgpu_memory_limit_bytes` and the other
  per-container families hold no canonical figure. The HAMi scheduler's page (what pods asked for and were
  allocated, `hami_gpu_*_allocated_*`, legacy `GPUDeviceMemoryAllocated`, ...) is recognised as HAMi's and read
  past: an allocation is not a use.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from gpuledger.collector.apps.spec import ServerReader, Source

SOURCES = (
    Source("hami_vgpu_memory_used_bytes", "gpu_memory_used_bytes", note="2.8+"),
    Source("hami_container_device_memory_bytes", "gpu_memory_used_bytes", note="2.8+, the same value"),
    Source("vGPU_device_memory_usage_in_bytes", "gpu_memory_used_bytes", note="before 2.8 (and --legacy-metrics)"),
    Source("Device_memory_desc_of_container", "gpu_memory_used_bytes", note="before 2.8; typed counter in 2.4-2.5"),
    Source("hami_container_device_utilization_ratio", "gpu_core_use", 0.01, note="2.8+, percent 0-100"),
    Source("Device_utilization_desc_of_container", "gpu_core_use", 0.01, note="before 2.8, percent 0-100"),
)

KNOWN_UNUSED = frozenset({
    "hami_host_gpu_memory_used_bytes", "hami_host_gpu_utilization_ratio",
    "hami_host_gpu_memory_controller_utilization_ratio", "hami_vgpu_memory_limit_bytes",
    "hami_container_last_kernel_elapsed_seconds", "hami_mig_device_info", "hami_vgpu_memory_context_bytes",
    "hami_vgpu_memory_module_bytes", "hami_vgpu_memory_buffer_bytes", "HostGPUMemoryUsage", "HostCoreUtilization",
    "vGPU_device_memory_limit_in_bytes", "Device_last_kernel_of_container", "MigInfo", "hami_build_info",
    # the scheduler's page (cmd/scheduler/metrics.go): what was asked and allocated, not what is used
    "hami_gpu_memory_limit_bytes", "hami_gpu_core_limit_ratio", "hami_gpu_memory_allocated_bytes",
    "hami_gpu_shared_count", "hami_gpu_core_allocated_ratio", "hami_node_gpu_overview",
    "hami_node_gpu_memory_allocated_ratio", "hami_node_gpu_mig_instance_info", "hami_resource_quota_used",
    "hami_resource_quota_limit", "hami_vgpu_memory_allocated_bytes", "hami_vgpu_core_allocated_ratio",
})
# the scheduler's legacy names (before 2.8): HAMi's own, so a page of them is HAMi's too
LEGACY_SCHEDULER = frozenset({
    "GPUDeviceMemoryLimit", "GPUDeviceCoreLimit", "GPUDeviceMemoryAllocated", "GPUDeviceSharedNum",
    "GPUDeviceCoreAllocated", "nodeGPUOverview", "nodeGPUMemoryPercentage", "nodeGPUMigInstance", "QuotaUsed",
    "vGPUMemoryAllocated", "vGPUCoreAllocated",
})

READER = ServerReader(
    kind="hami",
    sources=SOURCES,
    prefixes=("hami_",),
    identity_labels=("container", "vdevice_index", "device_uuid"),
    label_renames={"podnamespace": "namespace", "podname": "pod", "ctrname": "container",
                   "vdeviceid": "vdevice_index", "deviceuuid": "device_uuid"},
    pod_labels=("exported_pod", "pod", "kubernetes_pod_name", "pod_name"),
    namespace_labels=("exported_namespace", "namespace", "kubernetes_namespace"),
    known_unused=KNOWN_UNUSED,
    # the legacy host families are HAMi's own names: a page with only them (an exclusive GPU) is still HAMi's
    mark_names=frozenset({"HostGPUMemoryUsage", "HostCoreUtilization", "vGPU_device_memory_limit_in_bytes",
                          "Device_last_kernel_of_container"}) | LEGACY_SCHEDULER,
)


# What each container measurably used of each physical GPU it shares, for the GPU sources' split (dcgm_source.py
# bill_each_gpu_once): the device's own readings are the device's, so a sharer's utilisation comes from here.
CORE, MEMORY = "gpu_core_use", "gpu_memory_used_bytes"
USE_FAMILIES = tuple(s.family for s in SOURCES)
MIB = 1024.0 * 1024.0


@dataclass(frozen=True)
class GpuUse:
    """One pod's measured use of one physical GPU (summed over its containers): the share of the device's SM time
    (0..1, HAMi's per-container utilisation over 100) and memory in MiB; None where the monitor gave none."""
    core: float | None
    mem_mib: float | None


class ContainerUse:
    """HAMi's per-container series over a stretch of time, read back from Prometheus (a range selector's samples):
    `at(ts)` gives each pod's use of each GPU at an instant, from each series' newest sample not older than the
    lookback. A figure is read from the first of SOURCES that has the series (new names before legacy ones, as
    the page reader does), so a monitor writing both generations is not counted twice."""

    def __init__(self, series: list[tuple[str, dict[str, str], list[tuple[float, float]]]],
                 lookback_s: float = 120.0) -> None:
        self.lookback_s = lookback_s
        order = {s.family: i for i, s in enumerate(SOURCES)}
        best: dict[tuple, tuple[int, list[tuple[float, float]]]] = {}
        for family, labels, values in series:
            index = order.get(family)
            if index is None:
                continue
            _, _, namespace, pod = READER.identity(labels)
            renamed = {READER.label_renames.get(k, k): v for k, v in labels.items()}
            uuid = renamed.get("device_uuid")
            if not pod or not uuid:
                continue
            source = SOURCES[index]
            key = (source.figure, namespace, pod, uuid, renamed.get("container", ""), renamed.get("vdevice_index", ""))
            if key not in best or index < best[key][0]:
                scale = source.scale / (MIB if source.figure == MEMORY else 1.0)
                best[key] = (index, sorted((float(t), float(v) * scale) for t, v in values
                                           if math.isfinite(float(v)) and float(v) >= 0))
        self.series = {key: points for key, (_, points) in best.items() if points}

    def at(self, ts: float) -> dict[tuple[str | None, str], dict[str, GpuUse]]:
        """(namespace, pod) -> GPU UUID -> its use at `ts`."""
        sums: dict[tuple, dict[str, float]] = {}
        for (figure, namespace, pod, uuid, _, _), points in self.series.items():
            i = bisect.bisect_right(points, (ts, math.inf))
            if i and ts - points[i - 1][0] <= self.lookback_s:
                slot = sums.setdefault((namespace, pod, uuid), {})
                slot[figure] = slot.get(figure, 0.0) + points[i - 1][1]
        out: dict[tuple[str | None, str], dict[str, GpuUse]] = {}
        for (namespace, pod, uuid), figures in sums.items():
            core = figures.get(CORE)
            out.setdefault((namespace, pod), {})[uuid] = GpuUse(min(core, 1.0) if core is not None else None,
                                                                figures.get(MEMORY))
        return out
