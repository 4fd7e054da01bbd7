"""The agent's durable spool: a batch is on disk before it is sent and leaves only once acknowledged.

Files are named by sequence number and row count (`0000000000000042-8.arrow`) and written
atomically (temp file, fsync, rename), so a crash leaves either a whole batch or nothing.
`state.json` holds this spool's stream id and the next sequence number: the server
deduplicates on (node, stream, seq), and a new stream id after a lost spool directory keeps
a restarted sequence from colliding with batches the server already holds. The spool is
bounded: past `max_bytes` the oldest batches are dropped, counted and logged.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpuledger.collector.agent.metrics import AGENT_DROPPED, AGENT_SPOOL_BYTES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpooledBatch:
    seq: int
    rows: int
    path: Path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class Spool:
    def __init__(self, directory: str | Path, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "rejected").mkdir(exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        for stale in self.dir.glob("*.tmp"):  # a write interrupted by a crash: never acknowledged, never sent
            stale.unlink()
        state = self._load_state()
        self.stream_id: str = state.get("stream_id") or uuid.uuid4().hex
        batches = self.pending()
        self.next_seq: int = max(int(state.get("next_seq", 0)), (batches[-1].seq + 1) if batches else 0)
        self._save_state()
        self._bytes = self._scan_size()  # kept up to date from here on: a backlog can hold many thousand files
        AGENT_SPOOL_BYTES.set(self._bytes)
        if batches:
            log.info("spool %s: replaying %d unacknowledged batch(es) from seq %d", self.dir, len(batches),
                     batches[0].seq)

    def _load_state(self) -> dict:
        try:
            return json.loads((self.dir / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def _save_state(self) -> None:
        _atomic_write(self.dir / "state.json",
                      json.dumps({"stream_id": self.stream_id, "next_seq": self.next_seq}).encode())

    def put(self, data: bytes, rows: int) -> int:
        """Store the next batch durably; returns its sequence number."""
        with self._lock:
            seq = self.next_seq
            _atomic_write(self.dir / f"{seq:016d}-{rows}.arrow", data)
            self._bytes += len(data)
            self.next_seq = seq + 1
            self._save_state()
            if self._bytes > self.max_bytes:
                self._enforce_bound()
            AGENT_SPOOL_BYTES.set(self._bytes)
            return seq

    def _enforce_bound(self) -> None:
        batches = self.pending()
        while self._bytes > self.max_bytes and len(batches) > 1:
            oldest = batches.pop(0)
            size = self._remove(oldest.path)
            AGENT_DROPPED.inc()
            log.warning(
                "spool full (%d > %d bytes): dropped batch seq %d with %d rows", self._bytes + size,
                self.max_bytes, oldest.seq, oldest.rows)

    def _remove(self, path: Path, to: Path | None = None) -> int:
        """Unlink (or move aside) one spooled file and take its size off the running total."""
        try:
            size = path.stat().st_size
            path.rename(to) if to else path.unlink()
        except FileNotFoundError:
            return 0
        self._bytes -= size
        return size

    def pending(self) -> list[SpooledBatch]:
        out = []
        for path in self.dir.glob("*.arrow"):
            seq, _, rows = path.stem.partition("-")
            if seq.isdigit() and rows.isdigit():
                out.append(SpooledBatch(int(seq), int(rows), path))
        return sorted(out, key=lambda b: b.seq)

    def read(self, batch: SpooledBatch) -> bytes | None:
        try:
            return batch.path.read_bytes()
        except FileNotFoundError:  # dropped for space while we were about to send it
            return None

    def acknowledge(self, batch: SpooledBatch) -> None:
        with self._lock:
            self._remove(batch.path)
            AGENT_SPOOL_BYTES.set(self._bytes)

    def reject(self, batch: SpooledBatch, reason: str) -> None:
        """The server refused this batch as invalid: keep it aside for inspection, never resend, never lose it."""
        with self._lock:
            self._remove(batch.path, to=self.dir / "rejected" / batch.path.name)
            (self.dir / "rejected" / f"{batch.path.name}.reason").write_text(reason)
            AGENT_SPOOL_BYTES.set(self._bytes)

    def size(self) -> int:
        return self._bytes

    def _scan_size(self) -> int:
        total = 0
        for batch in self.pending():
            try:
                total += batch.path.stat().st_size
            except FileNotFoundError:
                pass
        return total

