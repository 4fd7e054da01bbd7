from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

import pytest

from gpuledger.analytics.config import Config, QuotaConfig
from gpuledger.analytics.store import Store
from gpuledger.collector.simulator import ClusterSimulator
from gpuledger.deploy.server import ApiServer
from tests.helpers import PageServer
from tests.postgres_cluster import PostgresCluster, bin_dir
from tests.procs import TOKEN

# The simulated history ends at the last full hour, so "last N days" windows (dashboard, API defaults) see it.
SIM_END = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL on 127.0.0.1 for the DuckLake catalog, started once for the session."""
    if bin_dir() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install PostgreSQL (.ci/run) for the DuckLake backend's tests")
        pytest.skip("the DuckLake backend's tests need Debian's postgresql")
    cluster = PostgresCluster().start()
    yield cluster
    cluster.stop()


BACKENDS = ("duckdb", "ducklake")


@pytest.fixture(params=BACKENDS)
def open_store(request, tmp_path: Path) -> Callable[..., Store]:
    """Opens a store by name on the backend under test: a DuckDB file, or a DuckLake catalog in a real PostgreSQL
    with its Parquet files under tmp_path. The same name opens the same store again; stores still open at the
    end are closed."""
    opened: list[Store] = []
    specs: dict[str, str] = {}

    def open_(name: str = "test", **kwargs) -> Store:
        if request.param == "duckdb":
            store = Store(tmp_path / f"{name}.duckdb", **kwargs)
        else:
            if name not in specs:
                pg = request.getfixturevalue("postgres")
                specs[name] = "ducklake:postgres:" + pg.create_database(f"{name}_{uuid.uuid4().hex[:8]}")
            store = Store(specs[name], lake_data=tmp_path / f"{name}-lake", **kwargs)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()  # closing twice is harmless: tests close the stores they open in `with`


@pytest.fixture
def store(open_store):
    s = open_store()
    s.set_rates(Config().rates)
    return s


@pytest.fixture
def file_store(tmp_path: Path):
    """A store in a DuckDB file only, with the default rates: for tests whose point is a route, a plan or a policy
    rather than the storage backend, so the DuckLake variant's PostgreSQL catalog is not set up again for them."""
    s = Store(tmp_path / "file.duckdb")
    s.set_rates(Config().rates)
    yield s
    s.close()


@pytest.fixture
def page_server():
    server = PageServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def simulator() -> ClusterSimulator:
    return ClusterSimulator(start=SIM_END - timedelta(days=3), end=SIM_END + timedelta(days=1), seed=11)


def fill_store(store: Store, simulator: ClusterSimulator, days: float, step_s: float) -> Store:
    """Rates, teams, `days` of samples up to SIM_END and the job table, as a server would hold them."""
    store.set_rates(Config().rates)
    store.upsert_teams(simulator.team_frame())
    store.set_team_quotas(simulator.quota_frame())
    for batch in simulator.history(SIM_END - timedelta(days=days), SIM_END, step_s=step_s):
        store.append_samples(batch)
    store.fold()  # folded as a running server keeps it (a server started over a backlog first catches up)
    store.upsert_jobs(simulator.jobs_frame(SIM_END))
    return store


@pytest.fixture(scope="session")
def sim_store(tmp_path_factory, simulator):
    """Three days of the simulated cluster at 5-minute resolution in a real DuckDB file."""
    s = fill_store(Store(tmp_path_factory.mktemp("sim") / "sim.duckdb"), simulator, days=3, step_s=300)
    yield s
    s.close()


# The simulated site's config: a policy window of two days, since the simulated store holds three.
SITE = Config(quota=QuotaConfig(window_days=2))


@pytest.fixture(scope="session")
def api_url(sim_store):
    server = ApiServer(sim_store, SITE, port=0, open_reads=True)
    url = server.start()
    yield url
    server.stop()


@pytest.fixture
def central(open_store):
    """A server in this process that accepts pushes, over a fresh store of the backend under test: (its URL, the
    store)."""
    store = open_store("central")
    server = ApiServer(store, Config(), port=0, token=TOKEN, open_reads=True)
    url = server.start()
    yield url, store
    server.stop()


@pytest.fixture
def stack():
    """An ExitStack closed when the test ends: what a test opens with `stack.enter_context` is closed even when it
    fails."""
    from contextlib import ExitStack
    with ExitStack() as opened:
        yield opened


@pytest.fixture
def writer(tmp_path: Path):
    """An ingest writer over a fresh DuckDB file priced at the default rates: (writer, store)."""
    from gpuledger.analytics.store.ingest_writer import IngestWriter
    with Store(tmp_path / "c.duckdb") as store:
        store.set_rates(Config().rates)
        w = IngestWriter(store, idle_checkpoint_s=600)
        try:
            yield w, store
        finally:
            w.stop()


# The files that take longest (about a minute or more each on CI's two cores: `--durations` in CI's log), scheduled
# first (pyproject's --no-loadscope-reorder keeps this order): with a file per worker (--dist loadfile), a long file
# dealt out last leaves the other worker idle while it runs, and the suite's wall time is the longer worker's. Dealt
# longest first, the short files fill in around them. The real-Slurm file leads: it mostly waits on jobs' sleeps.
LONGEST_FIRST = ("test_slurm.py", "test_trace_import.py", "test_hostile_suite.py",
                 "test_backtest.py", "test_lake.py", "test_properties.py", "test_cli_found_server.py", "test_ledger.py",
                 "test_soak.py", "test_fold_backlog.py", "test_demo_advice.py", "test_cli.py", "test_dashboard_live.py",
                 "test_dashboard.py", "test_docs.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (LONGEST_FIRST), the rest in their collected order; a file's tests stay together."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
