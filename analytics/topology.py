"""The cluster's GPU topology as of an instant: per node its GPUs, NVLink islands, NUMA nodes, clique and rack, from
the stored snapshots (analytics/store/topology.py), and its history.

Where two sources describe one node the measured one wins (NVML asked pair by pair over a dcgm-exporter page read
with the model's board), then the newest. A node's labels (kube-state-metrics) fill the clique and rack its GPUs do
not report. A node with no snapshot has no topology: the placement API says so instead of treating its GPUs as one
island or as separate ones.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpuledger.analytics.records import records
from gpuledger.collector.jobs.kube_state import label_key
from gpuledger.collector.topology import BASES, CLIQUE_LABEL, UNKNOWN_ISLAND

if TYPE_CHECKING:
    from gpuledger.analytics.store import Store

_CHOSEN = """
    WITH ranked AS (
        SELECT *, row_number() OVER (PARTITION BY node ORDER BY
                   CASE basis {order} END, ts DESC) AS k
        FROM topology_snapshots WHERE ts <= $at AND ($node IS NULL OR node = $node)),
    chosen AS (SELECT ts, node, source, basis, notes FROM ranked WHERE k = 1),
    labels AS (SELECT node, arg_max(value, ts) FILTER (label = $clique_label) AS label_clique,
                      arg_max(value, ts) FILTER (label = $rack_label) AS label_rack
               FROM node_label_changes WHERE ts <= $at GROUP BY node)
""".format(order=" ".join(f"WHEN '{b}' THEN {i}" for i, b in enumerate(BASES)))


def _params(at: datetime, node: str | None, rack_label: str) -> dict[str, Any]:
    """The labels are read as kube-state-metrics names them (label_nvidia_com_gpu_clique); no rack label set: none."""
    return {"at": at, "node": node, "clique_label": label_key(CLIQUE_LABEL),
            "rack_label": label_key(rack_label) if rack_label else None}


def topology_gpus(store: "Store", at: datetime, node: str | None = None, rack_label: str = "") -> pd.DataFrame:
    """One row per GPU of every node's chosen snapshot as of `at`: its island, place and the snapshot's source,
    basis and time; clique and rack filled from the node's labels where the GPU does not report them."""
    return store.query(_CHOSEN + """
        SELECT g.node, g.gpu_uuid, g.gpu_index, g.gpu_model, g.island, g.pci_bus_id, g.numa_node, g.cpu_affinity,
               g.nvlink_links, coalesce(g.clique_id, l.label_clique) AS clique_id, g.cluster_uuid,
               coalesce(g.rack, l.label_rack) AS rack, c.source, c.basis, c.ts AS observed_at, c.notes
        FROM chosen c JOIN topology_gpus g ON g.node = c.node AND g.source = c.source AND g.ts = c.ts
        LEFT JOIN labels l ON l.node = c.node
        ORDER BY g.node, g.gpu_index NULLS LAST, g.gpu_uuid""", _params(at, node, rack_label))


def topology_links(store: "Store", at: datetime, node: str | None = None) -> pd.DataFrame:
    """The GPU pairs of every node's chosen snapshot as of `at`."""
    return store.query(_CHOSEN + """
        SELECT k.node, k.gpu_uuid, k.peer_uuid, k.path, k.nvlinks
        FROM chosen c JOIN topology_links k ON k.node = c.node AND k.source = c.source AND k.ts = c.ts
        ORDER BY k.node, k.gpu_uuid, k.peer_uuid""", _params(at, node, ""))


def cluster_topology(store: "Store", at: datetime, node: str | None = None, rack_label: str = "") -> dict[str, Any]:
    """Per node: source, basis, since when, notes, its islands (GPUs, model, how they connect) and GPUs; across
    nodes the cliques (multi-node NVLink) and racks. Nodes without a stored topology are not listed."""
    gpus = topology_gpus(store, at, node, rack_label)
    links = topology_links(store, at, node)
    nodes = []
    for name, mine in gpus.groupby("node", sort=True):
        pairs = links[links["node"] == name]
        islands = []
        for island, members in mine.groupby("island", sort=True):
            uuids = set(members["gpu_uuid"])
            inside = pairs[pairs["gpu_uuid"].isin(uuids) & pairs["peer_uuid"].isin(uuids)]
            islands.append({"island": int(island), "gpus": int(len(members)),
                            "gpu_indexes": [None if pd.isna(i) else int(i) for i in members["gpu_index"]],
                            "gpu_uuids": members["gpu_uuid"].tolist(),
                            "gpu_model": str(members["gpu_model"].iloc[0]),
                            "direct_nvlinks": int(inside["nvlinks"].sum()) if len(inside) else None,
                            "numa_nodes": sorted({int(n) for n in members["numa_node"].dropna()})})
        first = mine.iloc[0]
        nodes.append({"node": name, "source": first["source"], "basis": first["basis"],
                      "observed_at": first["observed_at"], "notes": json.loads(first["notes"] or "[]"),
                      "gpus": int(len(mine)), "islands": islands,
                      "largest_island": max(i["gpus"] for i in islands),
                      "clique_id": _single(mine["clique_id"]), "rack": _single(mine["rack"]),
                      "gpu_places": records(mine.drop(columns=["node", "source", "basis", "observed_at", "notes"])),
                      "paths": records(pairs.drop(columns=["node"]))})
    cliques: dict[str, list[str]] = {}
    racks: dict[str, list[str]] = {}
    for entry in nodes:
        if entry["clique_id"] is not None:
            cliques.setdefault(entry["clique_id"], []).append(entry["node"])
        if entry["rack"] is not None:
            racks.setdefault(entry["rack"], []).append(entry["node"])
    return {"at": at, "nodes": nodes,
            "cliques": [{"clique_id": c, "nodes": n} for c, n in sorted(cliques.items())],
            "racks": [{"rack": r, "nodes": n} for r, n in sorted(racks.items())]}


def _single(values: pd.Series) -> str | None:
    """The one value a node's GPUs share (a clique, a rack); None when none or several."""
    found = set(values.dropna())
    return str(next(iter(found))) if len(found) == 1 else None


def node_groups(store: "Store", at: datetime, names: list[str], scope: str, rack_label: str = "") -> list[str | None]:
    """Per node named, the group a multi-node job is kept inside for `scope` (collector/topology.py SCOPES): its
    clique or rack as of `at` (None: not known, or its GPUs disagree); for island and node, one group of all."""
    if scope not in ("clique", "rack"):
        return ["cluster"] * len(names)
    gpus = topology_gpus(store, at, rack_label=rack_label)
    column = "clique_id" if scope == "clique" else "rack"
    found = {str(node): _single(rows[column]) for node, rows in gpus.groupby("node")}
    return [found.get(name) for name in names]


def topology_history(store: "Store", node: str, start: datetime, end: datetime) -> pd.DataFrame:
    """Every snapshot of a node in [start, end) and the newest before, per source: when its topology changed."""
    return store.query("""
        SELECT s.ts, s.source, s.basis, s.digest, s.notes, count(g.gpu_uuid) AS gpus,
               count(DISTINCT g.island) AS islands
        FROM topology_snapshots s LEFT JOIN topology_gpus g ON g.node = s.node AND g.source = s.source AND g.ts = s.ts
        WHERE s.node = $node AND s.ts < $end
          AND s.ts >= coalesce((SELECT max(ts) FROM topology_snapshots WHERE node = $node AND ts <= $start), $start)
        GROUP BY ALL ORDER BY s.ts, s.source""", {"node": node, "start": start, "end": end})


def slot_islands(store: "Store", at: datetime, gpu_ids: list[list[str]] | None, width: int) -> list[np.ndarray]:
    """Per node of an allocation state (its GPUs' UUIDs by slot), each slot's NVLink island as of `at`;
    UNKNOWN_ISLAND for a GPU without a stored topology."""
    if not gpu_ids:
        return []
    gpus = topology_gpus(store, at)
    island = dict(zip(gpus["gpu_uuid"], gpus["island"].astype(int)))
    return [np.array([island.get(u, UNKNOWN_ISLAND) for u in ids] + [UNKNOWN_ISLAND] * (width - len(ids)),
                     dtype=np.int64) for ids in gpu_ids]
