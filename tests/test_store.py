"""The store is a real DuckDB file or DuckLake catalog: schema on first open, bulk appends, clear errors, data
survives reopen."""
from __future__ import annotations

import pyarrow as pa
import pytest

from gpuledger.analytics.store import Store, StoreError
from tests.helpers import gpu_rows, table


def test_schema_created_once_and_data_survives_reopen(open_store):
    with open_store("g") as s:
        assert s.append_samples(table(gpu_rows("n", 0, "H100", 10, job="j", team="t"))) == 10
    with open_store("g") as s:  # reopening must not recreate or wipe anything
        assert s.sample_count() == 10
        assert s.teams() == ["t"]
        tables = set(s.query("SELECT table_name FROM information_schema.tables")["table_name"])
        assert {"samples", "processes", "jobs", "teams", "rate_versions", "meta", "ledger_periods",
                "statement_lines", "ledger_adjustments"} <= tables


def test_append_is_one_bulk_insert_per_batch(open_store):
    with open_store("g") as s:
        batch = table(*(gpu_rows("n", g, "H100", 60, job=f"j{g}", team="t") for g in range(8)))
        assert s.append_samples(batch) == 480
        assert s.sample_count() == 480
        assert s.append_samples(batch.slice(0, 0)) == 0


def test_batch_missing_a_column_is_rejected_whole_with_a_clear_error(open_store):
    with open_store("g") as s:
        bad = table(gpu_rows("n", 0, "H100", 5)).drop_columns(["gpu_uuid"])
        with pytest.raises(StoreError, match="missing column"):
            s.append_samples(bad)
        wrong = table(gpu_rows("n", 0, "H100", 5)).set_column(1, "interval_s", pa.array(["x"] * 5))
        with pytest.raises(StoreError, match="does not match"):
            s.append_samples(wrong)
        assert s.sample_count() == 0


def test_second_writer_process_gets_a_clear_error(tmp_path):
    import subprocess
    import sys
    path = tmp_path / "g.duckdb"
    with Store(path):
        code = f"from analytics.store import Store\nStore({str(path)!r})"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "another gpuledger server" in result.stderr


def test_upserts_replace_by_key(store):
    import pandas as pd
    store.upsert_teams(pd.DataFrame({"team": ["a", "b"], "share": [1.0, 2.0], "quota_gpus": [1, 2]}))
    store.upsert_teams(pd.DataFrame({"team": ["a"], "share": [5.0], "quota_gpus": [3]}))
    got = store.query("SELECT * FROM teams ORDER BY team")
    assert got.values.tolist() == [["a", 5.0, 3, None], ["b", 2.0, 2, None]]
    store.set_rates({"H100": 9.99})
    assert store.current_rates() == {"H100": 9.99}  # a card is replaced whole


def test_idle_checkpoints_leave_row_groups_alone_until_the_daily_compaction(tmp_path):
    """Each group commit leaves a partial row group; merging them costs seconds, so only a daily checkpoint does."""
    import pyarrow as pa

    from gpuledger.collector.simulator import cluster_of
    sim = cluster_of(128)
    frames = [sim.frame([1.7e9 + 10 * k], 10.0) for k in range(6 * 127)]
    with Store(tmp_path / "s.duckdb") as s:
        for part in range(6):  # six commits of 130k rows: each a full row group (to the file) and a sliver
            s.append_samples(pa.concat_tables(frames[127 * part:127 * (part + 1)]))

        def row_groups() -> int:
            return s.scalar("SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('samples')")
        fragmented = row_groups()
        assert fragmented == 12
        assert s.checkpoint_if_due(min_wal_bytes=0)
        assert row_groups() == fragmented  # DuckDB's own default would merge slivers here
        s._compacted_at -= 24 * 3600  # a day later
        assert s.checkpoint_if_due()
        assert row_groups() < fragmented
        assert s.sample_count() == 6 * 127 * 1024


def test_rows_per_second_counts_the_servers_own_collection(tmp_path):
    from gpuledger.analytics.store.metrics import REGISTRY
    from gpuledger.collector.metrics import sample_value
    with Store(tmp_path / "g.duckdb") as s:
        s.append_samples(table(gpu_rows("n", 0, "H100", 10)))
        assert sample_value(REGISTRY, "gpuledger_ingest_rows_per_second") > 0  # not only agents' pushes
