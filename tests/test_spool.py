"""The agent's durable spool: batches survive a restart, sequences are never reused."""
from __future__ import annotations

from gpuledger.collector.agent.spool import Spool


def test_spool_survives_reopen_and_never_reuses_a_sequence(tmp_path):
    spool = Spool(tmp_path / "s", max_bytes=25)
    first = spool.put(b"a" * 10, 1)
    spool.put(b"b" * 10, 1)
    assert spool.size() == 20
    spool.put(b"c" * 10, 1)  # over 25 bytes: the oldest goes
    assert spool.size() == 20 and [b.seq for b in spool.pending()] == [1, 2]
    for batch in spool.pending():
        spool.acknowledge(batch)
    assert spool.size() == 0
    first = spool.next_seq - 1
    (tmp_path / "s" / "0000000000000099-1.arrow.tmp").write_bytes(b"half")  # crash mid-write
    again = Spool(tmp_path / "s")
    assert again.stream_id == spool.stream_id and again.next_seq == first + 1
    assert not list((tmp_path / "s").glob("*.tmp"))
    lost = Spool(tmp_path / "fresh")
    assert lost.stream_id != spool.stream_id  # a wiped spool starts a new stream, not old sequence numbers
