"""The agent-to-server contract for `POST /v1/ingest`: the body, the headers, and the answer.

Both sides import this module, so the format is written down once.

Body: one Arrow IPC stream, LZ4-compressed, in the sample schema. Arrow IPC keeps the schema
exact (types, nulls, timestamps with zone) and decodes straight into the table DuckDB
inserts, with no per-row parsing on the server, which is where ingest CPU is scarce. For one
8-GPU batch it is bigger than gzipped JSON lines (the schema travels with it), but far
cheaper to encode and decode; zstd cost ~15x more CPU than LZ4 for no gain at this size.
benchmarks/ingest.py prints the comparison. A multi-batch body (an agent draining its
backlog) adds a `_seq` column: the batch each row belongs to.

Headers: the node, the agent's stream id, the first batch's sequence number, how many
consecutive batches the body holds, and the sampling interval (see `request_headers`).

Answer: for one batch, its `status` ("stored" or "duplicate"), `rows` stored, rows `rejected`
by reason and `nulled_values` (NaN/Inf stored as NULL); for several, lists over the batches
(`multi_batch_answer`), which `per_batch` turns back into one answer per batch.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

from gpuledger.collector.errors import GpuledgerError

CONTENT_TYPE = "application/vnd.apache.arrow.stream"
SEQ = "_seq"  # in a multi-batch body (an agent draining its backlog), the batch each row belongs to
INGEST_PATH = "/v1/ingest"

NODE_HEADER = "X-Gpuledger-Node"
STREAM_HEADER = "X-Gpuledger-Stream"
SEQ_HEADER = "X-Gpuledger-Seq"
BATCHES_HEADER = "X-Gpuledger-Batches"
INTERVAL_HEADER = "X-Gpuledger-Interval"

STORED = "stored"
DUPLICATE = "duplicate"


class WireError(GpuledgerError, ValueError):
    """A body that is not an Arrow IPC stream."""


def encode(table: pa.Table, compression: str | None = "lz4") -> bytes:
    sink = pa.BufferOutputStream()
    # no thread pool: for a batch this size, handing buffers to threads costs more than compressing them
    options = pa.ipc.IpcWriteOptions(compression=compression, use_threads=False)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table.combine_chunks())  # one record batch: each one costs a codec call per buffer
    return sink.getvalue().to_pybytes()


def stack(batches: Iterable[tuple[int, pa.Table]]) -> pa.Table:
    """The table of a multi-batch body: each batch's rows in order, tagged with its seq in a `_seq` column."""
    return pa.concat_tables([table.append_column(SEQ, pa.array([seq] * table.num_rows, pa.int64()))
                             for seq, table in batches])


def decode(data: bytes) -> pa.Table:
    """The table an agent sent. A damaged body can still frame as a stream, so the table is validated in full
    (offsets, UTF-8 of names and strings) before anything reads it: a 422, never a crash further on."""
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data), options=pa.ipc.IpcReadOptions(use_threads=False))
        table = reader.read_all()
        table.validate(full=True)
        table.column_names  # noqa: B018 - decodes every field name
        return table
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:  # ArrowMemoryError: a damaged size field
        raise WireError(f"body is not a valid Arrow IPC stream: {str(exc)[:300]}") from exc


def request_headers(node: str, stream: str, first_seq: int, interval_s: float, batches: int = 1,
                    token: str | None = None) -> dict[str, str]:
    """The headers of one ingest request (with the bearer token when given)."""
    headers = {"Content-Type": CONTENT_TYPE, NODE_HEADER: node, STREAM_HEADER: stream,
               SEQ_HEADER: str(first_seq), BATCHES_HEADER: str(batches), INTERVAL_HEADER: str(interval_s)}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def batch_answer(stored: bool, rows: int = 0, rejected: Mapping[str, int] | None = None,
                 nulled_values: int = 0) -> dict[str, Any]:
    """The answer to a one-batch request."""
    return {"status": STORED if stored else DUPLICATE, "rows": rows, "rejected": dict(rejected or {}),
            "nulled_values": nulled_values}


def multi_batch_answer(first_seq: int, fresh: Sequence[bool], rows: Sequence[int],
                       rejected: Mapping[int, Mapping[str, int]], nulled: Sequence[int]) -> dict[str, Any]:
    """The answer to a multi-batch request, as lists over the batches in seq order.

    Not an object per batch: for a 360-batch backlog request those cost the server's HTTP thread
    ~1.5 ms of Python, which took ~0.3 s of a 2-core machine's drain of 368k rows from the writer.
    `rejected` is keyed by the batch's position in the request.
    """
    return {"first_seq": first_seq, "batches": len(fresh), "rows": list(rows),
            "duplicates": [first_seq + i for i, new in enumerate(fresh) if not new],
            "rejected": {str(first_seq + i): dict(reasons) for i, reasons in rejected.items()},
            "nulled_values": {str(first_seq + i): n for i, n in enumerate(nulled) if n}}


def per_batch(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A multi-batch answer as one answer per batch (with its `seq`), like a single batch gets."""
    duplicates, first = set(answer["duplicates"]), answer["first_seq"]
    return [dict(batch_answer(first + i not in duplicates, rows, answer["rejected"].get(str(first + i), {}),
                              answer["nulled_values"].get(str(first + i), 0)), seq=first + i)
            for i, rows in enumerate(answer["rows"])]
