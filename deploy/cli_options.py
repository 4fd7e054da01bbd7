"""The options and argument types several `gpuledger` commands share, below every module that defines a command.

Why a module of their own: a command lives in its own file (deploy/jobs_agent.py, node_admin.py, notes_command.py)
registered by deploy/cli.py, which imports those files, so the shared options cannot live in cli.py; each file
then declared --server, --token and --ca again, or had them handed in.
"""
from __future__ import annotations

import argparse
import os
from datetime import datetime, timedelta
from pathlib import Path

from gpuledger.analytics.store import lake
from gpuledger.analytics.store.lake import is_lake
from gpuledger.analytics.windows import as_utc

DEFAULT_DB = Path("gpuledger-data/gpuledger.duckdb")
DEMO_DB = Path("gpuledger-data/demo.duckdb")


def store_spec(text: str) -> Path | str:
    """A DuckDB file path, or a DuckLake catalog spec kept as the string it is."""
    return text if is_lake(text) else Path(text)


def instant(text: str) -> datetime:
    try:
        return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 instant: {text!r}") from exc


def duration(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `45s`: a span of time."""
    units = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
    try:
        value = float(text[:-1])
        if text[-1:] not in units or value <= 0:
            raise ValueError(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a span like 30d, 12h, 90m or 45s, got {text!r}") from exc
    return timedelta(**{units[text[-1]]: value})


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def add_common(p: argparse.ArgumentParser, db: Path | None = None) -> None:
    """--db and --config. Without --db, commands that only read a database take the server's default file, or
    the demo's when only that one exists (so `gpuledger report` works right after `gpuledger demo`)."""
    shown = db or DEFAULT_DB
    p.add_argument("--db", "--store", dest="db", type=store_spec, default=db, metavar="DB",
                   help=f"DuckDB file (default: {shown}), or a DuckLake catalog in PostgreSQL, "
                        "ducklake:postgres:<conninfo> or ducklake:postgres://user@host/db, which several processes "
                        "can open at once (one writer, any number of --read-only readers)")
    p.add_argument("--lake-data", metavar="DIR|URL",
                   help=f"DuckLake only: where a new lake keeps its Parquet files (default {lake.DEFAULT_DATA}); "
                        "the catalog remembers it, so later commands need not say it")
    p.add_argument("--config", type=Path, help="TOML config: rates, teams, attribution, thresholds")


def add_server(p: argparse.ArgumentParser, server_help: str, token_help: str, required: bool = False) -> None:
    """--server, --token and --ca: a running server to call, the caller's token, the server's CA."""
    p.add_argument("--server", metavar="URL", required=required,
                   default=None if required else os.environ.get("GPULEDGER_SERVER"), help=server_help)
    p.add_argument("--token", default=os.environ.get("GPULEDGER_TOKEN"), help=token_help)
    p.add_argument("--ca", type=Path, metavar="PEM", help="with an https:// --server: its CA certificate")


def add_admin_access(p: argparse.ArgumentParser, token: str = "an admin") -> None:
    """Where a command acts: a database file, or a running server (which keeps the file and keeps collecting)."""
    add_common(p)
    add_server(p, f"a running server to ask instead of opening --db (needs {token} --token; default "
                  "$GPULEDGER_SERVER)", f"with --server: {token} token (default $GPULEDGER_TOKEN)")
