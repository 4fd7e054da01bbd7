"""Streamlit admin dashboard; it reads through the API because the API process owns the DuckDB file."""
