"""A node's GPU topology from dcgm-exporter pages.

A page names each GPU (index, UUID, `pci_bus_id`, `modelName`) and, where the exporter exports them, says how GPUs
reach each other: `DCGM_EXP_P2P_STATUS` (dcgm-exporter 4.3.1 and later; one series per GPU and peer, labels
`peer_gpu` and `link_status`, value 0 = "OK") is DCGM's NVLink peer-to-peer status, so islands measured from it;
per-link NVLink counters (`DCGM_FI_DEV_NVLINK_BANDWIDTH_L<n>`, `DCGM_FI_PROF_NVLINK_L<n>_TX_BYTES`/`_RX_BYTES`) say
how many links a GPU has. A page without the P2P status gives islands inferred from the model's board
(collector/topology.py inferred_topology), and says so in the topology's basis and notes.
"""
from __future__ import annotations

import re
from typing import Any

from gpuledger.collector.gpu_catalog import normalize_model
from gpuledger.collector.topology import GpuLink, GpuPlace, NodeTopology, inferred_topology, islands, normal_bus_id

UNKNOWN_NODE = "unknown"  # where the page converter files GPUs of a page naming no node
P2P_STATUS = "DCGM_EXP_P2P_STATUS"
P2P_OK = "OK"
# per-link NVLink fields: the link number is the first group
PER_LINK = re.compile(r"^DCGM_FI_(?:DEV_NVLINK_BANDWIDTH_L(\d+)|PROF_NVLINK_L(\d+)_(?:TX|RX)_BYTES)$")
NVLINK_TOTALS = ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES")


def is_topology_field(name: str) -> bool:
    """A field read for topology only (not a sample column): not an unknown metric."""
    return name == P2P_STATUS or PER_LINK.match(name) is not None


def _int(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


class PageTopology:
    """What the pages of one scrape say of each node's GPUs; `topologies()` turns it into NodeTopology per node."""

    def __init__(self, source: str = "dcgm") -> None:
        self.source = source
        self.gpus: dict[tuple[str, str], dict[str, Any]] = {}  # (node, UUID) -> facts
        self.p2p: dict[tuple[str, int, int], bool] = {}  # (node, GPU index, peer index) -> OK
        self.links: dict[tuple[str, str], set[int]] = {}  # (node, UUID) -> NVLink links with a counter

    def clear(self) -> None:
        self.gpus.clear()
        self.p2p.clear()
        self.links.clear()

    def observe(self, node: str, uuid: str, name: str, labels: Any, value: float, topology_only: bool) -> None:
        """One sample of a page: every series of a GPU names it; the P2P and per-link fields (`topology_only`, as
        is_topology_field says) and the NVLink totals say more. Called for every sample, so the rest returns at
        once."""
        key = (node, uuid)
        facts = self.gpus.get(key)
        if facts is None:
            model_name = labels.get("modelName") or None
            facts = self.gpus[key] = {"uuid": uuid, "index": _int(labels.get("gpu")),
                                      "gpu_model": normalize_model(model_name), "model_name": model_name,
                                      "pci_bus_id": normal_bus_id(labels.get("pci_bus_id")), "nvlink_bytes": 0.0}
        if not topology_only:
            if name in NVLINK_TOTALS and value == value and value > 0:
                facts["nvlink_bytes"] += value
            return
        if name == P2P_STATUS:
            peer = _int(labels.get("peer_gpu"))
            if facts["index"] is not None and peer is not None:
                status = labels.get("link_status")
                self.p2p[(node, facts["index"], peer)] = (status == P2P_OK) if status else value == 0
            return
        found = PER_LINK.match(name)
        if found:
            self.links.setdefault(key, set()).add(int(found.group(1) or found.group(2)))

    def topologies(self) -> list[NodeTopology]:
        out = []
        for node in sorted({n for n, _ in self.gpus} - {UNKNOWN_NODE}):  # GPUs of unnamed nodes: no place
            gpus = [dict(f, nvlink_links=len(self.links[(node, u)]) if (node, u) in self.links else None)
                    for (n, u), f in self.gpus.items() if n == node]
            if any(n == node for n, _, _ in self.p2p):
                out.append(self._measured(node, gpus))
            else:
                out.append(inferred_topology(node, self.source, gpus))
        return out

    def _measured(self, node: str, gpus: list[dict[str, Any]]) -> NodeTopology:
        """Islands from DCGM's NVLink P2P status, asked both ways: a pair OK one way only is a contradiction, noted
        and not counted."""
        by_index = {g["index"]: g for g in gpus if g["index"] is not None}
        links, notes = [], []
        indexes = sorted(by_index)
        for i, a in enumerate(indexes):
            for b in indexes[i + 1:]:
                ab, ba = self.p2p.get((node, a, b)), self.p2p.get((node, b, a))
                if ab is None and ba is None:
                    continue
                if ab != ba:
                    notes.append(f"GPU {a} reports NVLink P2P to GPU {b} as {_said(ab)}, GPU {b} to GPU {a} as "
                                 f"{_said(ba)}: not counted as NVLink")
                    continue
                if ab:
                    links.append(GpuLink(*sorted((by_index[a]["uuid"], by_index[b]["uuid"])), "nvlink"))
        where = islands([(g["uuid"], g["index"]) for g in gpus], links)
        places = tuple(GpuPlace(g["uuid"], g["index"], g["gpu_model"], where[g["uuid"]], g["pci_bus_id"],
                                nvlink_links=g["nvlink_links"]) for g in gpus)
        return NodeTopology(node, self.source, "measured", places, tuple(links), tuple(notes))


def _said(ok: bool | None) -> str:
    return "not reported" if ok is None else "OK" if ok else "not OK"
