"""The ingest writer: exactly-once against the store, group commits sized to DuckDB row groups, idle checkpoints,
and a failed commit that stores nothing."""
from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.collector.simulator import cluster_of
from gpuledger.deploy.server import ApiServer
from tests.ingest_helpers import NOW, backlog_body, post
from tests.procs import TOKEN, wait_until


def test_samples_stored_by_another_path_or_before_a_restart_are_still_refused(tmp_path):
    """The duplicate check only searches rows no newer than a node's newest stored sample; that mark
    must cover samples the local collector stored and samples stored before the server restarted."""
    sim = cluster_of(1)
    old, new = (sim.frame([NOW.timestamp() - 60 + 10 * k], 10.0) for k in range(2))
    with Store(tmp_path / "c.duckdb") as store:
        store.append_samples(old)  # e.g. `gpuledger serve --source nvml` on the same node
        server = ApiServer(store, Config(), port=0, token=TOKEN, open_reads=True)
        url = server.start()
        try:
            assert post(url, old, seq=0).json()["rejected"] == {"duplicate_sample": 8}
            assert post(url, new, seq=1).json()["rows"] == 8
        finally:
            server.stop()
    with Store(tmp_path / "c.duckdb") as store:  # restarted: marks and batch ids come back from the file
        server = ApiServer(store, Config(), port=0, token=TOKEN, open_reads=True)
        url = server.start()
        try:
            assert post(url, new, seq=1).json()["status"] == "duplicate"
            both = post(url, pa.concat_tables([old, new, sim.frame([NOW.timestamp() - 40], 10.0)]), seq=2).json()
            assert both["rows"] == 8 and both["rejected"] == {"duplicate_sample": 16}
            assert store.sample_count() == 24
        finally:
            server.stop()


def test_the_wal_is_folded_into_the_file_once_ingest_goes_quiet(tmp_path):
    """No checkpoint inside the commit that crosses DuckDB's 16 MB default; one after a quiet moment."""
    from gpuledger.analytics.store.ingest_writer import IngestWriter
    sim = cluster_of(64)
    frames = [sim.frame([NOW.timestamp() - 3000 + 10 * k], 10.0) for k in range(120)]
    body = backlog_body(frames, 0)
    with Store(tmp_path / "c.duckdb") as store:
        writer = IngestWriter(store, idle_checkpoint_s=2.0, max_gpus_per_node=512)  # 64 nodes' GPUs as one
        try:
            results = writer.submit("big", "s1", 0, 120, 10.0, body)
            assert sum(r.rows for r in results) == body.num_rows == 61_440
            assert store.wal_bytes() > 16 * 1024 * 1024
            wait_until(lambda: store.wal_bytes() == 0, 30, "the idle checkpoint")
        finally:
            writer.stop()
        assert store.sample_count() == 61_440


def test_two_requests_of_one_node_in_a_group_keep_the_earlier_copy_of_a_sample():
    from gpuledger.analytics.store.ingest_screen import IngestRequest, prepare, screen_group
    sim = cluster_of(1)
    tables = [sim.frame([NOW.timestamp() - 3000 + 10 * k], 10.0) for k in range(40)]
    first = prepare(backlog_body(tables[:35], 0), "node-0000", 0, 35)
    again = prepare(backlog_body(tables[30:], 0), "node-0000", 0, 10)  # its batches 0..4 repeat 30..34
    other = prepare(tables[0], "node-0001", 0, 1)
    requests_ = [IngestRequest(node, "s", 0, count, 10.0, table) for node, table, count in (
        ("node-0000", first, 35), ("node-0000", again, 10), ("node-0001", other, 1))]
    group = screen_group(requests_, NOW, timedelta(minutes=5), timedelta(days=30))
    assert group.count == 46 and group.base == [0, 35, 45]
    kept = {v["values"]: v["counts"] for v in pa.compute.value_counts(group.rows["_batch"]).to_pylist()}
    assert all(kept[b] == 8 for b in range(35)) and all(b not in kept for b in range(35, 40))
    assert all(kept[b] == 8 for b in range(40, 46))
    assert group.received.tolist() == [8] * 46


def test_a_burst_is_gathered_into_row_groups_that_skip_the_wal(tmp_path):
    """Two 70k-row backlog bodies arriving together are committed as one group of over a row group,
    which DuckDB writes straight to the file: the WAL stays small, so there is no checkpoint to pay later."""
    from gpuledger.analytics.store.ingest_writer import IngestWriter
    sim = cluster_of(64)
    frames = [sim.frame([NOW.timestamp() - 5000 + 10 * k], 10.0) for k in range(280)]
    bodies = [backlog_body(frames[:140], 0), backlog_body(frames[140:], 140)]
    with Store(tmp_path / "c.duckdb") as store:
        writer = IngestWriter(store, idle_checkpoint_s=600, max_gpus_per_node=512)  # 64 nodes' GPUs as one
        try:
            pending = [writer.enqueue("big", "s1", 140 * k, 140, 10.0, body) for k, body in enumerate(bodies)]
            stored = sum(r.rows for future in pending for r in future.result(timeout=120))
        finally:
            writer.stop()
        assert stored == 2 * 71_680 == store.sample_count()
        assert store.wal_bytes() < 16 * 1024 * 1024


def test_single_batches_that_queue_while_the_writer_commits_are_committed_together(tmp_path):
    """Steady state: the screener must not split what queues during a commit into a trickle of tiny groups."""
    from gpuledger.analytics.store.ingest_writer import IngestWriter
    sim = cluster_of(21)
    frame = sim.frame([NOW.timestamp() - 60], 10.0)
    with Store(tmp_path / "c.duckdb") as store:
        writer = IngestWriter(store, idle_checkpoint_s=600)
        try:
            with store.transaction():  # the writer is busy: it cannot commit the first request yet
                pending = [writer.enqueue("node-0000", "s1", 0, 1, 10.0, frame.slice(0, 8))]
                wait_until(lambda: writer._queue.empty(), 10, "the first request to be taken")
                pending += [writer.enqueue(f"node-{i:04d}", "s1", 0, 1, 10.0, frame.slice(8 * i, 8))
                            for i in range(1, 21)]
                wait_until(lambda: writer._queue.qsize() >= 19, 10, "the rest to queue")
            stored = sum(r.rows for future in pending for r in future.result(timeout=60))
        finally:
            writer.stop()
        assert stored == 168 == store.sample_count()
        assert store.scalar("SELECT count(DISTINCT received_ts) FROM ingest_runs") == 2  # two commits in all


def test_a_failed_commit_stores_nothing_and_the_agents_retry_is_stored_once(tmp_path, monkeypatch):
    """A DuckDB error mid-transaction (here: injected after the samples are inserted) rolls the whole group
    back, and the batch id is not remembered, so the retry is stored, once; the threads keep serving."""
    import duckdb

    from gpuledger.analytics.store import ingest_writer as ingest
    frame = cluster_of(1).frame([NOW.timestamp() - 60], 10.0)
    record, screen, failures = ingest.IngestWriter._record_batches, ingest.screen_group, []

    def record_fails_once(*args):
        if len(failures) == 0:
            failures.append("commit")
            raise duckdb.IOException("No space left on device (injected)")
        return record(*args)

    def screen_fails_once(*args):
        if len(failures) == 1:
            failures.append("screen")
            raise MemoryError("injected")
        return screen(*args)

    monkeypatch.setattr(ingest.IngestWriter, "_record_batches", staticmethod(record_fails_once))
    monkeypatch.setattr(ingest, "screen_group", screen_fails_once)
    with Store(tmp_path / "c.duckdb") as store:
        writer = ingest.IngestWriter(store, idle_checkpoint_s=600)
        try:
            with pytest.raises(ingest.StoreUnavailable, match="No space left"):  # the API answers 503
                writer.submit("n1", "s1", 0, 1, 10.0, frame)
            assert store.sample_count() == 0 and store.scalar("SELECT count(*) FROM ingest_runs") == 0
            with pytest.raises(ingest.StoreUnavailable, match="injected"):
                writer.submit("n1", "s1", 0, 1, 10.0, frame)
            assert [r.status for r in writer.submit("n1", "s1", 0, 1, 10.0, frame)] == ["stored"]
            assert [r.status for r in writer.submit("n1", "s1", 0, 1, 10.0, frame)] == ["duplicate"]
        finally:
            writer.stop()
        assert failures == ["commit", "screen"] and store.sample_count() == 8
