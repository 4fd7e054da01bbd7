"""GPU topology: what each node's GPUs look like (NVLink islands, NUMA, clique, rack), its history, and the agents'
posts of it. Reads need a read token (node and GPU names only, no team's data); a post is a push, so an agent
token of that very node or an admin token."""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Header, Path, Query, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from gpuledger.analytics import topology as topo
from gpuledger.analytics.fragmentation import allocation_state, live_instant
from gpuledger.analytics.records import json_safe, records
from gpuledger.analytics.windows import as_utc, utc_now
from gpuledger.collector.errors import InputError
from gpuledger.collector.topology import TOPOLOGY_PATH, NodeTopology, from_json, islands
from gpuledger.deploy.api.access import ReadCaller, push_access
from gpuledger.deploy.api.deps import Days, End, StoreDep
from gpuledger.deploy.api.models import TopologyAnswer, TopologyHistory, TopologyIn, TopologyStored

router = APIRouter(tags=["topology"])
NodeQuery = Query(None, min_length=1, max_length=253, pattern=r"^[A-Za-z0-9._:-]+$", description="one node only")


@router.get("/v1/topology", response_model=TopologyAnswer)
def topology(caller: ReadCaller, store: StoreDep, at: datetime | None = End, node: str | None = NodeQuery) -> dict:
    """Each node's GPU topology as of `at` (default now): its NVLink islands, per GPU the PCI bus, NUMA node, CPUs
    and links, per pair the closest path; the cliques and racks across nodes; and the nodes reporting samples
    with no topology stored (their islands are unknown, not one GPU each)."""
    when = as_utc(at) if at else utc_now()
    answer = topo.cluster_topology(store, when, node)
    known = {n["node"] for n in answer["nodes"]}
    present = allocation_state(store, live_instant(store, when)).names if node is None else []
    return json_safe({**answer, "missing": sorted(set(present) - known)})


@router.get("/v1/topology/{node}/history", response_model=TopologyHistory)
def history(caller: ReadCaller, store: StoreDep,
            node: str = Path(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9._:-]+$"),
            days: float = Days, end: datetime | None = End) -> dict:
    """When a node's topology changed over the window: every snapshot, and the one in force at its start."""
    stop = as_utc(end) if end else utc_now()
    return {"node": node, "snapshots": records(topo.topology_history(store, node, stop - timedelta(days=days), stop))}


def _inlined(schema: Any, defs: dict | None = None) -> Any:
    """A model's JSON schema with its `$defs` written in place (they are not in the spec's components: the route
    reads its body itself, so FastAPI does not list the model)."""
    if isinstance(schema, dict):
        defs = schema.get("$defs", defs)
        if "$ref" in schema:
            return _inlined(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
        return {k: _inlined(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inlined(v, defs) for v in schema]
    return schema


@router.post(TOPOLOGY_PATH, response_model=TopologyStored,
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": _inlined(TopologyIn.model_json_schema())}}}})
async def post_topology(request: Request, authorization: str | None = Header(None)) -> dict:
    """An agent's reading of its node's topology, stored when it changed. 422 when it contradicts itself: a GPU
    twice, a link to a GPU not listed, or (measured) islands that are not the NVLink links' connected sets. Its GPUs
    are the node's hardware: registered to the node where free, and from then on the node bills only registered
    GPUs (analytics/store/gpu_inventory.py).

    The token is checked before the body is read (an agent or admin token; deploy/api/limits.py refuses an unknown
    one before that), and the body (up to 6 MiB: 256 GPUs' pairs) is parsed and checked in a worker thread, never
    on the event loop every other request is answered from."""
    identity = request.app.state.gate.identify(authorization)
    if identity is None or identity.role.kind not in ("agent", "admin"):
        push_access(request, "", authorization)  # answers 401 or 403 as any push does
    raw = await request.body()
    found = await run_in_threadpool(_parse, raw)
    push_access(request, found.node, authorization)  # an agent token posts its own node's topology only
    stored = await run_in_threadpool(request.app.state.store.record_topology, found, utc_now())
    writer = request.app.state.ingest
    if writer is not None:  # the node's own hardware: its GPUs registered to it
        await run_in_threadpool(writer.register_hardware, found.node, [(g.uuid, g.gpu_model) for g in found.gpus])
    return {"node": found.node, "stored": stored, "digest": found.digest()}


def _parse(raw: bytes) -> NodeTopology:
    """The posted body as a topology, checked: 422 (InputError) for a body that is not one."""
    try:
        body = TopologyIn.model_validate_json(raw)
    except ValidationError as exc:
        raise InputError(f"not a topology: {exc.errors(include_url=False)[:3]}") from exc
    found = from_json(body.model_dump())
    uuids = [g.uuid for g in found.gpus]
    if len(set(uuids)) != len(uuids):
        raise InputError("a GPU is listed twice")
    unknown = {k.gpu for k in found.links} | {k.peer for k in found.links}
    unknown -= set(uuids)
    if unknown:
        raise InputError(f"links name GPUs not listed: {', '.join(sorted(unknown)[:5])}")
    if found.basis == "measured":
        expected = islands([(g.uuid, g.index) for g in found.gpus], found.links)
        said = {g.uuid: g.island for g in found.gpus}
        if _partition(expected) != _partition(said):
            raise InputError("the islands contradict the NVLink links: GPUs joined by NVLink must share an island, "
                             "and GPUs in one island must be joined")
    return found


def _partition(where: dict[str, int]) -> set[frozenset[str]]:
    groups: dict[int, set[str]] = {}
    for uuid, island in where.items():
        groups.setdefault(island, set()).add(uuid)
    return {frozenset(g) for g in groups.values()}
