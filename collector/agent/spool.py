"""The agent's durable spool: a batch is on disk before it is sent and leaves only once acknowledged.

Files are named by sequence number and row count (`0000000000000042-8.arrow`) and written
atomically (temp file, fsync, rename), so a crash leaves either a whole batch or nothing.
`state.json` holds this spool's stream id and the next sequence number: the server
deduplicates on (node, stream, seq), and a new stream id after a lost spool directory keeps
a restarted sequence from colliding with batches the server already holds. The spool is
bounded: past `max_bytes` the oldest batches are dropped, counted and logged.

On a full disk a batch is held in memory instead (within the same bound) and sent from there: it is not durable
until acknowledged, and the log says so. `state.json` is padded to a fixed size, so when a new copy cannot be
written it is overwritten in place, in blocks it already owns: the sequence never goes back, even on a full disk.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from gpuledger.collector.agent.metrics import AGENT_DROPPED, AGENT_HELD_IN_MEMORY, AGENT_SPOOL_BYTES

log = logging.getLogger(__name__)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
STATE_BYTES = 256  # state.json's fixed size, spaces after the JSON


@dataclass
class Sending:
    """Batches read for one request: `delivered` once the server's answer is taken (Spool.sending)."""
    batches: list["SpooledBatch"]
    delivered: bool = False


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
    """`data` as `path`, whole or not at all: a failed write (a full disk) leaves no temp file behind."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class Spool:
    def __init__(self, directory: str | Path, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "rejected").mkdir(exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._held: dict[int, tuple[SpooledBatch, bytes]] = {}  # written on a full disk: in memory until sent
        # batches the sender has read for a request under way, and those of them removed meanwhile for space: a
        # batch removed while in flight is lost only if that request fails (the sender holds its bytes)
        self._in_flight: set[int] = set()
        self._removed_in_flight: set[int] = set()
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
        text = json.dumps({"stream_id": self.stream_id, "next_seq": self.next_seq}).ljust(STATE_BYTES).encode()
        path = self.dir / "state.json"
        try:
            _atomic_write(path, text)
        except OSError as exc:
            if exc.errno not in DISK_FULL or not path.exists():
                raise
            with open(path, "r+b") as handle:  # the same size in place: no new blocks needed
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())

    def put(self, data: bytes, rows: int) -> int:
        """Store the next batch durably; returns its sequence number."""
        with self._lock:
            seq = self.next_seq
            path = self.dir / f"{seq:016d}-{rows}.arrow"
            try:
                _atomic_write(path, data)
            except OSError as exc:
                if exc.errno not in DISK_FULL:
                    raise
                self._held[seq] = (SpooledBatch(seq, rows, path), data)
                AGENT_HELD_IN_MEMORY.inc()
                log.warning("spool %s: disk full; batch seq %d held in memory until the server has it (%d held, "
                            "not durable: lost if the agent stops first)", self.dir, seq, len(self._held))
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
            if oldest.seq in self._in_flight:  # its request may still deliver it: counted when it does not
                self._removed_in_flight.add(oldest.seq)
                continue
            AGENT_DROPPED.inc()
            log.warning(
                "spool full (%d > %d bytes): dropped batch seq %d with %d rows", self._bytes + size,
                self.max_bytes, oldest.seq, oldest.rows)

    @contextmanager
    def sending(self, batches: list[SpooledBatch]) -> Iterator[Sending]:
        """Mark `batches` as in a request while it lasts; a batch removed for space meanwhile is counted as
        dropped only if the request did not deliver it (set `delivered` on what this yields)."""
        sent = Sending(batches)
        with self._lock:
            self._in_flight.update(b.seq for b in batches)
        try:
            yield sent
        finally:
            with self._lock:
                for batch in batches:
                    self._in_flight.discard(batch.seq)
                    if batch.seq in self._removed_in_flight:
                        self._removed_in_flight.discard(batch.seq)
                        if not sent.delivered:
                            AGENT_DROPPED.inc()
                            log.warning("spool full: batch seq %d with %d rows was dropped while being sent, "
                                        "and the server did not take it", batch.seq, batch.rows)

    def _remove(self, path: Path, to: Path | None = None) -> int:
        """Unlink (or move aside) one spooled file, or forget a batch held in memory, and take its size off the
        running total."""
        seq = int(path.name.partition("-")[0])
        if seq in self._held:
            size = len(self._held.pop(seq)[1])
            self._bytes -= size
            return size
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
        out += [batch for batch, _ in self._held.copy().values()]  # copy(): atomic while the sampler adds
        return sorted(out, key=lambda b: b.seq)

    def read(self, batch: SpooledBatch) -> bytes | None:
        held = self._held.get(batch.seq)
        if held is not None:
            return held[1]
        try:
            return batch.path.read_bytes()
        except FileNotFoundError:  # dropped for space while we were about to send it
            return None

    def acknowledge(self, batch: SpooledBatch) -> None:
        with self._lock:
            self._remove(batch.path)
            AGENT_SPOOL_BYTES.set(self._bytes)

    def reject(self, batch: SpooledBatch, reason: str) -> None:
        """The server refused this batch as invalid: keep it aside for inspection, never resend, never lose it.

        The reason and a batch held in memory are written first: on a full disk that fails (OSError), and the batch
        stays in the spool to be sent again, rather than being dropped before it was kept anywhere."""
        aside = self.dir / "rejected" / batch.path.name
        with self._lock:
            held = self._held.get(batch.seq)
            try:
                (self.dir / "rejected" / f"{batch.path.name}.reason").write_text(reason)
                if held is not None:
                    _atomic_write(aside, held[1])
            except OSError:
                (self.dir / "rejected" / f"{batch.path.name}.reason").unlink(missing_ok=True)
                raise
            if held is not None:
                self._remove(batch.path)
            else:
                self._remove(batch.path, to=aside)  # a rename: needs no new blocks
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

