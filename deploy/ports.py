"""Ports checked before any long work: a demo's backfill takes a minute, and a port found busy only after it is a
minute lost and a message that named no flag (issue 45 item 6)."""
from __future__ import annotations

import socket

from gpuledger.collector.errors import InputError


def require_free(host: str, port: int, flag: str, any_port: bool = True) -> None:
    """Refuse (InputError, naming `flag`) a `port` on `host` that something already listens on. 0 (any free port)
    is always free; `any_port`: whether `flag` takes 0, and so whether to suggest it."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
        except OSError as exc:
            hint = f", or {flag} 0 for any free port" if any_port else ""
            raise InputError(f"port {port} on {host} is not free ({exc.strerror or exc}): stop what listens there, "
                             f"or choose another with {flag} N{hint}") from exc
