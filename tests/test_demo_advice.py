"""The demo shows every kind of advice from its first minute, and still an hour on (issue 20).

The store is built as `gpuledger demo` builds it (`build_demo_store`), with a shorter history to keep the test
quick: quota advice needs samples over most of the policy window, so the window is as long as the history.
The live part is simulated as the demo's collect loop does it: the simulator's samples every 15 s after the
demo's "now" and the job records as of each instant, then the recommender refreshed as the API refreshes it.
Every advice must rest on numbers: no evidence value may be missing (None or NaN), except the current guarantee
of quota advice that *sets* one where none is stated (its absence is what the advice is about).
"""
from __future__ import annotations

import math
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Iterator

import pytest

from gpuledger.analytics.config import Config, QuotaConfig
from gpuledger.analytics.store import Store
from gpuledger.collector.simulator import ClusterSimulator
from gpuledger.deploy.demo import build_demo_store
from gpuledger.policies.recommendation import KINDS, Recommendation
from gpuledger.policies.recommender import evaluate, refresh

DAYS = 3.0  # history simulated; the demo's is 14 days, but every kind already shows after 3
LIVE_STEP_S = 15.0  # the demo's default live interval
# the default seed and two others: the advice must not depend on the seed's luck
SEEDS = (7, 1, 2024)
# quota advice that sets a guarantee where none is stated has nothing to cite for the one in force
NO_GUARANTEE_YET = {"current_guarantee_gpus", "current_limit_gpus", "current_from"}


def _config() -> Config:
    # the history must cover the window for quota advice (min_coverage)
    return Config(quota=QuotaConfig(window_days=DAYS))


def _go_live(store: Store, sim: ClusterSimulator, since: datetime, until: datetime) -> None:
    """What the demo's collect loop stores from `since` to `until`: a batch every 15 s, then the job records."""
    for table in sim.history(since, until, step_s=LIVE_STEP_S, chunk_s=3600.0):
        store.append_samples(table)
    store.upsert_jobs(sim.jobs_frame(until))


def _missing(path: str, value: Any) -> Iterator[str]:
    """The paths of the missing values (None, NaN) in an evidence value, walking dicts and lists."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _missing(f"{path}.{key}", item)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _missing(f"{path}[{i}]", item)
    elif value is None or (isinstance(value, float) and math.isnan(value)):
        yield path


def _unsupported(recs: list[Recommendation]) -> list[str]:
    """Each advice's evidence values that are missing, as 'kind job-or-team: path'."""
    out = []
    for rec in recs:
        allowed = NO_GUARANTEE_YET if rec.kind == "quota" and rec.action.get("current_guarantee_gpus") is None \
            else set()
        out += [f"{rec.kind} {rec.job_id or rec.team}: {path}" for key, value in rec.evidence.items()
                if key not in allowed for path in _missing(key, value)]
    return out


def _freed_by(sim: ClusterSimulator, rec: Recommendation, when: float) -> list[int]:
    """The GPUs of a consolidate advice's node that its moves leave free at `when`, from the simulator's own
    layout: those every job holding them moves off (or that none holds)."""
    node = next(n for n, spec in enumerate(sim.nodes) if spec.name == rec.action["node"])
    moved = {m["job_id"] for m in rec.action["move"]}
    holders: dict[int, set[str]] = {}
    for job in sim.jobs:
        if job.start <= when < job.end:
            for n, gpus in ((job.node, job.gpu_indices), *job.also_on):
                for gpu in gpus if n == node else ():
                    holders.setdefault(gpu, set()).add(job.job_id)
    return [gpu for gpu in range(sim.nodes[node].gpus) if holders.get(gpu, set()) <= moved]


@pytest.fixture(scope="module", params=SEEDS, ids=[f"seed{s}" for s in SEEDS])
def demo(request, tmp_path_factory) -> Iterator[tuple[Store, ClusterSimulator, Config]]:
    config = _config()
    path = Path(tmp_path_factory.mktemp("demo")) / "demo.duckdb"
    store, sim = build_demo_store(path, config, DAYS, request.param, step_s=60.0, echo=lambda *_: None)
    yield store, sim, config
    store.close()


def test_every_kind_of_advice_from_the_first_minute_and_an_hour_on(demo):
    store, sim, config = demo
    now = sim.showcase  # the demo's "now": where the history ends and live collection begins
    assert now is not None
    for minutes in (1, 1 + config.quota.refresh_minutes):  # the API's first refresh, and the next one it makes
        at = now + timedelta(minutes=minutes, seconds=7)  # mid-minute, as a request lands
        _go_live(store, sim, store.latest_ts() + timedelta(seconds=LIVE_STEP_S), at)
        open_recs = refresh(store, config, at)
        kinds = Counter(r.kind for r in open_recs)
        assert set(KINDS) <= set(kinds), (minutes, kinds)
        assert _unsupported(open_recs) == []


def test_the_staged_layout_explains_each_kind(demo):
    """The showcase's causes, checked where the advice names them: the gang job waits for the staged model while no
    node has its GPUs free, the spread job is told to gather on a node it already uses, the served model is the
    latency-sensitive sharer of a GPU."""
    store, sim, config = demo
    evaluation = evaluate(store, config, store.latest_ts() + timedelta(seconds=LIVE_STEP_S))
    by_kind: dict[str, list[Recommendation]] = {}
    for rec in evaluation.proposals():
        by_kind.setdefault(rec.kind, []).append(rec)
    waiting = {j.job_id: j.want_model for j in sim.jobs if j.want_model is not None and math.isinf(j.start)}
    staged = [r for r in by_kind["consolidate"] if r.job_id in waiting]
    assert staged and all(r.gpu_model == waiting[r.job_id] for r in staged)
    assert all(r.evidence["most_free_gpus_on_any_node"] < r.evidence["gpus_needed"] for r in staged)
    for rec in staged:  # the moves free what the advice says: a GPU time-sliced by two jobs only once both move
        assert len(_freed_by(sim, rec, store.latest_ts().timestamp())) >= rec.action["frees_gpus"], rec.action
    # the staged spread job sends its collectives over PCIe to the other node: advised into one island, with a gain
    assert any(len(r.evidence["gpus_per_node"]) > 1 and r.action["node"] in r.evidence["gpus_per_node"]
               and r.action["island"] == 0 and r.evidence["cross_node_gbytes_s_per_gpu"] > 10
               and 0 < r.evidence["time_share_saved"] <= 1 - r.evidence["sm_active"]
               and r.evidence["effect_usd_per_week"] > 0 for r in by_kind["colocate"])
    assert any(r.job_id.split("/")[0] in config.placement.latency_sensitive and r.evidence["shares_gpu_with"]
               for r in by_kind["separate"])
