"""The quotas in force are the scheduler's where it reports them (issue 39, "the configuration in force is the
scheduler's"): a replay of the record starts from what Kueue or KAI runs, the config only where nothing is read, and
the what-if says which. A stale read is not taken, and open advice stays the proposal over what runs."""
from __future__ import annotations

from datetime import timedelta

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.collector.jobs.kai import parse_kai
from gpuledger.collector.jobs.kueue import parse_kueue
from gpuledger.policies.recommendation import PROPOSED, Recommendation
from gpuledger.policies.recommender import evaluate
from gpuledger.policies.whatif import advised_plan, current_plan
from gpuledger.policies.whatif.reported import READ_MAX_AGE, reported_notes
from tests.helpers import T0, gpu_rows, table
from tests.scheduler_pages import FINAL, kai_page, kueue_page

AT = T0 + timedelta(hours=2)


def _site(store) -> None:
    """nlp and vision on 12 H100s, guaranteed 2 each by the config; Kueue's ClusterQueues say nlp 8 (borrowing 4)
    and vision 4 (borrowing 0), per the `h100` flavor."""
    store.upsert_teams(pd.DataFrame({"team": ["nlp", "vision"], "share": [1.0, 1.0], "quota_gpus": [2, 2]}))
    store.set_team_quotas(pd.DataFrame({"team": ["nlp", "vision"], "gpu_model": ["H100", "H100"],
                                        "guarantee_gpus": [2.0, 2.0], "limit_gpus": [12.0, 12.0]}))
    store.append_samples(table(*[gpu_rows("h", g, "H100", 120) for g in range(12)]))


def _teams(plan) -> dict:
    return {t.team: t for t in plan.teams}


def test_kueues_nominal_quota_and_borrowing_limit_are_the_quotas_in_force(file_store):
    _site(file_store)
    config = Config()
    before = _teams(current_plan(file_store, config, AT))
    assert before["nlp"].guarantee["H100"] == 2.0 and not reported_notes(current_plan(file_store, config, AT))
    file_store.record_queue_metrics(parse_kueue(kueue_page(FINAL), AT - timedelta(minutes=5)).rows)
    plan = current_plan(file_store, config, AT)
    teams = _teams(plan)
    assert (teams["nlp"].guarantee["H100"], teams["nlp"].limit["H100"]) == (8.0, 12.0)
    assert (teams["vision"].guarantee["H100"], teams["vision"].limit["H100"]) == (4.0, 4.0)
    assert teams["nlp"].source["H100"].startswith("reported by kueue at ")
    assert reported_notes(plan) == ["quotas in force as the scheduler reports them for nlp H100, vision H100; the "
                                    "config's [teams] numbers for the rest"]
    # a read older than READ_MAX_AGE is not the present state: the config holds
    late = AT + READ_MAX_AGE + timedelta(minutes=10)
    assert _teams(current_plan(file_store, config, late))["nlp"].guarantee["H100"] == 2.0


def test_open_advice_stays_the_proposal_over_what_the_scheduler_runs(file_store):
    _site(file_store)
    file_store.record_queue_metrics(parse_kueue(kueue_page(FINAL), AT - timedelta(minutes=5)).rows)
    advice = Recommendation(kind="quota", team="nlp", gpu_model="H100", status=PROPOSED, created=AT,
                            action={"guarantee_gpus": 6, "limit_gpus": 12, "current_guarantee_gpus": 8},
                            evidence={}, reason="lower nlp")
    file_store.add_recommendations(pd.DataFrame([advice.to_row()]))
    proposed, _ = advised_plan(file_store, Config(), AT, evaluate)
    teams = _teams(proposed)
    assert teams["nlp"].guarantee["H100"] == 6.0  # the advice
    assert teams["vision"].guarantee["H100"] == 4.0  # what runs, not the config's 2


def test_kais_deserved_quota_per_leaf_queue_is_taken_and_unlimited_is_not(file_store):
    _site(file_store)
    file_store.record_queue_metrics(parse_kai(kai_page(FINAL), AT - timedelta(minutes=1)).rows)
    teams = _teams(current_plan(file_store, Config(), AT))
    # the leaf `nlp-h100` deserves 8; the team queue `nlp` and the unlimited `default-queue` set nothing
    assert teams["nlp"].guarantee["H100"] == 8.0 and teams["nlp"].source["H100"].startswith("reported by kai at ")
    assert teams["nlp"].limit["H100"] == 12.0  # KAI publishes no borrowing limit: the config's stays
    assert teams["vision"].guarantee["H100"] == 2.0 and teams["vision"].source["H100"] == "config"
