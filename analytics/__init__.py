"""DuckDB store and the chargeback analytics computed over it."""
