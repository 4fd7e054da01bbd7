"""GPU topology with its history: one snapshot per node and source each time what it reports changes.

Why snapshots of changes and not readings: a topology is read every ten minutes but changes only when hardware,
driver or fabric state does (a failed NVLink, a node moved to another rack), and the question asked of history is
"what did this node look like when job X ran, and since when". A snapshot's rows (its GPUs and their pairs) are
written in one transaction with it, so a reader never sees half of one.

Node labels (a clique or rack a site sets on the node, read through kube-state-metrics) are kept as their changes,
apart: they arrive from another source and fill what the GPUs do not report themselves.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any, Mapping

import pandas as pd

from gpuledger.collector.topology import NodeTopology

if TYPE_CHECKING:
    from gpuledger.analytics.store.database import Store

DDL = [
    """CREATE TABLE IF NOT EXISTS topology_snapshots (
    ts TIMESTAMPTZ NOT NULL, node VARCHAR NOT NULL, source VARCHAR NOT NULL, basis VARCHAR NOT NULL,
    digest VARCHAR NOT NULL, notes VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS topology_gpus (
    ts TIMESTAMPTZ NOT NULL, node VARCHAR NOT NULL, source VARCHAR NOT NULL, gpu_uuid VARCHAR NOT NULL,
    gpu_index INTEGER, gpu_model VARCHAR, island INTEGER NOT NULL, pci_bus_id VARCHAR, numa_node INTEGER,
    cpu_affinity VARCHAR, nvlink_links INTEGER, clique_id VARCHAR, cluster_uuid VARCHAR, rack VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS topology_links (
    ts TIMESTAMPTZ NOT NULL, node VARCHAR NOT NULL, source VARCHAR NOT NULL, gpu_uuid VARCHAR NOT NULL,
    peer_uuid VARCHAR NOT NULL, path VARCHAR NOT NULL, nvlinks INTEGER NOT NULL)""",
    # every change of a node's labels (node_labels keeps only the newest, for pool rules): value null = removed
    """CREATE TABLE IF NOT EXISTS node_label_changes (
    ts TIMESTAMPTZ NOT NULL, node VARCHAR NOT NULL, label VARCHAR NOT NULL, value VARCHAR)""",
]

_GPU_COLUMNS = {"uuid": "gpu_uuid", "index": "gpu_index"}


def record_topology(store: "Store", topology: NodeTopology, at: datetime) -> bool:
    """Store `topology` as of `at` when it differs from the newest snapshot of its node and source; True when
    stored."""
    digest = topology.digest()
    with store.transaction() as cur:
        newest = cur.execute("""SELECT digest FROM topology_snapshots WHERE node = ? AND source = ?
                                ORDER BY ts DESC LIMIT 1""", [topology.node, topology.source]).fetchone()
        if newest is not None and newest[0] == digest:
            return False
        key = {"ts": pd.Timestamp(at), "node": topology.node, "source": topology.source}
        cur.execute("INSERT INTO topology_snapshots VALUES (?, ?, ?, ?, ?, ?)",
                    [at, topology.node, topology.source, topology.basis, digest, json.dumps(list(topology.notes))])
        gpus = pd.DataFrame([{**key, **{_GPU_COLUMNS.get(k, k): v for k, v in asdict(g).items()}}
                             for g in topology.gpus])
        links = pd.DataFrame([{**key, "gpu_uuid": k.gpu, "peer_uuid": k.peer, "path": k.path, "nvlinks": k.nvlinks}
                              for k in topology.links])
        for table, frame in (("topology_gpus", gpus), ("topology_links", links)):
            if len(frame):
                cur.register("incoming_topology", frame)
                cur.execute(f"INSERT INTO {table} BY NAME SELECT * FROM incoming_topology")
                cur.unregister("incoming_topology")
    return True


def record_label_changes(cur: Any, labels: Mapping[str, Mapping[str, str]], at: datetime) -> int:
    """Inside the transaction that replaces these nodes' newest labels (Store.set_node_labels), before it does:
    keep each label that changed, appeared or went away; the changes kept."""
    old = cur.execute("SELECT node, label, value FROM node_labels WHERE node IN (SELECT unnest($nodes))",
                      {"nodes": list(labels)}).fetchall()
    before = {(node, label): value for node, label, value in old}
    after = {(node, label): value for node, values in labels.items() for label, value in values.items()}
    changes = [[at, node, label, after.get((node, label))] for node, label in sorted(set(before) | set(after))
               if before.get((node, label)) != after.get((node, label))]
    if changes:
        cur.executemany("INSERT INTO node_label_changes VALUES (?, ?, ?, ?)", changes)
    return len(changes)
