"""Which agent batches the store already holds, kept in memory as runs of consecutive ids.

An agent numbers its batches 0, 1, 2, ... per stream and sends them in order, so the ids
stored for one stream are almost always a single run. Keeping runs rather than ids makes
the exactly-once check a bisect per request instead of a join against the durable record,
`ingest_runs`, a table that grows for as long as the cluster runs. The writer commits each
run to that table with its samples, and the runs are rebuilt from it when the server starts.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Iterable

import duckdb

StreamKey = tuple[str, str]  # (node, stream)


def runs_of(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """[3, 4, 5, 9, 10] -> [(3, 5), (9, 10)]"""
    runs: list[tuple[int, int]] = []
    for seq in sorted(seqs):
        if runs and seq == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], seq)
        else:
            runs.append((seq, seq))
    return runs


class BatchRuns:
    def __init__(self) -> None:
        self._runs: dict[StreamKey, tuple[list[int], list[int]]] = {}  # sorted run starts, their ends

    @classmethod
    def load(cls, con: duckdb.DuckDBPyConnection) -> "BatchRuns":
        runs = cls()
        rows = con.execute("SELECT node, stream, first_seq, last_seq FROM ingest_runs "
                           "ORDER BY node, stream, first_seq").fetchall()
        for node, stream, lo, hi in rows:
            runs.add((node, stream), lo, hi)
        return runs

    def __len__(self) -> int:
        return sum(len(starts) for starts, _ in self._runs.values())

    def contains(self, key: StreamKey, seq: int) -> bool:
        found = self._runs.get(key)
        if found is None:
            return False
        starts, ends = found
        i = bisect_right(starts, seq) - 1
        return i >= 0 and ends[i] >= seq

    def known(self, key: StreamKey, first: int, last: int) -> list[int]:
        """The ids in first..last already held; the usual answer (all new) costs one comparison."""
        found = self._runs.get(key)
        if found is None or first > found[1][-1] or last < found[0][0]:
            return []
        return [seq for seq in range(first, last + 1) if self.contains(key, seq)]

    def add(self, key: StreamKey, lo: int, hi: int) -> None:
        """Record lo..hi, merging with the runs it touches or overlaps."""
        starts, ends = self._runs.setdefault(key, ([], []))
        i = bisect_right(starts, lo) - 1
        if i >= 0 and ends[i] >= lo - 1:  # extends the run before it
            lo = starts[i]
            hi = max(hi, ends[i])
        else:
            i += 1
        j = i
        while j < len(starts) and starts[j] <= hi + 1:  # swallows the runs it reaches
            hi = max(hi, ends[j])
            j += 1
        starts[i:j] = [lo]
        ends[i:j] = [hi]

    def add_ids(self, key: StreamKey, seqs: Iterable[int]) -> None:
        """Record ids that may have holes (some of a request were duplicates), one run at a time."""
        for lo, hi in runs_of(seqs):
            self.add(key, lo, hi)

    def merge(self, other: "BatchRuns") -> None:
        for key, (starts, ends) in other._runs.items():
            for lo, hi in zip(starts, ends):
                self.add(key, lo, hi)
