"""How a batch travels from agent to server: one Arrow IPC stream, LZ4-compressed.

Arrow IPC keeps the sample schema exact (types, nulls, timestamps with zone) and decodes
straight into the table DuckDB inserts, with no per-row parsing on the server, which is
where ingest CPU is scarce. For one 8-GPU batch it is bigger than gzipped JSON lines (the
schema travels with it), but far cheaper to encode and decode; zstd cost ~15x more CPU
than LZ4 for no gain at this size. benchmarks/ingest.py prints the comparison.
"""
from __future__ import annotations

from typing import Iterable

import pyarrow as pa

CONTENT_TYPE = "application/vnd.apache.arrow.stream"
SEQ = "_seq"  # in a multi-batch body (an agent draining its backlog), the batch each row belongs to


class WireError(ValueError):
    pass


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
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data), options=pa.ipc.IpcReadOptions(use_threads=False))
        return reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise WireError(f"body is not an Arrow IPC stream: {exc}") from exc
