"""Read GPUs on this node through NVML (nvidia-ml-py, imported as pynvml).

Every field read is guarded: NVMLError_NotSupported (common on MIG instances, consumer
boards and older drivers) drops that field for that device from then on, and the rest of
the sample is still emitted. Cumulative NVLink counters are turned into rates here, since
a rate across a counter reset would be negative traffic.

The profiling columns (sm_active, sm_occupancy, tensor_active, dram_active) come from NVML's GPM
(GPU Performance Monitoring, Hopper and later): a GPM metric is computed from two samples, so the
source keeps each GPU's previous sample and the first collect after start reads them as NULL. A GPU,
driver or nvidia-ml-py without GPM leaves them NULL, never 0, as DCGM-less Ampere nodes always did.
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
from gpuledger.collector.nvml_topology import nvml_text as _text
from gpuledger.collector.nvml_topology import read_topology
from gpuledger.collector.metrics import SAMPLES_READ, SCRAPE_ERRORS, SCRAPE_SECONDS
from gpuledger.collector.proc_attribution import describe_process
from gpuledger.collector.samples import PROCESS_SCHEMA, PROFILING_FIELDS, rows_to_table, unheld_part
from gpuledger.collector.source import Source, SourceError
from gpuledger.collector.topology import NodeTopology

log = logging.getLogger(__name__)
MIB = 1024 * 1024

# GPM metrics read into sample columns: (pynvml constant, column). nvml.h documents the *_UTIL and *_OCCUPANCY ones
# as percent 0.0 - 100.0 (stored as fractions, like DCGM's DCP fields) and the *_PER_SEC ones as MiB/s (stored as
# bytes/s). Names missing from an older nvidia-ml-py are skipped, not guessed.
GPM_FRACTIONS = (("NVML_GPM_METRIC_SM_UTIL", "sm_active"), ("NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy"),
                 ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "tensor_active"), ("NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_active"))
GPM_RATES = (("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "pcie_tx_bps"), ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", "pcie_rx_bps"),
             ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "nvlink_tx_bps"),
             ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "nvlink_rx_bps"))
# what the GPM path needs from pynvml: an nvidia-ml-py from before GPM lacks them all
GPM_API = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmSampleFree",
           "nvmlGpmMetricsGet", "c_nvmlGpmMetricsGet_t", "NVML_GPM_METRICS_GET_VERSION")
# nvml.h: the two samples of a GPM metric must be more than 100 ms apart (the counters' internal refresh rate)
GPM_MIN_GAP_S = 0.1
# answers of nvmlGpmQueryDeviceSupport that will not change while the agent runs: no GPM on this GPU for good
_GPM_FOR_GOOD = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission",
                 "NVMLError_ArgumentVersionMismatch")




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
        self._proc_seen: dict[str, int] = {}  # per GPU: the newest per-process utilisation sample read (µs)
        self._xid_events: Any = None  # NVML event set for XID errors (None: not created, or not supported)
        self._xid_watched: set[str] = set()  # GPUs registered with it
        self._last_xid: dict[str, int] = {}  # GPU UUID -> last XID seen, kept like DCGM's XID field (0: none)
        self.rates = RateTracker(interval_s)
        self.processes: pa.Table = PROCESS_SCHEMA.empty_table()  # the last collect's, for process_rows
        self.gpm_support: dict[str, bool] = {}  # GPU UUID -> GPM usable there, asked once per GPU
        self._gpm_metrics: list[tuple[int, str]] | None = None  # (metric id, column) this pynvml has; [] = no GPM
        self._gpm_prev: dict[tuple[str, int | None], tuple[Any, float]] = {}  # (GPU, GPU instance) -> (sample, t)
        self._gpm_seen: set[tuple[str, int | None]] = set()  # keys sampled this collect; the rest are freed
        self._gpm_failed: set[tuple[str, str]] = set()  # (GPU or MIG UUID, column) whose failure was logged
        self.gpm_min_gap_s = GPM_MIN_GAP_S
        self.clock: Callable[[], float] = time.monotonic  # when GPM samples are taken (tests drive their own)

    def _init(self) -> None:
        if not self._initialised:
            try:
                self.nvml.nvmlInit()
            except self.nvml.NVMLError as exc:
                SCRAPE_ERRORS.labels(source="nvml", reason="init").inc()
                raise SourceError(f"NVML init failed: {exc}") from exc
            self._initialised = True

    def check(self) -> None:
        """Initialise NVML now (a SourceError where it cannot be: no driver, no GPU), so a server says at start
        that it cannot collect here instead of claiming to and failing at every interval."""
        self._init()

    def close(self) -> None:
        if self._initialised:
            for key in list(self._gpm_prev):  # before nvmlShutdown, while NVML can still free them
                self._gpm_drop(key)
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
        self._gpm_seen = set()
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
                held = [r["gpu_fraction"] for r in mig_rows if r.get("mig_instance") is not None]
                if held and None not in held and sum(held) < 1.0 - 1e-9:  # slices no instance holds: idle capacity
                    rows.append(unheld_part(base, 1.0 - sum(held)))
                continue
            row = dict(base, gpu_fraction=vgpu_share(model_name) or 1.0)  # a vGPU guest holds part of its card
            self._fill_device(handle, uuid, row, now.timestamp())
            self._fill_gpm(handle, uuid, row, None, uuid)
            rows.extend(self._attribute(handle, uuid, row, procs))
        for key in set(self._gpm_prev) - self._gpm_seen:  # a GPU gone, or a MIG instance destroyed
            self._gpm_drop(key)
        SCRAPE_SECONDS.labels(source="nvml").observe(time.perf_counter() - started)
        self.processes = rows_to_table(procs, PROCESS_SCHEMA)
        SAMPLES_READ.labels(source="nvml").inc(len(rows))
        return rows_to_table(rows)

    def topology(self) -> list[NodeTopology]:
        """This node's GPU topology, measured through NVML (collector/nvml_topology.py)."""
        self._init()
        try:
            return [read_topology(self.nvml, self.node, self.nvlink_links)]
        except self.nvml.NVMLError as exc:
            SCRAPE_ERRORS.labels(source="nvml", reason="topology").inc()
            log.warning("NVML: topology not read: %s", exc)
            return []

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

    def _attribute(self, handle: Any, uuid: str, row: dict[str, Any],
                   procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The GPU's (or MIG instance's) rows: one, its owner the job of its processes; or, where processes of
        several jobs (or users) share it, one per job, each billed its part of the GPU by what it used (its
        processes' SM utilisation where NVML reports it per process, else their memory, else equal parts) and
        with its own utilisation (unknown, None, where NVML has no per-process figure: never the device's)."""
        running = self._read(uuid, "processes", lambda: self.nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        if not running:
            row["allocated"] = False
            return [row]
        owners: dict[str, list[tuple[Any, Any]]] = {}
        for proc in sorted(running, key=lambda p: -(p.usedGpuMemory or 0)):
            info = describe_process(proc.pid, self.proc_root)
            used = proc.usedGpuMemory
            procs.append({"ts": row["ts"], "node": self.node, "gpu_uuid": uuid, "pid": proc.pid,
                          "used_mem_mib": used / MIB if used is not None else None,
                          "user": info.user, "job_id": info.job_id})
            owners.setdefault(info.job_id or f"user:{info.user}", []).append((proc, info))
        if len(owners) == 1:
            owner = next(iter(owners.values()))[0][1]
            return [dict(row, allocated=True, user=owner.user, job_id=owner.job_id,
                         team=self.attributor.team_for(user=owner.user))]
        sm = self._process_sm(handle, uuid)
        by_sm = {k: sum(sm.get(p.pid, 0.0) for p, _ in members) for k, members in owners.items()}
        by_mem = {k: sum((p.usedGpuMemory or 0) for p, _ in members) for k, members in owners.items()}
        weights = by_sm if sm and sum(by_sm.values()) > 0 else by_mem if sum(by_mem.values()) > 0 else None
        out = []
        for key, members in owners.items():
            info = members[0][1]
            share = weights[key] / sum(weights.values()) if weights else 1.0 / len(owners)
            used = [p.usedGpuMemory for p, _ in members if p.usedGpuMemory is not None]
            out.append(dict(row, allocated=True, user=info.user, job_id=info.job_id,
                            team=self.attributor.team_for(user=info.user),
                            gpu_fraction=(row.get("gpu_fraction") or 1.0) * share,
                            util_pct=min(100.0, by_sm[key]) if sm else None,
                            mem_used_mib=sum(used) / MIB if used else None))
        return out

    def _process_sm(self, handle: Any, uuid: str) -> dict[int, float]:
        """Per pid, its mean SM utilisation (%) over the samples NVML kept since the last read; empty where NVML
        has none (no sample yet: NotFound) or does not report it (MIG instances, older GPUs: NotSupported)."""
        nvml = self.nvml
        if (uuid, "process_util") in self._unsupported or not hasattr(nvml, "nvmlDeviceGetProcessUtilization"):
            return {}
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._proc_seen.get(uuid, 0))
        except nvml.NVMLError_NotFound:
            return {}
        except nvml.NVMLError_NotSupported:
            self._unsupported.add((uuid, "process_util"))
            return {}
        except nvml.NVMLError as exc:
            SCRAPE_ERRORS.labels(source="nvml", reason="error:process_util").inc()
            log.warning("NVML: per-process utilisation on %s failed: %s", uuid, exc)
            return {}
        per_pid: dict[int, list[float]] = {}
        for sample in samples:
            per_pid.setdefault(int(sample.pid), []).append(float(sample.smUtil))
            self._proc_seen[uuid] = max(self._proc_seen.get(uuid, 0), int(sample.timeStamp))
        return {pid: sum(values) / len(values) for pid, values in per_pid.items()}

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
            if instance is not None and hasattr(nvml, "nvmlGpmMigSampleGet"):
                self._fill_gpm(handle, uuid, row, int(instance), mig_uuid)
            rows.extend(self._attribute(mig, mig_uuid, row, procs))
        return rows

    # GPM: GPU Performance Monitoring (NVML, Hopper and later)

    def _gpm_metric_ids(self) -> list[tuple[int, str]]:
        """The (metric id, column) pairs this nvidia-ml-py can ask for; [] when it predates GPM altogether, which
        is said once, since an old library on a Hopper node is worth knowing about but not worth a warning a
        collect."""
        if self._gpm_metrics is None:
            nvml = self.nvml
            missing = [name for name in GPM_API if not hasattr(nvml, name)]
            if missing:
                log.info("NVML: this nvidia-ml-py has no GPM (%s missing): profiling columns stay empty",
                         ", ".join(missing))
                self._gpm_metrics = []
            else:
                self._gpm_metrics = [(int(getattr(nvml, name)), column) for name, column in GPM_FRACTIONS + GPM_RATES
                                     if hasattr(nvml, name)]
        return self._gpm_metrics

    def _gpm_ready(self, handle: Any, uuid: str) -> bool:
        """Whether GPM can be read on this GPU, asked once: the answer is the GPU's architecture and the driver's,
        which do not change while the agent runs. A passing error (GPU busy, lost) is not kept, so the next
        collect asks again."""
        if uuid in self.gpm_support:
            return self.gpm_support[uuid]
        if not self._gpm_metric_ids():
            self.gpm_support[uuid] = False
            return False
        nvml = self.nvml
        for_good = tuple(getattr(nvml, name) for name in _GPM_FOR_GOOD if hasattr(nvml, name))
        try:
            supported = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except for_good as exc:  # an old driver (Function Not Found), a GPU or user without profiling
            log.info("NVML: GPM unavailable on %s (%s): profiling columns stay empty", uuid, exc)
            supported = False
        except nvml.NVMLError as exc:
            SCRAPE_ERRORS.labels(source="nvml", reason="error:gpm_support").inc()
            log.warning("NVML: asking %s for GPM support failed: %s", uuid, exc)
            return False
        else:
            if not supported:
                log.info("NVML: %s has no GPM (before Hopper): profiling columns stay empty", uuid)
        self.gpm_support[uuid] = supported
        return supported

    def _fill_gpm(self, handle: Any, uuid: str, row: dict[str, Any], instance: int | None, who: str) -> None:
        """Take a GPM sample of the GPU (or of its GPU instance `instance`, read through the parent's `handle`)
        and fill `row` from it and the previous one.

        The profiling fractions are only read here. For the PCIe and NVLink columns NVML's own readings, filled
        before, win where they exist: those series were stored from them before GPM was read, and a mid-series
        switch of source would show as a step that no workload made; GPM fills them where those readings are
        absent. A MIG row gets the four fractions only, since PCIe and NVLink belong to the whole card.
        """
        if not self._gpm_ready(handle, uuid):
            return
        key = (uuid, instance)
        self._gpm_seen.add(key)
        now = self.clock()
        previous = self._gpm_prev.get(key)
        if previous is not None and now - previous[1] < self.gpm_min_gap_s:
            return  # too soon for new counters: keep the older sample, the next collect measures from it
        sample = self._gpm_sample(handle, instance, who)
        if sample is None:
            self._gpm_drop(key)  # start again: a value always covers one gap between two collects
            return
        self._gpm_prev[key] = (sample, now)
        if previous is None:
            return  # the first sample only primes
        try:
            if now - previous[1] > self.rates.max_gap_s:
                return  # an average over a long silence would smear a burst across it, as RateTracker says
            metrics = self._gpm_metric_ids()
            if instance is not None:
                metrics = [(mid, column) for mid, column in metrics if column in PROFILING_FIELDS]
            for column, value in self._gpm_values(who, previous[0], sample, metrics).items():
                if column in PROFILING_FIELDS or row.get(column) is None:
                    row[column] = value
        finally:
            self._gpm_free(previous[0])

    def _gpm_sample(self, handle: Any, instance: int | None, who: str) -> Any:
        """A new GPM sample of the GPU or of one of its GPU instances, or None (the buffer freed again)."""
        nvml = self.nvml
        field = "gpm_sample" if instance is None else "gpm_mig_sample"
        if (who, field) in self._unsupported or (who, "gpm_metrics") in self._unsupported:
            return None
        sample = self._read(who, "gpm_alloc", nvml.nvmlGpmSampleAlloc)
        if sample is None:
            return None
        if instance is None:
            taken = self._read(who, field, lambda: nvml.nvmlGpmSampleGet(handle, sample))
        else:
            taken = self._read(who, field, lambda: nvml.nvmlGpmMigSampleGet(handle, instance, sample))
        if taken is None:
            self._gpm_free(sample)
            return None
        return sample

    def _gpm_values(self, who: str, older: Any, newer: Any, metrics: list[tuple[int, str]]) -> dict[str, float]:
        """The columns GPM computes from two samples; a metric NVML could not compute (its own nvmlReturn) is left
        out, so that column alone stays NULL."""
        nvml = self.nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metrics)
        request.sample1, request.sample2 = older, newer  # sample1 the earlier: metrics are rates from 1 to 2
        for i, (metric_id, _) in enumerate(metrics):
            request.metrics[i].metricId = metric_id
        if self._read(who, "gpm_metrics", lambda: nvml.nvmlGpmMetricsGet(request)) is None:
            return {}
        out: dict[str, float] = {}
        for i, (_, column) in enumerate(metrics):
            metric = request.metrics[i]
            value = float(metric.value)
            if metric.nvmlReturn != nvml.NVML_SUCCESS or not math.isfinite(value):
                if (who, column) not in self._gpm_failed:
                    self._gpm_failed.add((who, column))
                    log.info("NVML: GPM cannot compute %s on %s (return %d); leaving it empty", column, who,
                             metric.nvmlReturn)
                continue
            if column in PROFILING_FIELDS:
                out[column] = min(max(value / 100.0, 0.0), 1.0)  # percent 0..100 -> fraction
            elif value >= 0:
                out[column] = value * MIB  # MiB/s -> bytes/s
        return out

    def _gpm_free(self, sample: Any) -> None:
        try:
            self.nvml.nvmlGpmSampleFree(sample)
        except self.nvml.NVMLError as exc:
            log.warning("NVML: freeing a GPM sample failed: %s", exc)

    def _gpm_drop(self, key: tuple[str, int | None]) -> None:
        """Forget (and free) the previous sample of `key`, so the next collect primes afresh."""
        previous = self._gpm_prev.pop(key, None)
        if previous is not None:
            self._gpm_free(previous[0])
