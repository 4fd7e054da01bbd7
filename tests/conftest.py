from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.collector.simulator import ClusterSimulator
from gpuledger.deploy.server import ApiServer
from tests.helpers import PageServer
from tests.procs import TOKEN

# The simulated history ends at the last full hour, so "last N days" windows (dashboard, API defaults) see it.
SIM_END = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "test.duckdb") as s:
        s.set_rates(Config().rates)
        yield s


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
    store.upsert_jobs(simulator.jobs_frame(SIM_END))
    return store


@pytest.fixture(scope="session")
def sim_store(tmp_path_factory, simulator):
    """Three days of the simulated cluster at 5-minute resolution in a real DuckDB file."""
    s = fill_store(Store(tmp_path_factory.mktemp("sim") / "sim.duckdb"), simulator, days=3, step_s=300)
    yield s
    s.close()


# The simulated site's config: a policy window of two days, since the simulated store holds three.
SITE = Config(policy_window_days=2)


@pytest.fixture(scope="session")
def api_url(sim_store):
    server = ApiServer(sim_store, SITE, port=0)
    url = server.start()
    yield url
    server.stop()


@pytest.fixture
def central(tmp_path):
    """A server in this process that accepts pushes, over a fresh store: (its URL, the store)."""
    store = Store(tmp_path / "central.duckdb")
    server = ApiServer(store, Config(), port=0, token=TOKEN)
    url = server.start()
    yield url, store
    server.stop()
    store.close()
