"""Scrape a dcgm-exporter /metrics page over HTTP and turn it into one row per GPU or MIG instance."""
from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

import pyarrow as pa
import requests

from gpuledger.collector.apps.hami import ContainerUse, GpuUse
from gpuledger.collector.attribution import Attributor
from gpuledger.collector.counters import RateTracker
from gpuledger.collector.dcgm_topology import PageTopology, is_topology_field
from gpuledger.collector.identifiers import is_identifier
from gpuledger.collector.gpu_catalog import UNKNOWN_MODEL, mig_share, model_for_profile, normalize_model, vgpu_share
from gpuledger.collector.metrics import PARSE_ERRORS, SAMPLES_READ, SCRAPE_ERRORS, SCRAPE_SECONDS
from gpuledger.collector.prom_text import ParseResult, PromTextParser
from gpuledger.collector.samples import HEALTH_COLUMNS, PROFILING_FIELDS, SAMPLE_SCHEMA, rows_to_table, unheld_part
from gpuledger.collector.source import Source, SourceError
from gpuledger.collector.topology import NodeTopology

log = logging.getLogger(__name__)

# dcgm-exporter field -> (sample column, scale to our unit)
FIELD_COLUMNS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("_gr_active", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", 1.0),
    "DCGM_FI_DEV_FB_FREE": ("mem_free_mib", 1.0),
    "DCGM_FI_DEV_FB_RESERVED": ("mem_reserved_mib", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("_energy_j", 1e-3),  # cumulative mJ -> J, made a rate below
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_bps", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_bps", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bps", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bps", 1.0),
    # exporters up to 3.4 read PCIe through NVML: KB/s; used where the profiling field is absent
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": ("_pcie_tx_kbps", 1024.0),
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": ("_pcie_rx_kbps", 1024.0),
    # the only NVLink field in the default counter set: typed a counter, but a rate over all links, both directions,
    # in MB/s (what DCGM's dmon shows; it agrees with nvidia-smi's NVLink counters on H200s, dcgm-exporter #472)
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("nvlink_bps", 1e6),
    # health: kept as read; the store turns their changes into events (collector/gpu_health.py)
    "DCGM_FI_DEV_XID_ERRORS": ("xid", 1.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle_reasons", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle_reasons", 1.0),  # the same bits, renamed in DCGM 3.3
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_sbe_total", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_dbe_total", 1.0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_corr", 1.0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorr", 1.0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("row_remap_failed", 1.0),
}

# pages carry every value as a float: health readings are stored as the sample schema types them (counts, a flag)
_HEALTH_TYPES = {c: bool if pa.types.is_boolean(SAMPLE_SCHEMA.field(c).type) else int for c in HEALTH_COLUMNS}

# Fields in dcgm-exporter's default counter set that we read past on purpose (not "unknown").
KNOWN_UNUSED = frozenset(
    {
        "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    }
)


# dcgm-exporter 1.x metric names (its etc/1.x-compatibility-metrics.csv) and the DCGM field each one carries;
# `dcgm_fi_*` names are the field's own name in lower case
OLD_NAMES: dict[str, str] = {
    "dcgm_sm_clock": "DCGM_FI_DEV_SM_CLOCK", "dcgm_memory_clock": "DCGM_FI_DEV_MEM_CLOCK",
    "dcgm_memory_temp": "DCGM_FI_DEV_MEMORY_TEMP", "dcgm_gpu_temp": "DCGM_FI_DEV_GPU_TEMP",
    "dcgm_power_usage": "DCGM_FI_DEV_POWER_USAGE",
    "dcgm_total_energy_consumption": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "dcgm_pcie_replay_counter": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "dcgm_gpu_utilization": "DCGM_FI_DEV_GPU_UTIL",
    "dcgm_mem_copy_utilization": "DCGM_FI_DEV_MEM_COPY_UTIL", "dcgm_enc_utilization": "DCGM_FI_DEV_ENC_UTIL",
    "dcgm_dec_utilization": "DCGM_FI_DEV_DEC_UTIL", "dcgm_xid_errors": "DCGM_FI_DEV_XID_ERRORS",
    "dcgm_fb_free": "DCGM_FI_DEV_FB_FREE", "dcgm_fb_used": "DCGM_FI_DEV_FB_USED",
    "dcgm_nvlink_bandwidth_total": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
}


def field_name(metric: str) -> str:
    """The DCGM field a metric carries, whatever exporter generation named it."""
    if metric.startswith("dcgm_fi_"):
        return metric.upper()
    return OLD_NAMES.get(metric, metric)


# `Hostname` values that name the exporter's container or pod, not the node: a Docker container id, or a
# dcgm-exporter pod of a DaemonSet (as `hostname` reads inside a pod)
_NOT_A_NODE = re.compile(r"^[0-9a-f]{12}$|^(nvidia-)?dcgm-exporter-[a-z0-9]{5}$")


# labels a Prometheus scrape config sets to the Kubernetes node of the exporter's pod (from
# __meta_kubernetes_pod_node_name): they name the node whatever `Hostname` says
_NODE_LABELS = ("kubernetes_node", "node", "nodename")


def _hostname_of(labels: Any) -> str | None:
    return labels.get("Hostname") or labels.get("hostname") or None


def _uuid_of(labels: Any) -> str | None:
    """The GPU a series is about: its UUID (old exporters: `uuid`), else its index."""
    return labels.get("UUID") or labels.get("uuid") or labels.get("gpu")


def node_of(labels: Any) -> str | None:
    """The node a page's series come from, when its labels say it: the Kubernetes node a scrape config attached,
    else `Hostname` (or newer `hostname`) unless that is the exporter's own container or pod."""
    for name in _NODE_LABELS:
        if labels.get(name):
            return labels[name]
    value = _hostname_of(labels)
    return value if value and not _NOT_A_NODE.match(value) else None


DRA_LABELS = ("dra_claim_namespace", "dra_claim_name", "dra_driver_name", "dra_pool_name", "dra_device_name")


def _dra_of(labels: Any) -> dict[str, str | None]:
    """The ResourceClaim (`namespace/name`) and device (`driver/pool/device`) of dcgm-exporter's DRA labels
    (its DRA mode, where GPUs are allocated through claims rather than the device plugin): each only when every part
    is there and the whole is a valid name, so a malformed label loses the claim's name, never the GPU's row."""
    ns, name, driver, pool, device = (labels.get(k) or None for k in DRA_LABELS)
    claim = f"{ns}/{name}" if ns and name else None
    named = f"{driver}/{pool}/{device}" if driver and pool and device else None
    return {"dra_claim": claim if claim and is_identifier("dra_claim", claim) else None,
            "dra_device": named if named and is_identifier("dra_device", named) else None}


def _pod_of(labels: Any) -> tuple[str | None, str | None]:
    """The (namespace, pod) a series is attributed to, in the current or the old label names."""
    return (labels.get("namespace") or labels.get("pod_namespace") or None,
            labels.get("pod") or labels.get("pod_name") or None)


@dataclass(frozen=True)
class PodFacts:
    """What the cluster says about a pod beyond the exporter's labels."""
    team: str | None = None  # its team label (kube_pod_labels)
    gpu_share: float | None = None  # the part of a shared GPU it requested (HAMi's nvidia.com/gpucores / 100)
    gpu_mem_mib: float | None = None  # the GPU memory it requested (HAMi's nvidia.com/gpumem), when no gpucores
    used: Mapping[str, GpuUse] = field(default_factory=dict)  # GPU UUID -> what it used (HAMi's vGPU monitor)

    def share_of(self, card_mib: float | None) -> float | None:
        """Its requested part of a card with `card_mib` of memory: gpucores first, else gpumem over the card's."""
        if self.gpu_share:
            return self.gpu_share
        return self.gpu_mem_mib / card_mib if self.gpu_mem_mib and card_mib else None


def _opt_int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


class DcgmPageConverter:
    """Folds parsed samples into rows keyed by GPU UUID, MIG instance and pod (a shared GPU repeats its series per
    pod). Separate from HTTP so it is testable on text."""

    def __init__(self, attributor: Attributor | None = None, node: str | None = None, source: str = "dcgm") -> None:
        """`source`: what the rows' `source` column says (a Prometheus read-back says so, and resumes from it)."""
        self.attributor = attributor or Attributor()
        self.node = node
        self.source = source
        self.parser = PromTextParser()
        self.last_parse: ParseResult | None = None
        self.rates: RateTracker | None = None
        self._warned_nodes: set[str | None] = set()
        # what the cluster says about pods, when a source knows it (Prometheus: kube-state-metrics)
        self.pods: dict[tuple[str | None, str | None], PodFacts] = {}
        self.topology = PageTopology(source)  # each node's GPUs and NVLink as the last page says

    def convert(self, text: str, ts: datetime, interval_s: float) -> pa.Table:
        """Rows of one scraped page."""
        parsed = self.parser.parse(text)
        self.last_parse = parsed
        return self.convert_samples(parsed.samples, ts, interval_s, parsed.errors, parsed.examples)

    def convert_samples(self, samples: Iterable[tuple[str, Any, float, Any]], ts: datetime, interval_s: float,
                        errors: Counter[str] | None = None, examples: list[str] | None = None) -> pa.Table:
        """Rows of one scrape's samples, (metric, labels, value, _) as parsed from a page or read back from
        Prometheus (whose series carry the exporter's labels, plus its own)."""
        errors = errors if errors is not None else Counter()
        rows: dict[tuple[str, str | None], dict[str, Any]] = {}
        self.topology.clear()  # what the last page says
        for metric, labels, value, _ts in samples:
            name = field_name(metric)
            column = FIELD_COLUMNS.get(name)
            topology_only = column is None and is_topology_field(name)
            if column is None and name not in KNOWN_UNUSED and not topology_only:
                errors["unknown_metric"] += 1
                continue
            uuid = _uuid_of(labels)
            if uuid is None:
                errors["missing_gpu_label"] += 1
                continue
            key = (uuid, labels.get("GPU_I_ID"), *_pod_of(labels))  # shared GPUs repeat their series per pod
            row = rows.get(key)
            if row is None:  # any series of a GPU says it is there (capacity), even one whose field is not used
                row = rows[key] = self._new_row(labels, ts, interval_s)
            self.topology.observe(row["node"], uuid, name, labels, value, topology_only)
            if column is None:
                continue
            if math.isnan(value) or math.isinf(value):
                errors["nan_value"] += 1
                continue
            row[column[0]] = value * column[1]
        for kind, count in errors.items():
            PARSE_ERRORS.labels(kind=kind).inc(count)
        if examples:
            log.warning("dcgm page: skipped %d line(s)/value(s): %s", sum(errors.values()), "; ".join(examples))
        if self.rates is None or self.rates.interval_s != interval_s:
            self.rates = RateTracker(interval_s)
        now_s = ts.timestamp()
        finished = [self._finish(row, self.rates, now_s) for row in rows.values()]
        return rows_to_table(bill_each_gpu_once(finished, self.pods))

    def _new_row(self, labels: Any, ts: datetime, interval_s: float) -> dict[str, Any]:
        model_name = labels.get("modelName")
        profile = labels.get("GPU_I_PROFILE") or None
        model = normalize_model(model_name) if model_name else (model_for_profile(profile) or normalize_model(None))
        namespace, pod = _pod_of(labels)
        job = labels.get("hpc_job") or (f"{namespace}/{pod}" if pod else None)
        allocated = job is not None
        facts = self.pods.get((namespace, pod)) if pod else None
        return {
            "ts": ts,
            "interval_s": interval_s,
            "node": self._node(labels),
            "gpu_index": _opt_int(labels.get("gpu")),
            "gpu_uuid": _uuid_of(labels),
            "gpu_model": model,
            "model_name": model_name,
            "mig_profile": profile,
            "mig_instance": _opt_int(labels.get("GPU_I_ID")),
            # a MIG instance's or vGPU's part of its card (None: unknown, split below)
            "gpu_fraction": mig_share(model, profile) if profile else (vgpu_share(model_name) or 1.0),
            "allocated": allocated,
            "namespace": namespace,
            "pod": pod,
            "container": labels.get("container") or labels.get("container_name") or None,
            "job_id": job,
            "team": ((facts and facts.team) or self.attributor.team_for(namespace=namespace)) if allocated else None,
            "source": self.source,
            **_dra_of(labels),
        }

    def _node(self, labels: Any) -> str:
        """The explicit node (the agent's --node) first, else the page's own node label, else "unknown", said once."""
        node = self.node or node_of(labels)
        if node is None:
            seen = _hostname_of(labels)
            if seen not in self._warned_nodes:
                self._warned_nodes.add(seen)
                log.warning("dcgm page: no node name (Hostname=%r is %s); rows are stored under node 'unknown': run "
                            "the agent on the node, or give it --node", seen,
                            "the exporter's container or pod" if seen else "missing")
            return "unknown"
        return node

    @staticmethod
    def _finish(row: dict[str, Any], rates: RateTracker, now_s: float) -> dict[str, Any]:
        energy = row.pop("_energy_j", None)
        if energy is not None:
            row["power_avg_w"] = rates.rate((row["gpu_uuid"], row["mig_instance"]), now_s, energy)
        gr = row.pop("_gr_active", None)
        if row.get("util_pct") is None and gr is not None:
            row["util_pct"] = gr * 100.0  # MIG instances report no GPU_UTIL, only graphics-engine activity
        for direction in ("tx", "rx"):
            kbps = row.pop(f"_pcie_{direction}_kbps", None)
            if row.get(f"pcie_{direction}_bps") is None:
                row[f"pcie_{direction}_bps"] = kbps
        for column, kind in _HEALTH_TYPES.items():
            if row.get(column) is not None:
                row[column] = kind(row[column])
        parts = [row.get(c) for c in ("mem_used_mib", "mem_free_mib", "mem_reserved_mib")]
        if parts[0] is not None and parts[1] is not None:
            row["mem_total_mib"] = sum(p for p in parts if p is not None)
        return row


# readings a shared GPU's exporter repeats for every sharer: the device's, not the pod's
DEVICE_READINGS = ("util_pct", *PROFILING_FIELDS)


def _own_figures(sharers: list[dict[str, Any]]) -> None:
    """Each sharer of a time-sliced (or HAMi, or DRA-shared) GPU with its own figures, not the device's: the
    exporter repeats the device's utilisation on every pod's series, which made each of three pods on a GPU at 90%
    look 90% busy. A device reading of 0 is each sharer's too (nobody used it); any other is unknown per pod (None),
    so neither idle nor busy is claimed for a pod on evidence about the device."""
    for name in DEVICE_READINGS:
        for row in sharers:
            value = row.get(name)
            if value is not None and value != 0:
                row[name] = None


def bill_each_gpu_once(rows: list[dict[str, Any]],
                       pods: Mapping[tuple[str | None, str | None], PodFacts] | None = None) -> list[dict[str, Any]]:
    """Make the fractions billed for one physical GPU add up to at most 1.0.

    An exporter run with `-d g+i` sends the whole GPU's series beside its MIG instances': the whole-GPU row then
    stands only for the part no instance holds (unallocated capacity). An instance whose profile names no slice
    count gets an equal part of what the known ones leave, and instances that claim more than the card are scaled
    down to it. A GPU (or instance) shared by time-slicing, HAMi or DRA has its series repeated once per pod: each
    pod is billed its part of it: in proportion to what each requested when `pods` knows every sharer's request
    (HAMi), else in proportion to what each measurably used (HAMi's vGPU monitor, `PodFacts.used`), else equal
    parts. Either way the sharers' parts add up to the GPU's, and a sharer whose use was measured carries its own
    utilisation and memory, never the device's.
    """
    pods = pods or {}
    by_gpu: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        if row["mig_instance"] is None and row["gpu_fraction"] is None:
            # a MIG profile naming no slice count and no instance id: nothing places it on the card, so it stands
            # for the card's own slot (scaled down below like any whole-GPU row), never an unbillable None
            row["gpu_fraction"] = 1.0
        by_gpu.setdefault((row["node"], row["gpu_uuid"]), []).append(row)
    for group in by_gpu.values():
        slots: dict[int | None, list[dict[str, Any]]] = {}  # MIG instance (None: the whole GPU) -> its pods' rows
        for row in group:
            slots.setdefault(row["mig_instance"], []).append(row)
        share = {i: members[0]["gpu_fraction"] for i, members in slots.items() if i is not None}
        if share:
            unknown = [i for i, f in share.items() if f is None]
            known = sum(f for f in share.values() if f is not None)
            for i in unknown:
                share[i] = max(0.0, 1.0 - known) / len(unknown)
            held = sum(share.values())
            if held > 1.0:
                share = {i: f / held for i, f in share.items()}
                held = 1.0
            for i, f in share.items():
                for row in slots[i]:
                    row["gpu_fraction"] = f
            models = {r["gpu_model"] for i in share for r in slots[i]} - {UNKNOWN_MODEL}
            if None not in slots and held < 1.0:
                # MIG in mixed mode without the card's own series: the slices no instance holds are the card's
                # idle capacity (an A100 with 3/7 and 1/7 held has 3/7 idle), not lost from every bill
                slots[None] = [unheld_part(slots[next(iter(share))][0], 1.0 - held)]
                rows.append(slots[None][0])
                continue
            for whole in slots.get(None, []):
                whole.update(gpu_fraction=max(0.0, 1.0 - held), allocated=False, job_id=None, team=None, pod=None,
                             namespace=None, container=None)
                if whole["gpu_model"] == UNKNOWN_MODEL and len(models) == 1:  # the card, as its instances tell it
                    whole["gpu_model"] = next(iter(models))
        for members in slots.values():
            if len(members) > 1:
                _own_figures(members)
            facts = [pods.get((r["namespace"], r["pod"])) for r in members]
            asked = [f.share_of(r.get("mem_total_mib")) if f else None for f, r in zip(facts, members)]
            used = [f.used.get(r["gpu_uuid"]) if f else None for f, r in zip(facts, members)]
            cores = [u.core if u else None for u in used]
            if len(members) > 1 and all(a is not None and a > 0 for a in asked):
                weights = asked
            elif len(members) > 1 and all(c is not None for c in cores) and sum(cores) > 0:
                weights = cores  # no requests known: what each measurably used
            else:
                weights = [1.0] * len(members)
            total = sum(weights)
            for row, weight, use in zip(members, weights, used):
                row["gpu_fraction"] *= weight / total
                if len(members) > 1 and use is not None:
                    _measured(row, use)
    return rows


def _measured(row: dict[str, Any], use: GpuUse) -> None:
    """A sharer's own figures from what it measurably used (HAMi's per-container monitor): its utilisation is its
    share of the device's SM time over the part of the device it is billed (a pod billed half a GPU that kept 40%
    of the SMs busy is 80% busy, capped at 100), its memory what its containers hold."""
    if use.core is not None and row["gpu_fraction"] > 0:
        row["util_pct"] = min(100.0, 100.0 * use.core / row["gpu_fraction"])
    if use.mem_mib is not None:
        row["mem_used_mib"] = use.mem_mib


class DcgmExporterSource(Source):
    """Source that scrapes one dcgm-exporter endpoint (usually http://NODE:9400/metrics)."""

    def __init__(
        self,
        url: str,
        interval_s: float = 30.0,
        attributor: Attributor | None = None,
        timeout_s: float = 5.0,
        session: requests.Session | None = None,
        node: str | None = None,
        hami_url: str | None = None,
    ) -> None:
        """`node`: the node the exporter runs on, when the caller knows it (the agent on that node); otherwise the
        page's own node label is used, and a page without a usable one is stored under 'unknown', with a warning.
        `hami_url`: HAMi's vGPU monitor on the same node, read with each page for what each sharer of a GPU used
        (an unreadable monitor page is counted and the GPU page stored without it)."""
        self.url = url
        self.name = f"dcgm:{url}"
        self.hami_url = hami_url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.session = session or requests.Session()
        self.converter = DcgmPageConverter(attributor, node=node)

    def collect(self) -> pa.Table:
        started = time.perf_counter()
        try:
            response = self.session.get(self.url, timeout=self.timeout_s)
            response.raise_for_status()
        except requests.RequestException as exc:
            SCRAPE_ERRORS.labels(source="dcgm", reason=type(exc).__name__).inc()
            raise SourceError(f"cannot scrape dcgm-exporter at {self.url}: {exc}") from exc
        finally:
            SCRAPE_SECONDS.labels(source="dcgm").observe(time.perf_counter() - started)
        now = datetime.now(timezone.utc)
        if self.hami_url:
            self.converter.pods = with_use({}, self._hami_use(now.timestamp()))
        table = self.converter.convert(response.text, now, self.interval_s)
        if table.num_rows == 0:
            SCRAPE_ERRORS.labels(source="dcgm", reason="no_gpu_samples").inc()
            raise SourceError(f"dcgm-exporter at {self.url} returned no GPU samples ({len(response.text)} bytes)")
        SAMPLES_READ.labels(source="dcgm").inc(table.num_rows)
        return table

    def topology(self) -> list[NodeTopology]:
        """The topology of the nodes the last page named (collector/dcgm_topology.py)."""
        return self.converter.topology.topologies()

    def _hami_use(self, now: float) -> dict[tuple[str | None, str], dict[str, GpuUse]]:
        """Each pod's use of each GPU, from HAMi's vGPU monitor page read now; none when it cannot be read."""
        try:
            response = self.session.get(self.hami_url, timeout=self.timeout_s)
            response.raise_for_status()
        except requests.RequestException as exc:
            SCRAPE_ERRORS.labels(source="hami", reason=type(exc).__name__).inc()
            log.warning("HAMi vGPU monitor at %s unreadable (%s): sharers' own figures unknown this read",
                        self.hami_url, exc)
            return {}
        samples = PromTextParser().parse(response.text).samples
        return ContainerUse([(name, labels, [(now, value)]) for name, labels, value, _ in samples]).at(now)


PodKey = tuple[str | None, str | None]  # (namespace, pod)


def with_use(facts: Mapping[PodKey, PodFacts],
             used: Mapping[tuple[str | None, str], Mapping[str, GpuUse]]) -> dict[PodKey, PodFacts]:
    """The pods' facts with what each measurably used of each GPU (HAMi's vGPU monitor) at one instant."""
    merged = dict(facts)
    for key, gpus in used.items():
        merged[key] = replace(merged.get(key, PodFacts()), used=dict(gpus))
    return merged


__all__ = ["DcgmExporterSource", "DcgmPageConverter", "FIELD_COLUMNS", "SAMPLE_SCHEMA"]
