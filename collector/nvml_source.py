"""Read GPUs on this node through NVML (nvidia-ml-py, imported as pynvml).

Every field read is guarded: NVMLError_NotSupported (common on MIG instances, consumer
boards and older drivers) drops that field for that device from then on, and the rest of
the sample is still emitted. Cumulative NVLink counters are turned into rates here, since
a rate across a counter reset would be negative traffic.
"""
from __future__ import annotations

import importlib
import logging
import math
import socket
import time
from datetime import datetime, timezone
from types import ModuleType
from typing import Any, Callable

import pyarrow as pa

from gpuledger.collector.attribution import Attributor
from gpuledger.collector.counters import RateTracker
from gpuledger.collector.gpu_catalog import mig_fraction, normalize_model, vgpu_share
from gpuledger.collector.metrics import SAMPLES_READ, SCRAPE_ERRORS, SCRAPE_SECONDS
from gpuledger.collector.proc_attribution import describe_process
from gpuledger.collector.samples import PROCESS_SCHEMA, rows_to_table
from gpuledger.collector.source import Source, SourceError

log = logging.getLogger(__name__)
MIB = 1024 * 1024


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource(Source):
    def __init__(
        self,
        nvml: ModuleType | None = None,
        interval_s: float = 10.0,
        attributor: Attributor | None = None,
        proc_root: str = "/proc",
        node: str | None = None,
        nvlink_links: int | None = None,
    ) -> None:
        self.nvml = nvml or importlib.import_module("pynvml")
        self.name = "nvml"
        self.interval_s = interval_s
        self.attributor = attributor or Attributor()
        self.proc_root = proc_root
        self.node = node or socket.gethostname()
        self.nvlink_links = nvlink_links or getattr(self.nvml, "NVML_NVLINK_MAX_LINKS", 18)
        self._initialised = False
        self._unsupported: set[tuple[str, str]] = set()
        self._xid_events: Any = None  # NVML event set for XID errors (None: not created, or not supported)
        self._xid_watched: set[str] = set()  # GPUs registered with it
        self._last_xid: dict[str, int] = {}  # GPU UUID -> last XID seen, kept like DCGM's XID field (0: none)
        self.rates = RateTracker(interval_s)
        self.processes: pa.Table = PROCESS_SCHEMA.empty_table()  # the last collect's, for process_rows

    def _init(self) -> None:
        if not self._initialised:
            try:
                self.nvml.nvmlInit()
            except self.nvml.NVMLError as exc:
                SCRAPE_ERRORS.labels(source="nvml", reason="init").inc()
                raise SourceError(f"NVML init failed: {exc}") from exc
            self._initialised = True

    def close(self) -> None:
        if self._initialised:
            if self._xid_events is not None:
                try:
                    self.nvml.nvmlEventSetFree(self._xid_events)
                except self.nvml.NVMLError:
                    pass
                self._xid_events = None
            self.nvml.nvmlShutdown()
            self._initialised = False

    def _read(self, uuid: str, field: str, fn: Callable[[], Any]) -> Any:
        """Call one NVML getter; NotSupported marks the field as absent for this device for good."""
        if (uuid, field) in self._unsupported:
            return None
        try:
            return fn()
        except self.nvml.NVMLError_NotSupported:
            self._unsupported.add((uuid, field))
            SCRAPE_ERRORS.labels(source="nvml", reason=f"not_supported:{field}").inc()
            log.info("NVML: %s not supported on %s; skipping it from now on", field, uuid)
        except self.nvml.NVMLError as exc:
            SCRAPE_ERRORS.labels(source="nvml", reason=f"error:{field}").inc()
            log.warning("NVML: reading %s on %s failed: %s", field, uuid, exc)
        return None

    def collect(self) -> pa.Table:
        self._init()
        started = time.perf_counter()
        now = datetime.now(timezone.utc)
        rows: list[dict[str, Any]] = []
        procs: list[dict[str, Any]] = []
        nvml = self.nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            SCRAPE_ERRORS.labels(source="nvml", reason="device_count").inc()
            raise SourceError(f"NVML cannot count devices: {exc}") from exc
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                model_name = _text(nvml.nvmlDeviceGetName(handle))
            except nvml.NVMLError as exc:  # a lost GPU must not hide the others
                SCRAPE_ERRORS.labels(source="nvml", reason="device_lost").inc()
                log.error("NVML: GPU %d unreadable: %s", index, exc)
                continue
            model = normalize_model(model_name)
            self._watch_xids(handle, uuid)
            health = self._health(handle, uuid)
            base = {**health,"ts": now, "interval_s": self.interval_s, "node": self.node, "gpu_index": index,
                    "gpu_uuid": uuid, "gpu_model": model, "model_name": model_name, "source": "nvml"}
            mig_rows = self._mig_rows(handle, uuid, model, base, procs)
            if mig_rows:
                rows.extend(mig_rows)
                continue
            row = dict(base, gpu_fraction=vgpu_share(model_name) or 1.0)  # a vGPU guest holds part of its card
            self._fill_device(handle, uuid, row, now.timestamp())
            self._attribute(handle, uuid, row, procs)
            rows.append(row)
        SCRAPE_SECONDS.labels(source="nvml").observe(time.perf_counter() - started)
        self.processes = rows_to_table(procs, PROCESS_SCHEMA)
        SAMPLES_READ.labels(source="nvml").inc(len(rows))
        return rows_to_table(rows)

    def process_rows(self) -> pa.Table:
        return self.processes

    def _fill_device(self, handle: Any, uuid: str, row: dict[str, Any], now_s: float) -> None:
        nvml = self.nvml
        util = self._read(uuid, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        if util is not None:
            row["util_pct"] = float(util.gpu)
        self._fill_memory(handle, uuid, row)
        power = self._read(uuid, "power", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        if power is not None:
            row["power_w"] = power / 1000.0
        temp = self._read(uuid, "temperature", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        if temp is not None:
            row["temp_c"] = float(temp)
        for column, counter in (("pcie_tx_bps", nvml.NVML_PCIE_UTIL_TX_BYTES), ("pcie_rx_bps", nvml.NVML_PCIE_UTIL_RX_BYTES)):
            kbps = self._read(uuid, column, lambda c=counter: nvml.nvmlDeviceGetPcieThroughput(handle, c))
            if kbps is not None:
                row[column] = kbps * 1024.0
        self._fill_nvlink(handle, uuid, row, now_s)
        energy_mj = self._read(uuid, "energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        if energy_mj is not None:
            row["power_avg_w"] = self.rates.rate((uuid, "energy"), now_s, energy_mj / 1000.0)

    def _watch_xids(self, handle: Any, uuid: str) -> None:
        """Register the GPU for XID events once (they are events, not a readable field), then take the events the
        driver queued since the last sample."""
        nvml = self.nvml
        if self._xid_events is None and ("*", "xid_events") not in self._unsupported:
            self._xid_events = self._read("*", "xid_events", nvml.nvmlEventSetCreate)
        if self._xid_events is None:
            return
        if uuid not in self._xid_watched:
            self._read(uuid, "xid", lambda: nvml.nvmlDeviceRegisterEvents(
                handle, nvml.nvmlEventTypeXidCriticalError, self._xid_events))
            if (uuid, "xid") not in self._unsupported:
                self._xid_watched.add(uuid)
                self._last_xid.setdefault(uuid, 0)
        while True:
            try:
                event = nvml.nvmlEventSetWait_v2(self._xid_events, 0)
            except nvml.NVMLError_Timeout:
                break
            except nvml.NVMLError as exc:
                log.warning("NVML: reading XID events failed: %s", exc)
                break
            owner = self._read("*", "xid_device", lambda e=event: _text(nvml.nvmlDeviceGetUUID(e.device)))
            if owner is not None:
                self._last_xid[owner] = int(event.eventData)
                log.warning("NVML: XID %d on %s", event.eventData, owner)

    def _health(self, handle: Any, uuid: str) -> dict[str, Any]:
        """The GPU's health readings (collector/gpu_health.py says what they mean); absent ones are left out."""
        nvml = self.nvml
        out: dict[str, Any] = {}
        if uuid in self._xid_watched:
            out["xid"] = self._last_xid.get(uuid, 0)
        reasons = self._read(uuid, "clocks_event_reasons", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        if reasons is not None:
            out["throttle_reasons"] = int(reasons)
        for column, kind in (("ecc_sbe_total", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                             ("ecc_dbe_total", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            count = self._read(uuid, column, lambda k=kind: nvml.nvmlDeviceGetTotalEccErrors(
                handle, k, nvml.NVML_VOLATILE_ECC))
            if count is not None:
                out[column] = int(count)
        remapped = self._read(uuid, "remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        if remapped is not None:
            out.update(remapped_rows_corr=int(remapped[0]), remapped_rows_uncorr=int(remapped[1]),
                       row_remap_failed=bool(remapped[3]))
        return out

    def _fill_memory(self, handle: Any, uuid: str, row: dict[str, Any]) -> None:
        nvml = self.nvml
        mem = self._read(uuid, "memory_v2", lambda: nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2))
        if mem is None:
            mem = self._read(uuid, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        if mem is None:
            return
        row["mem_used_mib"] = mem.used / MIB
        row["mem_free_mib"] = mem.free / MIB
        row["mem_total_mib"] = mem.total / MIB
        reserved = getattr(mem, "reserved", None)
        if reserved is not None:
            row["mem_reserved_mib"] = reserved / MIB

    def _fill_nvlink(self, handle: Any, uuid: str, row: dict[str, Any], now_s: float) -> None:
        """NVLink throughput fields are cumulative KiB per link: sum the links, then difference per interval."""
        nvml = self.nvml
        fields = [(fid, link) for fid in (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                                          nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
                  for link in range(self.nvlink_links)]
        values = self._read(uuid, "nvlink", lambda: nvml.nvmlDeviceGetFieldValues(handle, fields))
        if values is None:
            return
        totals: dict[int, float] = {}
        for value in values:
            if value.nvmlReturn == nvml.NVML_SUCCESS:
                totals[value.fieldId] = totals.get(value.fieldId, 0.0) + float(value.value.ullVal)
        for fid, column in ((nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, "nvlink_tx_bps"),
                            (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, "nvlink_rx_bps")):
            if fid in totals:
                row[column] = self.rates.rate((uuid, fid), now_s, totals[fid] * 1024.0)

    def _attribute(self, handle: Any, uuid: str, row: dict[str, Any], procs: list[dict[str, Any]]) -> None:
        running = self._read(uuid, "processes", lambda: self.nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        if not running:
            row["allocated"] = False
            return
        owner = None
        for proc in sorted(running, key=lambda p: -(p.usedGpuMemory or 0)):
            info = describe_process(proc.pid, self.proc_root)
            used = proc.usedGpuMemory
            procs.append({"ts": row["ts"], "node": self.node, "gpu_uuid": uuid, "pid": proc.pid,
                          "used_mem_mib": used / MIB if used is not None else None,
                          "user": info.user, "job_id": info.job_id})
            owner = owner or info
        row["allocated"] = True
        row["user"] = owner.user
        row["job_id"] = owner.job_id
        row["team"] = self.attributor.team_for(user=owner.user)

    def _mig_rows(self, handle: Any, uuid: str, model: str, base: dict[str, Any],
                  procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        nvml = self.nvml
        mode = self._read(uuid, "mig_mode", lambda: nvml.nvmlDeviceGetMigMode(handle))
        if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        rows = []
        maximum = self._read(uuid, "mig_count", lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0
        for slot in range(maximum):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError_NotFound:
                continue  # empty slot
            except nvml.NVMLError as exc:
                SCRAPE_ERRORS.labels(source="nvml", reason="mig_handle").inc()
                log.warning("NVML: MIG slot %d on %s unreadable: %s", slot, uuid, exc)
                continue
            mig_uuid = _text(self._read(uuid, "mig_uuid", lambda: nvml.nvmlDeviceGetUUID(mig)) or f"{uuid}/{slot}")
            instance = self._read(mig_uuid, "gpu_instance_id", lambda: nvml.nvmlDeviceGetGpuInstanceId(mig))
            attrs = self._read(mig_uuid, "attributes", lambda: nvml.nvmlDeviceGetAttributes(mig))
            profile = None
            if attrs is not None:
                profile = f"{attrs.gpuInstanceSliceCount}g.{math.ceil(attrs.memorySizeMB / 1024)}gb"
            row = dict(base, mig_profile=profile, mig_instance=instance,
                       gpu_fraction=mig_fraction(model, profile))
            self._fill_memory(mig, mig_uuid, row)
            self._attribute(mig, mig_uuid, row, procs)
            rows.append(row)
        return rows
