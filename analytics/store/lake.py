"""The DuckLake backend: the same store with its catalog in PostgreSQL and its data in Parquet files.

Why: DuckDB lets one process hold a database file. A site that wants several API replicas, a report job
and a notebook reading while the server writes needs a catalog that many processes share; DuckLake keeps
it in PostgreSQL (snapshot isolation: every reader sees whole commits) and the rows in Parquet files on
local disk or object storage.

A store spec `ducklake:postgres:<libpq conninfo>` (`dbname=gl host=db user=gl`, or a
`postgres://user@host:port/db` URI) selects it. The extensions come from the pinned pip packages
`duckdb-extension-ducklake` and `duckdb-extension-postgres-scanner` (built for the pinned duckdb), so
nothing is downloaded at run time.

What differs from a DuckDB file, and how the store covers it: DuckLake has no PRIMARY KEY or UNIQUE
constraints, so tables are created without them and "insert or replace" is a delete and an insert in one
transaction (`Store._replace_rows`); every cursor is a new DuckDB connection and must `USE` the lake;
there is no WAL to fold (`CHECKPOINT` runs DuckLake's maintenance instead).
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import duckdb

from gpuledger.collector.errors import GpuledgerError

PREFIX = "ducklake:"
CATALOG = "lake"  # the name the lake is attached under
DEFAULT_DATA = Path("gpuledger-data/lake")  # where a new lake keeps its Parquet files unless told otherwise
_EXTENSIONS = (("duckdb_extension_postgres_scanner", "postgres_scanner"), ("duckdb_extension_ducklake", "ducklake"))


def is_lake(spec: str | Path) -> bool:
    return str(spec).startswith(PREFIX)


def attach_target(spec: str) -> str:
    """The ATTACH string of a store spec: `ducklake:postgres:<conninfo>`, with a postgres:// URI accepted as is."""
    rest = spec[len(PREFIX):]
    uri = re.match(r"^postgres(?:ql)?://", rest)
    if uri:
        return f"{PREFIX}postgres:{rest}"
    if not rest.startswith("postgres:") or not rest[len("postgres:"):].strip():
        raise GpuledgerError(f"a DuckLake store is ducklake:postgres:<conninfo> or ducklake:postgres://user@host/db, "
                             f"got {spec!r}")
    return spec


def _load_extensions(con: duckdb.DuckDBPyConnection) -> None:
    """Load the DuckLake and PostgreSQL extensions from their pip packages (never from the network)."""
    for module_name, extension in _EXTENSIONS:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise GpuledgerError(f"the DuckLake backend needs the pip package {module_name.replace('_', '-')}=="
                                 f"{duckdb.__version__} (a dependency of gpuledger: reinstall it)") from exc
        path = Path(module.__file__).parent / "extensions" / f"v{duckdb.__version__}" / f"{extension}.duckdb_extension"
        con.execute(f"LOAD '{path}'")


def connect(spec: str, read_only: bool, data_path: str | Path | None,
            settings: dict[str, str | int]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the lake attached and in use. The catalog remembers where its Parquet files are;
    `data_path` is needed only to create a lake (default DEFAULT_DATA), and a different one given for an existing
    lake is an error (DuckLake's own, naming both)."""
    con = duckdb.connect(":memory:", config=settings)
    _load_extensions(con)
    try:
        try:
            _attach(con, spec, read_only, data_path)
        except duckdb.Error as exc:
            if data_path is not None or read_only or "data_path is not set" not in str(exc):
                raise
            _attach(con, spec, read_only, DEFAULT_DATA)  # a new lake: its files go to the default folder
    except duckdb.Error as exc:
        con.close()
        raise GpuledgerError(f"cannot attach the DuckLake catalog {spec!r}: {exc}") from exc
    con.execute(f"USE {CATALOG}")
    return con


def _attach(con: duckdb.DuckDBPyConnection, spec: str, read_only: bool, data_path: str | Path | None) -> None:
    options = ["READ_ONLY"] if read_only else []
    if data_path is not None and not read_only:
        folder = str(data_path)
        if "://" not in folder:  # a local folder (object storage URLs are passed as they are)
            Path(folder).mkdir(parents=True, exist_ok=True)
            folder = str(Path(folder).resolve()) + "/"
        options.append(f"DATA_PATH '{folder.replace(chr(39), chr(39) * 2)}'")
    clause = f" ({', '.join(options)})" if options else ""
    target = attach_target(spec).replace("'", "''")
    con.execute(f"ATTACH '{target}' AS {CATALOG}{clause}")


def use(cur: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A new cursor is a new connection: point it at the lake."""
    cur.execute(f"USE {CATALOG}")
    return cur
