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

Limits: before anything is decompressed, the server reads each record batch's declared unpacked size from the
message headers and refuses (422) a body that would unpack to more than 16x its size (at least 4 MiB allowed, at
most 256 MiB), or whose schema is not flat sample columns (`check_stream`).

Answer: for one batch, its `status` ("stored" or "duplicate"), `rows` stored, rows `rejected`
by reason and `nulled_values` (NaN/Inf stored as NULL); for several, lists over the batches
(`multi_batch_answer`), which `per_batch` turns back into one answer per batch.
"""
from __future__ import annotations

import json

import struct
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

from gpuledger.collector.errors import InputError
from gpuledger.collector.samples import ADDED_COLUMNS, SAMPLE_SCHEMA

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


# What a body may unpack to (checked from its headers before anything is decompressed; see `decode`)
MAX_UNPACK_RATIO = 16  # real agent bodies unpack to 2-4x; LZ4 of zeros to ~250x
MIN_UNPACK_BYTES = 4 * 1024 * 1024  # a one-batch body is mostly its schema: never refuse small ones for ratio
MAX_UNPACKED_BYTES = 256 * 1024 * 1024  # one request's table, whatever its body size
MAX_EXTRA_COLUMNS = 16  # columns a newer agent may add that this server does not know (conform() drops them)


class WireError(InputError):
    """A body that is not an Arrow IPC stream of sample columns, or that would unpack too large (422)."""


class UnpackedTooLarge(WireError):
    """A body whose batches' declared unpacked size exceeds the bound (a decompression bomb, or a damaged
    header): refused from the headers alone, before anything is decompressed."""


def encode(table: pa.Table, compression: str | None = "lz4") -> bytes:
    sink = pa.BufferOutputStream()
    # no thread pool: for a batch this size, handing buffers to threads costs more than compressing them
    options = pa.ipc.IpcWriteOptions(compression=compression, use_threads=False)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table.combine_chunks())  # one record batch: each one costs a codec call per buffer
    return sink.getvalue().to_pybytes()


def stack(batches: Iterable[tuple[int, pa.Table]]) -> pa.Table:
    """The table of a multi-batch body: each batch's rows in order, tagged with its seq in a `_seq` column. Batches
    of an older agent (a spool replayed after an upgrade) lack the columns added since: they are null there, as the
    server stores such a batch sent alone, so one body may mix both."""
    return pa.concat_tables([table.append_column(SEQ, pa.array([seq] * table.num_rows, pa.int64()))
                             for seq, table in batches], promote_options="default")


def unpacked_bound(body_bytes: int) -> int:
    """The most bytes a body of `body_bytes` may unpack to: MAX_UNPACK_RATIO times its size, at least
    MIN_UNPACK_BYTES (a one-batch body is mostly schema), never more than MAX_UNPACKED_BYTES. Real agent bodies
    unpack to about 2-4x their size; an LZ4 bomb of zeros to ~250x."""
    return min(MAX_UNPACKED_BYTES, max(MIN_UNPACK_BYTES, MAX_UNPACK_RATIO * body_bytes))


def decode(data: bytes, max_unpacked: int | None = None) -> pa.Table:
    """The table an agent sent. A damaged body can still frame as a stream, so the table is validated in full
    (offsets, UTF-8 of names and strings) before anything reads it: a 422, never a crash further on.

    Before any batch is decompressed, the stream's message headers are walked (`check_stream`): the schema
    must be flat sample columns and the buffers' declared unpacked sizes must stay within `max_unpacked`
    (default `unpacked_bound(len(data))`). pyarrow allocates whatever a compressed buffer's length prefix
    claims, so without this an 8 MiB LZ4 body of zeros took the server to 2 GiB per copy (17.6 GB RSS)."""
    check_stream(data, unpacked_bound(len(data)) if max_unpacked is None else max_unpacked)
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data), options=pa.ipc.IpcReadOptions(use_threads=False))
        table = reader.read_all()
        table.validate(full=True)
        table.column_names  # noqa: B018 - decodes every field name
        return table
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:  # ArrowMemoryError: a damaged size field
        raise WireError(f"body is not a valid Arrow IPC stream: {str(exc)[:300]}") from exc


def check_stream(data: bytes, max_unpacked: int) -> int:
    """The total unpacked size of the stream's record batches, read from their headers only (nothing is
    decompressed); WireError (422) when it exceeds `max_unpacked`, when the schema is not flat sample columns,
    or when a message is not a schema or record batch (dictionaries, tensors)."""
    total = 0
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(data))
        first = True
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                break
            if first:
                if message.type != "schema":
                    raise WireError(f"the stream must start with its schema, not a {message.type}")
                _check_schema(pa.ipc.read_schema(message))
                first = False
                continue
            if message.type != "record batch":
                raise WireError(f"a sample body holds record batches only, not a {message.type}")
            total += _batch_unpacked(message.metadata.to_pybytes(), message.body)
            if total > max_unpacked:
                raise UnpackedTooLarge(f"unpacked size {total} exceeds {max_unpacked} bytes "
                                f"(at most {MAX_UNPACK_RATIO}x the body, {MAX_UNPACKED_BYTES} in all)")
    except WireError:
        raise
    except (pa.ArrowException, OSError, UnicodeDecodeError, ValueError, struct.error) as exc:
        raise WireError(f"body is not a valid Arrow IPC stream: {str(exc)[:300]}") from exc
    if first:
        raise WireError("body is not a valid Arrow IPC stream: no schema")
    return total


def _check_schema(schema: pa.Schema) -> None:
    """Flat columns only, each name once, every sample column there (older agents may lack ADDED_COLUMNS), known
    columns of a type of the same kind as the sample schema's (conform() casts it), and few unknown ones (a newer
    agent's columns, dropped by conform()): no nested or dictionary type whose buffers this check cannot see."""
    names = schema.names
    if len(names) > len(SAMPLE_SCHEMA) + 1 + MAX_EXTRA_COLUMNS:
        raise WireError(f"{len(names)} columns: a sample body has at most {len(SAMPLE_SCHEMA) + 1 + MAX_EXTRA_COLUMNS}")
    if len(set(names)) != len(names):
        raise WireError(f"a column name appears twice: {sorted({n for n in names if names.count(n) > 1})}")
    missing = [f.name for f in SAMPLE_SCHEMA if f.name not in names and f.name not in ADDED_COLUMNS]
    if missing:
        raise WireError(f"batch is missing column(s) {missing}")
    for field in schema:
        expected = pa.int64() if field.name == SEQ else (SAMPLE_SCHEMA.field(field.name).type
                                                          if field.name in SAMPLE_SCHEMA.names else None)
        if not _flat(field.type) or (expected is not None and _kind(field.type) != _kind(expected)):
            want = f"a {_kind(expected)} column" if expected is not None else "a flat column"
            raise WireError(f"column {field.name!r} has type {field.type}: want {want}")


def _flat(kind: pa.DataType) -> bool:
    return _kind(kind) != "other"


def _kind(kind: pa.DataType) -> str:
    """The family a type belongs to for the schema check: what conform() can cast within."""
    t = pa.types
    if t.is_boolean(kind):
        return "boolean"
    if t.is_integer(kind) or t.is_floating(kind):
        return "number"
    if t.is_string(kind) or t.is_large_string(kind):
        return "string"
    if t.is_timestamp(kind):
        return "timestamp"
    return "other"


class _Flat:
    """A bounds-checked reader of the few FlatBuffers fields of an IPC Message this module needs (Message.fbs:
    Message.header, RecordBatch.buffers and .compression); every offset is checked, so a lying header is a
    WireError, never a read outside the metadata."""

    def __init__(self, buf: bytes) -> None:
        self.buf = buf

    def _read(self, fmt: str, pos: int) -> int:
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > len(self.buf):
            raise WireError("body is not a valid Arrow IPC stream: message header out of bounds")
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def root(self) -> int:
        return self._read("<I", 0)

    def field(self, table: int, index: int) -> int | None:
        """The absolute position of field `index` of the table at `table`, or None when absent."""
        vtable = table - self._read("<i", table)
        vsize = self._read("<H", vtable)
        slot = 4 + 2 * index
        if slot + 2 > vsize:
            return None
        offset = self._read("<H", vtable + slot)
        return table + offset if offset else None

    def indirect(self, pos: int) -> int:
        return pos + self._read("<I", pos)

    def i64(self, pos: int) -> int:
        return self._read("<q", pos)

    def u32(self, pos: int) -> int:
        return self._read("<I", pos)


def _batch_unpacked(metadata: bytes, body: pa.Buffer | None) -> int:
    """The bytes a record batch message's buffers take once read: each buffer's length, or for a compressed
    body the 8-byte little-endian uncompressed length each buffer starts with (-1: stored uncompressed)."""
    fb = _Flat(metadata)
    message = fb.root()
    header = fb.field(message, 2)  # Message.header: the RecordBatch table
    if header is None:
        raise WireError("body is not a valid Arrow IPC stream: a record batch without a header")
    batch = fb.indirect(header)
    buffers_at = fb.field(batch, 2)  # RecordBatch.buffers: [Buffer { offset: long, length: long }]
    compressed = fb.field(batch, 3) is not None  # RecordBatch.compression: set when every buffer is compressed
    if buffers_at is None:
        return 0
    vector = fb.indirect(buffers_at)
    count = fb.u32(vector)
    body_size = body.size if body is not None else 0
    total = 0
    for i in range(count):
        offset, length = fb.i64(vector + 4 + 16 * i), fb.i64(vector + 12 + 16 * i)
        if offset < 0 or length < 0 or offset + length > body_size:
            raise WireError("body is not a valid Arrow IPC stream: a buffer outside its message body")
        if not compressed or length == 0:
            total += length
            continue
        if length < 8:
            raise WireError("body is not a valid Arrow IPC stream: a compressed buffer without its length")
        declared = struct.unpack("<q", body.slice(offset, 8).to_pybytes())[0]
        if declared < -1:
            raise WireError("body is not a valid Arrow IPC stream: a negative unpacked length")
        total += length - 8 if declared == -1 else declared
    return total


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


def read_answer(body: bytes, first_seq: int, batches: int) -> list[dict[str, Any]] | None:
    """The server's answer to a request of `batches` batches from `first_seq`, one answer per batch; None when the
    body is not such an answer (a login proxy's page, a truncated body, another server): the agent must then keep
    the batches and send them again, never count them as delivered."""
    try:
        answer = json.loads(body)
        if batches == 1 and isinstance(answer, dict) and answer.get("status") in (STORED, DUPLICATE):
            return [dict(answer, seq=first_seq)]
        if isinstance(answer, dict) and answer.get("first_seq") == first_seq and len(answer.get("rows", ())) == batches:
            return per_batch(answer)
    except (ValueError, TypeError, KeyError, AttributeError):
        pass
    return None
