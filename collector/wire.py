"""How a batch travels from agent to server: one Arrow IPC stream, zstd-compressed.

Arrow IPC keeps the sample schema exact (types, nulls, timestamps with zone) and decodes
straight into the table DuckDB inserts, with no per-row parsing on the server; zstd makes
it about as small as gzipped JSON lines (see benchmarks/ingest.py).
"""
from __future__ import annotations

import pyarrow as pa

CONTENT_TYPE = "application/vnd.apache.arrow.stream"


class WireError(ValueError):
    pass


def encode(table: pa.Table, compression: str | None = "zstd") -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode(data: bytes) -> pa.Table:
    try:
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise WireError(f"body is not an Arrow IPC stream: {exc}") from exc
