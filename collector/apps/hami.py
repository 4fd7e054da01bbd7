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
