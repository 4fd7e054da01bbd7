"""An agent's word that a GPU runs a job, held against where the job's scheduler placed it.

Why: a row's job and team are the pushing agent's word. An agent attached its node's idle GPUs to another team's
real job (a 4-GPU job became 12 GPUs at twice the cost), the recommender then advised reclaiming that job and the
team got 32 "idle job" alerts. Where a job source knows the job (Kubernetes pods through kube-state-metrics, Slurm
through sacct/squeue), its record names the node or nodes it runs on; a row from another node that claims it is
not evidence about that job. Such a row keeps its GPU-time (the GPU is the node's own, registered: billing it to
nobody would hide it) but loses the claim: it is stored as the node's unattributed use, counted
(`gpuledger_ingest_rows_unattributed_total{reason="job_not_on_node"}`) and logged, so no advice or alert about the
job rests on it.

A site can narrow it further: `[pool_teams]` names the teams each node pool's agents may bill (a pool bought by
one department); a row from such a node naming another team is stored the same way (`team_not_in_pool`).
"""
from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

JOB_NOT_ON_NODE = "job_not_on_node"
TEAM_NOT_IN_POOL = "team_not_in_pool"
CLAIM_COLUMNS = ("job_id", "team", "user", "namespace", "pod", "container")  # what the claim names
MAX_EXPANDED = 4096  # nodes one Slurm node list may expand to: a longer one is not read as a placement
_RANGE = re.compile(r"^(\d+)-(\d+)$")


def expand_nodes(text: str) -> set[str] | None:
    """The node names a scheduler's node field lists: one name, a comma-separated list, or Slurm's compressed
    form (`gpu-[01-04,07],login1`); None for a form this does not read (then nothing is checked against it)."""
    names: set[str] = set()
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        item = item.strip()
        if not item:
            continue
        match = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", item)
        if "[" not in item:
            names.add(item)
            continue
        if match is None:
            return None  # two bracket groups in one name: not a form schedulers write for GPU nodes
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            bounds = _RANGE.match(part.strip())
            if bounds is None:
                if not part.strip().isdigit():
                    return None
                names.add(f"{prefix}{part.strip()}{suffix}")
                continue
            lo, hi = bounds.groups()
            if int(hi) < int(lo) or int(hi) - int(lo) + len(names) > MAX_EXPANDED:
                return None
            width = len(lo)
            names.update(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
    return names or None


def misplaced(cur: Any, rows: pa.Table) -> pa.Array | None:
    """Per row, whether it claims a job its scheduler places on other nodes only (None when no row does: the usual
    case). Only jobs a source recorded with their node(s) are checked; a job with no node yet (pending) is not."""
    claimed = pc.unique(pc.drop_null(rows["job_id"]))
    if not len(claimed):
        return None
    cur.register("claimed_jobs", pa.table({"job_id": claimed}))
    try:
        placed = cur.execute("""SELECT j.job_id, j.node FROM jobs j JOIN claimed_jobs c USING (job_id)
                                WHERE j.node IS NOT NULL AND j.source IS NOT NULL""").fetchall()
    finally:
        cur.unregister("claimed_jobs")
    wrong: list[tuple[str, str]] = []
    if not placed:
        return None
    where = {job: expand_nodes(node) for job, node in placed}
    pairs = rows.select(["job_id", "node"]).group_by(["job_id", "node"], use_threads=False).aggregate([])
    for job, node in zip(pairs["job_id"].to_pylist(), pairs["node"].to_pylist()):
        nodes = where.get(job)
        if nodes is not None and node not in nodes:
            wrong.append((job, node))
    if not wrong:
        return None
    mask = None
    for job, node in wrong:
        one = pc.and_(pc.equal(rows["job_id"], job), pc.equal(rows["node"], node))
        mask = one if mask is None else pc.or_(mask, one)
    return pc.fill_null(mask, False)


def outside_pool(cur: Any, rows: pa.Table, pool_teams: dict[str, tuple[str, ...]]) -> pa.Array | None:
    """Per row, whether it names a team the config does not let its node's pool bill (`[pool_teams]`); None when
    none does, or no pool is restricted. A node's pool is the store's `pool_of` (the [node_pools] rules)."""
    if not pool_teams or not rows.num_rows:
        return None
    nodes = pc.unique(rows["node"]).to_pylist()
    pools = dict(cur.execute("SELECT n, pool_of(n) FROM (SELECT unnest($nodes) AS n)", {"nodes": nodes}).fetchall())
    mask = None
    for node, pool in pools.items():
        allowed = pool_teams.get(pool) if pool is not None else None
        if allowed is None:
            continue
        one = pc.and_(pc.equal(rows["node"], node),
                      pc.invert(pc.is_in(rows["team"], value_set=pa.array(list(allowed), pa.string()))))
        one = pc.and_(one, pc.is_valid(rows["team"]))
        mask = one if mask is None else pc.or_(mask, one)
    if mask is None:
        return None
    mask = pc.fill_null(mask, False)
    return mask if pc.any(mask).as_py() else None


def without_claim(rows: pa.Table, mask: pa.Array) -> pa.Table:
    """The rows with the claim taken off where `mask` is true: no job, team, user, namespace, pod or container."""
    for name in CLAIM_COLUMNS:
        column = rows[name]
        rows = rows.set_column(rows.schema.get_field_index(name), name,
                               pc.if_else(mask, pa.scalar(None, column.type), column))
    return rows
