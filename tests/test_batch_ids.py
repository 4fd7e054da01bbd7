"""Stored batch ids kept as runs: what exactly-once depends on, so the edges are tested directly."""
from __future__ import annotations

import random

from gpuledger.analytics.store import Store
from gpuledger.analytics.store.batch_ids import BatchRuns


def test_runs_merge_and_answer_like_a_set_of_ids():
    rng = random.Random(7)
    runs, truth = BatchRuns(), set()
    key = ("node-a", "stream-1")
    for _ in range(400):
        lo = rng.randrange(0, 300)
        hi = lo + rng.randrange(0, 6)
        if rng.random() < 0.5:
            runs.add(key, lo, hi)
            truth.update(range(lo, hi + 1))
        else:
            ids = rng.sample(range(lo, lo + 20), rng.randrange(0, 8))
            runs.add_ids(key, ids)
            truth.update(ids)
        assert runs.known(key, 0, 330) == sorted(truth)
    starts, ends = runs._runs[key]
    assert all(ends[i] + 1 < starts[i + 1] for i in range(len(starts) - 1))  # merged: no touching runs
    assert runs.known(("node-a", "other"), 0, 10) == [] and not runs.contains(("x", "y"), 0)


def test_runs_are_rebuilt_from_the_store(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        with store.transaction() as cur:
            cur.execute("INSERT INTO ingest_runs VALUES ('n1', 's', 0, 5, 48, 0, now()), ('n1', 's', 6, 9, 32, 0, now()),"
                        " ('n1', 's', 12, 29, 144, 0, now()), ('n1', 's', 31, 49, 152, 0, now()),"
                        " ('n2', 's', 7, 7, 8, 0, now())")
            runs = BatchRuns.load(cur)
    assert len(runs) == 4  # 0..5 and 6..9 are one run
    assert runs.known(("n1", "s"), 8, 32) == [8, 9] + list(range(12, 30)) + [31, 32]
    assert runs.known(("n2", "s"), 0, 100) == [7]


def test_a_schema_2_store_keeps_its_batch_ids_when_opened(tmp_path):
    """Stores written before ingest_runs kept one indexed row per batch; opening one converts them to runs."""
    import duckdb
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("""CREATE TABLE ingest_batches (node VARCHAR NOT NULL, stream VARCHAR NOT NULL, seq BIGINT NOT NULL,
                       rows INTEGER NOT NULL, rejected INTEGER NOT NULL, received_ts TIMESTAMPTZ NOT NULL,
                       PRIMARY KEY (node, stream, seq))""")
        con.execute("INSERT INTO ingest_batches SELECT 'n1', 's', seq, 8, 1, now() FROM range(0, 20) t(seq) "
                    "WHERE seq <> 10")
    with Store(path) as store:
        runs = store.query("SELECT first_seq, last_seq, rows, rejected FROM ingest_runs ORDER BY 1")
        assert runs.values.tolist() == [[0, 9, 80, 10], [11, 19, 72, 9]]
        assert store.scalar("SELECT count(*) FROM information_schema.tables WHERE table_name = 'ingest_batches'") == 0
        with store.transaction() as cur:
            assert BatchRuns.load(cur).known(("n1", "s"), 8, 12) == [8, 9, 11, 12]
