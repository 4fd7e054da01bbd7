"""Builders for small, hand-checkable sample sets and a real HTTP page server on 127.0.0.1."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pyarrow as pa

from gpuledger.collector.samples import rows_to_table

T0 = datetime(2026, 11, 2, 0, 0, tzinfo=timezone.utc)  # a Monday


def gpu_rows(node: str, gpu: int, model: str, minutes: int, step_s: float = 60.0, start: datetime = T0,
             util: float | list[float] = 0.0, job: str | None = None, team: str | None = None,
             mem_used: float = 1000.0, mem_total: float = 81559.0, **extra: Any) -> list[dict[str, Any]]:
    """`minutes` worth of samples for one GPU; util may be a per-sample list."""
    n = int(minutes * 60 / step_s)
    utils = util if isinstance(util, list) else [util] * n
    return [{
        "ts": start + timedelta(seconds=i * step_s), "interval_s": step_s, "node": node, "gpu_index": gpu,
        "gpu_uuid": f"GPU-{node}-{gpu}", "gpu_model": model, "model_name": model, "gpu_fraction": 1.0,
        "allocated": job is not None, "util_pct": utils[i], "mem_used_mib": mem_used,
        "mem_total_mib": mem_total, "mem_free_mib": mem_total - mem_used, "job_id": job, "team": team,
        "namespace": team, "source": "test", **extra,
    } for i in range(n)]


def table(*row_lists: list[dict[str, Any]]) -> pa.Table:
    return rows_to_table([row for rows in row_lists for row in rows])


def serve_pages(answer: Callable[[str], tuple[int, str]]) -> tuple[ThreadingHTTPServer, str]:
    """A real HTTP server on 127.0.0.1 (a free port, its own thread) answering each GET with `answer(path)`:
    (status, text page). Returns the server (shut it down) and its "127.0.0.1:port", as a scrape target names it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            status, body = answer(self.path)
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"


class PageServer:
    """Serves whatever body/status the test sets, like a dcgm-exporter /metrics endpoint."""

    def __init__(self) -> None:
        self.body = ""
        self.status = 200
        self.hits = 0
        self.server, address = serve_pages(self._answer)
        self.url = f"http://{address}/metrics"

    def _answer(self, path: str) -> tuple[int, str]:
        self.hits += 1
        return self.status, self.body

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def api_client(store: Any, config: Any, **kwargs: Any) -> Iterator[Any]:
    """FastAPI's TestClient over `create_app(store, config, **kwargs)`, whose audit log is closed afterwards: its
    flush thread otherwise outlives the test's store and logs a failed write every second until the run ends."""
    from fastapi.testclient import TestClient

    from gpuledger.deploy.api import create_app
    app = create_app(store, config, **kwargs)
    try:
        yield TestClient(app)
    finally:
        if app.state.audit is not None:
            app.state.audit.close()


# `sacct -aP` output of two GPU jobs (one completed, one failed) and a step, with sacct's header line
SACCT_SAMPLE = """JobID|State|Submit|Eligible|Start|End|Account|User|Partition|QOS|NodeList|AllocTRES|ReqTRES|Reason|ExitCode|JobName
101|COMPLETED|2026-12-01T10:00:00|2026-12-01T10:00:00|2026-12-01T10:05:00|2026-12-01T11:00:00|nlp|alice|gpu|normal|n1|billing=2,cpu=2,gres/gpu:h100=2,gres/gpu=2|cpu=2,gres/gpu:h100=2|None|0:0|train
101.batch|COMPLETED|2026-12-01T10:05:00|2026-12-01T10:05:00|2026-12-01T10:05:00|2026-12-01T11:00:00|nlp||||n1|cpu=2,gres/gpu:h100=2,gres/gpu=2||None|0:0|batch
102|FAILED|2026-12-01T10:30:00|2026-12-01T10:30:00|2026-12-01T11:00:00|2026-12-01T11:20:00|vision|bob|gpu|normal|n2|billing=1,cpu=1,gres/gpu:h100=1,gres/gpu=1|cpu=1,gres/gpu:h100=1|None|1:0|eval
"""
