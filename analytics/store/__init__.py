"""The store room: the DuckDB file, its schema and migrations, and the central ingest writer.

Everything that writes to the database lives here; the analytics next door only read it.
"""
from gpuledger.analytics.store.database import Store, StoreError, conform, wal_bytes

__all__ = ["Store", "StoreError", "conform", "wal_bytes"]
