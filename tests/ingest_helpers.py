"""Shared pieces of the ingest tests: one node's batches and posting them (the `central` server is in conftest)."""
from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import requests

from gpuledger.collector.simulator import cluster_of
from gpuledger.collector.wire import INGEST_PATH, encode, request_headers, stack
from tests.procs import TOKEN

NOW = datetime.now(timezone.utc).replace(microsecond=0)


def batch(when: datetime = NOW) -> pa.Table:
    """One 8-GPU node's samples at `when`."""
    return cluster_of(1).frame([when.timestamp()], 10.0)


def backlog_body(tables: list[pa.Table], first_seq: int) -> pa.Table:
    return stack(enumerate(tables, start=first_seq))


def post(url: str, table: pa.Table | bytes, seq: int, node: str = "node-0000", stream: str = "s1",
         token: str | None = TOKEN) -> requests.Response:
    """Push one batch as an agent would, declaring the sampling interval its rows stand for (ingest refuses rows
    whose interval exceeds the declared one); a raw body declares 10 s."""
    interval = 10.0
    if isinstance(table, pa.Table) and "interval_s" in table.column_names and table.num_rows \
            and pa.types.is_floating(table.schema.field("interval_s").type):  # a misshapen batch declares 10 s
        interval = float(pc.max(table["interval_s"]).as_py() or 10.0)
    headers = request_headers(node, stream, seq, interval, token=token or None)
    body = table if isinstance(table, bytes) else encode(table)
    return requests.post(url + INGEST_PATH, data=body, headers=headers, timeout=30)
