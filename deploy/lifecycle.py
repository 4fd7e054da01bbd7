"""Process lifetime for the long-running commands (demo, serve, agent)."""
from __future__ import annotations

import signal
import threading


def wait_for_stop(duration_s: float | None = None) -> None:
    """Block until SIGINT/SIGTERM, or for `duration_s` seconds when given; then the caller shuts down cleanly."""
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait(duration_s)
