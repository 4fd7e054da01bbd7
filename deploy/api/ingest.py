"""Central ingest: agents push their spooled batches here (the contract is collector/wire.py)."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from gpuledger.analytics.store.metrics import HTTP_REFUSED
from gpuledger.collector.wire import (
    BATCHES_HEADER,
    CONTENT_TYPE,
    INGEST_PATH,
    INTERVAL_HEADER,
    NODE_HEADER,
    SEQ_HEADER,
    STREAM_HEADER,
    UnpackedTooLarge,
    decode,
)
from gpuledger.deploy.api.access import entry_of, push_access
from gpuledger.deploy.api.limits import INGEST_BODY_BYTES
from gpuledger.deploy.api.models import BatchAnswer, MultiBatchAnswer

router = APIRouter(tags=["ingest"])
MAX_BATCH_BYTES = INGEST_BODY_BYTES  # enforced as the body arrives (deploy/api/limits.py); checked again here


@router.post(INGEST_PATH, response_model=BatchAnswer | MultiBatchAnswer)
async def ingest_batch(
    request: Request,
    authorization: str | None = Header(None),
    node: str = Header(..., alias=NODE_HEADER, min_length=1, max_length=253, pattern=r"^[A-Za-z0-9._:-]+$"),
    stream: str = Header(..., alias=STREAM_HEADER, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$"),
    seq: int = Header(..., alias=SEQ_HEADER, ge=0),
    interval_s: float = Header(..., alias=INTERVAL_HEADER, gt=0, le=86400),
    batches: int = Header(1, alias=BATCHES_HEADER, ge=1, le=10_000),
) -> JSONResponse:
    """Store agent batches (Arrow IPC stream) exactly once; resending an acknowledged batch is harmless.

    One batch per request, answered with its `status` ("stored" or "duplicate"), `rows` stored, rows
    `rejected` by reason and `nulled_values` (NaN/Inf stored as NULL). Or `X-Gpuledger-Batches: N`
    consecutive batches from `X-Gpuledger-Seq`, each row's batch in a `_seq` column (how an agent drains a
    backlog), answered with `first_seq`, `batches`, `rows` (a list, per batch), `duplicates` (seqs already
    stored), and `rejected` and `nulled_values` keyed by seq for the batches that had any. The answer is
    built by the writer and sent as is (no per-field validation on this hot path).
    """
    state = request.app.state
    request.state.audit = {"node": node, "stream": stream, "seq": seq, "batches": batches}
    caller = push_access(request, node, authorization)
    if state.ingest is None:
        raise HTTPException(status_code=503, detail="ingest is not enabled on this server")
    if request.headers.get("content-type", "").split(";")[0] != CONTENT_TYPE:
        raise HTTPException(status_code=415, detail=f"send {CONTENT_TYPE}")
    body = bytearray()  # one growing buffer, not Starlette's list of chunks joined into a second copy
    try:
        async for chunk in request.stream():
            body += chunk
    except ClientDisconnect:  # gone, or cut off at the limit (deploy/api/limits.py), which answered 413 already
        body.clear()  # freed now: the exception's frames would hold it until the cycle collector runs
        raise
    if len(body) > MAX_BATCH_BYTES:
        raise HTTPException(status_code=413, detail=f"batch over {MAX_BATCH_BYTES} bytes")
    try:
        # decode() refuses a body whose headers declare more than 16x its size unpacked before decompressing it
        # the push's entry commits with its batches in the writer's transaction (none when no audit log is kept)
        entry = entry_of(request, caller, 200) if state.ingest.audit is not None else None
        pending = state.ingest.enqueue(node, stream, seq, batches, interval_s, decode(body), audit=entry)
    except UnpackedTooLarge as exc:
        HTTP_REFUSED.labels("unpacked_too_large").inc()
        raise HTTPException(status_code=422, detail=str(exc)) from exc
    # a body that is no batch of samples (WireError, InvalidBatch: 422) and a commit that failed (StoreUnavailable:
    # 503 with Retry-After) answer through the error family's one handler (deploy/api/__init__.py)
    results = await asyncio.wrap_future(pending)  # the writer thread answers; no thread waits here
    request.state.audited = entry is not None  # committed with the batches: the middleware adds nothing
    return JSONResponse(results.answer())
