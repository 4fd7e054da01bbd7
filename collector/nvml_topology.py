"""A node's GPU topology read through NVML: per GPU its PCI bus, NUMA node, CPU affinity, active NVLink links and
fabric clique; per pair the closest common path (nvmlDeviceGetTopologyCommonAncestor) and whether they reach each
other over NVLink.

NVLink between two GPUs is taken from both sides: NVML's NVLink peer-to-peer status asked each way (what holds for
NVSwitch boards, where a GPU's links end at a switch), or the links whose remote PCI device is the peer. When the
two sides disagree the pair is not counted as NVLink and a note names it: a topology never rests on one side's word.

Every call is guarded the way the sample path is: NotSupported (consumer cards, MIG, old drivers) or a name an older
nvidia-ml-py lacks leaves that fact unknown (None), never a guess. The topology changes only with hardware or driver
state, so the source reads it on a long interval, not every sample.
"""
from __future__ import annotations

import ctypes
import logging
from typing import Any, Callable

from gpuledger.collector.gpu_catalog import normalize_model
from gpuledger.collector.topology import NVML_LEVELS, GpuLink, GpuPlace, NodeTopology, cpu_list, islands, normal_bus_id

log = logging.getLogger(__name__)
CPU_SET_WORDS = 64  # unsigned 64-bit words asked of nvmlDeviceGetCpuAffinity: 4,096 CPUs


def nvml_text(value: Any) -> str:
    """A string NVML answered: bytes from an older nvidia-ml-py, str from a newer one."""
    return value.decode() if isinstance(value, bytes) else str(value)


class _Reader:
    """One topology read: NVML calls with NotSupported / missing names as None."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.failed: dict[str, str] = {}  # call -> why, once per read (logged at the end)

    def call(self, name: str, *args: Any) -> Any:
        fn: Callable[..., Any] | None = getattr(self.nvml, name, None)
        if fn is None:
            self.failed.setdefault(name, "not in this nvidia-ml-py")
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            self.failed.setdefault(name, str(exc))
            return None


def _affinity(reader: _Reader, handle: Any) -> str | None:
    words = reader.call("nvmlDeviceGetCpuAffinity", handle, CPU_SET_WORDS)
    if words is None:
        return None
    return cpu_list(w * 64 + bit for w, mask in enumerate(words) for bit in range(64) if int(mask) >> bit & 1)


def _links(reader: _Reader, handle: Any, max_links: int) -> tuple[int | None, dict[str, int]]:
    """(active links, or None where the GPU has no NVLink; remote GPU bus id -> links to it)."""
    nvml = reader.nvml
    active, to_gpu = 0, {}
    for link in range(max_links):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError_NotSupported:
            return (None, {}) if link == 0 else (active, to_gpu)
        except nvml.NVMLError_InvalidArgument:
            break  # past this GPU's links
        except nvml.NVMLError as exc:
            reader.failed.setdefault("nvmlDeviceGetNvLinkState", str(exc))
            break
        if state != nvml.NVML_FEATURE_ENABLED:
            continue
        active += 1
        kind = reader.call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if kind is not None and kind != nvml.NVML_NVLINK_DEVICE_TYPE_GPU:
            continue  # a switch (or an IBM NPU): reachability comes from the peer-to-peer status
        remote = reader.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        bus = normal_bus_id(getattr(remote, "busId", None)) if remote is not None else None
        if bus is not None:
            to_gpu[bus] = to_gpu.get(bus, 0) + 1
    return active, to_gpu


def _fabric(reader: _Reader, handle: Any) -> tuple[str | None, str | None]:
    """(clique id, cluster UUID) of a GPU in a multi-node NVLink fabric whose registration completed, else Nones."""
    nvml = reader.nvml
    struct = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
    if struct is None:
        return None, None
    info = struct()
    if reader.call("nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info)) is None:
        return None, None
    if info.state != nvml.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != nvml.NVML_SUCCESS:
        return None, None
    raw = bytes(info.clusterUuid)
    if not any(raw):
        return None, None
    hexed = raw.hex()
    cluster = f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:32]}"
    return str(int(info.cliqueId)), cluster


def read_topology(nvml: Any, node: str, max_links: int) -> NodeTopology:
    """The topology of every GPU NVML sees on this node (NVML initialised by the caller)."""
    reader = _Reader(nvml)
    gpus: list[dict[str, Any]] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml_text(nvml.nvmlDeviceGetUUID(handle))
            name = nvml_text(nvml.nvmlDeviceGetName(handle))
        except nvml.NVMLError as exc:  # a lost GPU: the others are still placed
            log.warning("NVML topology: GPU %d unreadable: %s", index, exc)
            continue
        pci = reader.call("nvmlDeviceGetPciInfo", handle)
        active, to_gpu = _links(reader, handle, max_links)
        clique, cluster = _fabric(reader, handle)
        gpus.append({"handle": handle, "uuid": uuid, "index": index, "model": normalize_model(name),
                     "bus": normal_bus_id(getattr(pci, "busId", None)) if pci is not None else None,
                     "numa": reader.call("nvmlDeviceGetNumaNodeId", handle), "cpus": _affinity(reader, handle),
                     "active": active, "to_gpu": to_gpu, "clique": clique, "cluster": cluster})
    links, notes = _pairs(reader, gpus)
    where = islands([(g["uuid"], g["index"]) for g in gpus], links)
    places = tuple(GpuPlace(g["uuid"], g["index"], g["model"], where[g["uuid"]], g["bus"], g["numa"], g["cpus"],
                            g["active"], g["clique"], g["cluster"]) for g in gpus)
    if reader.failed:
        log.info("NVML topology on %s: not read: %s", node,
                 "; ".join(f"{k}: {v}" for k, v in sorted(reader.failed.items())))
    return NodeTopology(node, "nvml", "measured", places, tuple(links), tuple(notes))


def _pairs(reader: _Reader, gpus: list[dict[str, Any]]) -> tuple[list[GpuLink], list[str]]:
    nvml = reader.nvml
    nvlink_caps = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)
    links, notes = [], []
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            level = reader.call("nvmlDeviceGetTopologyCommonAncestor", a["handle"], b["handle"])
            path = NVML_LEVELS.get(level, "system") if level is not None else None
            ab = a["to_gpu"].get(b["bus"], 0) if b["bus"] else 0
            ba = b["to_gpu"].get(a["bus"], 0) if a["bus"] else 0
            p2p = [None, None]
            if nvlink_caps is not None:
                p2p = [reader.call("nvmlDeviceGetP2PStatus", x["handle"], y["handle"], nvlink_caps)
                       for x, y in ((a, b), (b, a))]
            says = [s == nvml.NVML_P2P_STATUS_OK if s is not None else None for s in p2p]
            direct_disagrees = (ab > 0) != (ba > 0)
            p2p_disagrees = None not in says and says[0] != says[1]
            if direct_disagrees or p2p_disagrees:
                who = (f"{a['uuid']} reports {ab} NVLink link(s) to {b['uuid']}, which reports {ba} back"
                       if direct_disagrees else
                       f"NVLink peer-to-peer between {a['uuid']} and {b['uuid']} is "
                       f"{'OK' if says[0] else 'not OK'} one way and {'OK' if says[1] else 'not OK'} the other")
                notes.append(who + ": not counted as NVLink")
            elif ab > 0 or says == [True, True]:
                path = "nvlink"
            if path is not None:
                links.append(GpuLink(*sorted((a["uuid"], b["uuid"])), path, min(ab, ba)))
    return links, notes
