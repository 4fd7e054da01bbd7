"""A node's GPU topology: where each GPU sits (PCI bus, NUMA node, CPUs, NVLink island, fabric clique, rack) and
how each pair of GPUs talks (the closest common path NVML reports, NVLink or not).

Why it is collected: a multi-GPU job split across NVLink islands runs its all-reduce over PCIe or the network,
several times slower, while every utilisation figure still looks fine. Placement advice therefore needs the islands,
and colocate advice the cliques and racks. The sources say it with different certainty, so every node's topology
carries its `basis`: `measured` (NVML asked pair by pair), `inferred` (a dcgm-exporter page names the GPUs and their
model, and the island follows from the model's board, a rule stated in the notes) or `unknown`.

An island is a set of GPUs of one node that reach each other over NVLink (directly or through NVSwitch). A link one
GPU reports and its peer does not is a contradiction: it is not counted, and a note says so (never a silent edge).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from gpuledger.collector.gpu_catalog import MODELS

# the path between two GPUs, closest first: NVLink (direct or through NVSwitch), then NVML's topology levels
PATHS = ("nvlink", "board", "pcie-switch", "pcie-switches", "host-bridge", "numa", "system")
# nvml.h nvmlGpuTopologyLevel_t -> path (NVML_TOPOLOGY_INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM)
NVML_LEVELS = {0: "board", 10: "pcie-switch", 20: "pcie-switches", 30: "host-bridge", 40: "numa", 50: "system"}
BASES = ("measured", "inferred", "unknown")  # how a node's islands are known
# what a multi-GPU job can be kept inside, narrowest first (analytics/config.py [topology] keep_within)
SCOPES = ("island", "node", "clique", "rack")
CLIQUE_LABEL = "nvidia.com/gpu.clique"  # the node label NVIDIA's GPU feature discovery sets on multi-node NVLink
TOPOLOGY_PATH = "/v1/topology"  # where an agent posts its node's topology
# who reports a topology (the store keeps one history per node and source)
SOURCES = ("nvml", "dcgm", "prometheus", "simulator")
UNKNOWN_ISLAND = -1  # a GPU slot with no stored topology: unknown, never taken as alone or as joined
MAX_GPUS_PER_NODE = 256  # a node claiming more is refused (an NVL72 rack is 72 GPUs over 18 nodes)
_BUS_ID = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")


def normal_bus_id(value: Any) -> str | None:
    """A PCI bus id as NVML and dcgm-exporter write it ("00000000:53:00.0"), lower case; None when it is not one
    (so a hostile label never becomes a key)."""
    if value is None:
        return None
    text = (value.decode(errors="replace") if isinstance(value, bytes) else str(value)).strip().lower()
    return text if _BUS_ID.match(text) else None


def cpu_list(cpus: Iterable[int]) -> str | None:
    """CPUs as Linux writes a cpulist ("0-47,96-143"); None for none."""
    ids = sorted(set(cpus))
    if not ids:
        return None
    runs, start, prev = [], ids[0], ids[0]
    for cpu in ids[1:] + [None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        runs.append(f"{start}-{prev}" if prev > start else str(start))
        if cpu is not None:
            start = prev = cpu
    return ",".join(runs)


@dataclass(frozen=True)
class GpuPlace:
    """One GPU's place in its node and cluster; None where the source does not say."""
    uuid: str
    index: int | None
    gpu_model: str
    island: int  # the node's NVLink island (GPUs alone in theirs have one each), numbered from 0 by lowest index
    pci_bus_id: str | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None  # a cpulist
    nvlink_links: int | None = None  # active NVLink links of the GPU (to peers or switches)
    clique_id: str | None = None  # multi-node NVLink (GB200 NVL72): the fabric's clique, with cluster_uuid
    cluster_uuid: str | None = None
    rack: str | None = None  # a site's rack label on the node (kube-state-metrics)


@dataclass(frozen=True)
class GpuLink:
    """How two GPUs of a node talk: `path` is one of PATHS; `nvlinks` the direct links between them (0 through
    NVSwitch, or no NVLink)."""
    gpu: str
    peer: str
    path: str
    nvlinks: int = 0


@dataclass(frozen=True)
class NodeTopology:
    node: str
    source: str  # nvml, dcgm, simulator
    basis: str  # one of BASES
    gpus: tuple[GpuPlace, ...]
    links: tuple[GpuLink, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def digest(self) -> str:
        """What identifies this topology: a node whose next reading has the same digest has not changed, so the
        store keeps one row per change, not per read."""
        body = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "source": self.source, "basis": self.basis,
                "gpus": [asdict(g) for g in sorted(self.gpus, key=_gpu_order)],
                "links": [asdict(link) for link in sorted(self.links, key=lambda k: (k.gpu, k.peer))],
                "notes": list(self.notes)}


def _gpu_order(gpu: GpuPlace) -> tuple[int, str]:
    return (gpu.index if gpu.index is not None else 1 << 30, gpu.uuid)


def islands(gpus: Iterable[tuple[str, int | None]], links: Iterable[GpuLink]) -> dict[str, int]:
    """GPU -> island: the connected sets of NVLink paths, numbered from 0 in order of their lowest GPU index."""
    ordered = sorted(gpus, key=lambda g: (g[1] if g[1] is not None else 1 << 30, g[0]))
    parent = {uuid: uuid for uuid, _ in ordered}

    def root(uuid: str) -> str:
        while parent[uuid] != uuid:
            parent[uuid] = parent[parent[uuid]]
            uuid = parent[uuid]
        return uuid

    for link in links:
        if link.path == "nvlink" and link.gpu in parent and link.peer in parent:
            parent[root(link.gpu)] = root(link.peer)
    numbers: dict[str, int] = {}
    out = {}
    for uuid, _ in ordered:
        out[uuid] = numbers.setdefault(root(uuid), len(numbers))
    return out


# The board a catalogue model comes on, for a source that names GPUs but not their links (a dcgm-exporter page):
# an SXM/HGX board joins a node's GPUs through NVSwitch (one island); a PCIe card has no NVLink, or bridges to one
# neighbour that the page does not show (each GPU alone: the careful answer, stated). Names the driver reports with
# "PCIe" or "NVL" are cards whatever the model.
_SWITCHED = ("H200", "H100", "GB200", "B200", "A100-80GB", "A100-40GB", "V100")
_CARD_NAME = re.compile(r"\b(?:PCIe|PCIE|NVL)\b|-PCIE-")


def inferred_islands(model: str, model_name: str | None) -> tuple[str, str]:
    """('node' | 'alone', the rule as a note) for GPUs of this model on one node."""
    card = bool(model_name and _CARD_NAME.search(model_name))
    if model in _SWITCHED and not card:
        return "node", (f"{model} ({model_name or 'no model name'}) is an SXM board: its GPUs on one node are taken "
                        "as one NVSwitch island (inferred from the model, not measured)")
    nvlink = bool(getattr(MODELS.get(model), "nvlink", False))
    why = ("a PCIe card whose NVLink bridges the page does not show" if nvlink and card else
           "an SXM2 board whose NVLink mesh does not join every pair, and the page does not say which" if nvlink else
           "a card without NVLink" if model in MODELS else "a model the catalogue does not know")
    return "alone", f"{model} ({model_name or 'no model name'}): {why}; each GPU is taken as its own island"


def inferred_topology(node: str, source: str, gpus: list[dict[str, Any]]) -> NodeTopology:
    """A node's topology from what a page says of its GPUs (uuid, index, gpu_model, model_name, pci_bus_id,
    nvlink_links, nvlink_bytes): islands by the model's board, and a note wherever the page contradicts the rule
    (NVLink traffic on a card taken to have none)."""
    notes, places = [], []
    by_model: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for gpu in sorted(gpus, key=lambda g: (g.get("index") if g.get("index") is not None else 1 << 30, g["uuid"])):
        by_model.setdefault((gpu["gpu_model"], gpu.get("model_name")), []).append(gpu)
    island = 0
    for (model, model_name), members in by_model.items():
        scope, note = inferred_islands(model, model_name)
        notes.append(note)
        for gpu in members:
            if scope == "alone" and (gpu.get("nvlink_bytes") or 0) > 0:
                notes.append(f"{gpu['uuid']} reports NVLink traffic although {model} is taken to have no NVLink "
                             "peer here: its island is unknown, kept alone")
            places.append(GpuPlace(gpu["uuid"], gpu.get("index"), model, island, gpu.get("pci_bus_id"),
                                   nvlink_links=gpu.get("nvlink_links")))
            island += scope == "alone"
        island += scope == "node"
    return NodeTopology(node, source, "inferred", tuple(places), (), tuple(dict.fromkeys(notes)))


def from_json(data: dict[str, Any]) -> NodeTopology:
    """The inverse of NodeTopology.to_json (what an agent posts, once validated by the API's model)."""
    return NodeTopology(data["node"], data["source"], data["basis"],
                        tuple(GpuPlace(**g) for g in data["gpus"]), tuple(GpuLink(**k) for k in data.get("links", ())),
                        tuple(data.get("notes", ())))
