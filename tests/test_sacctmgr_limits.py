"""Slurm's association limits are the limits in force (issue 39 item 2, issue 41 item 2: "the what-if has no Slurm
quotas in force"): `gpuledger import sacctmgr` reads what `sacctmgr show assoc` prints, the what-if replays the
record under those limits and shares and says so, and /v1/workloads/queues sets them beside gpuledger's plan.
The real sacctmgr's output is read in tests/test_slurm.py (`test_the_emitted_sacctmgr_script_applies_and_reads_back`).
"""
from __future__ import annotations

from datetime import timedelta

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.collector.jobs.sacctmgr import parse_sacctmgr
from gpuledger.deploy.cli import main
from gpuledger.policies.scheduler_state import compare_with_scheduler
from gpuledger.policies.quota_plan import build_plan
from gpuledger.policies.whatif import current_plan
from gpuledger.policies.whatif.reported import READ_MAX_AGE, reported_notes
from tests.helpers import T0, gpu_rows, table

AT = T0 + timedelta(hours=2)
# `sacctmgr -nP show assoc format=Account,User,ParentName,Fairshare,GrpTRES` as Slurm prints it: root, a department,
# two team accounts (one typed GPU limit with cpu beside it, one untyped), a user association, a parent share
NO_HEADER = """root|||1|
root|root||1|
ml||root|40|
nlp||ml|30|cpu=64,gres/gpu:h100=3
vision||ml|10|gres/gpu=2
vision|alice||1|gres/gpu:h100=1
infra||root|parent|
"""
# the same without -n: sacctmgr's header, here in another field order
WITH_HEADER = """GrpTRES|Account|User|Par Name|Share
|root||
cpu=64,gres/gpu:h100=3|nlp||ml|30
gres/gpu=2|vision||ml|10
"""


def _figures(batch) -> dict:
    rows = batch.rows
    return {(r.queue, r.flavor if isinstance(r.flavor, str) else None, r.figure): (r.value, r.detail)
            for r in rows.itertuples(index=False)}


def test_sacctmgr_output_gives_gpu_limits_per_type_and_shares():
    figures = _figures(parse_sacctmgr(NO_HEADER, AT))
    assert figures[("nlp", "h100", "limit_gpus")][0] == 3.0
    assert figures[("vision", None, "limit_gpus")][0] == 2.0
    assert figures[("nlp", None, "fairshare_shares")][0] == 30.0
    assert pd.isna(figures[("infra", None, "fairshare_shares")][0])
    assert figures[("infra", None, "fairshare_shares")][1] == "parent"
    assert not any(key[2] == "limit_gpus" and key[0] == "nlp" and key[1] is None for key in figures)  # cpu is no GPU
    batch = parse_sacctmgr(NO_HEADER, AT)
    assert batch.skipped["user_association"] == 2  # root's root and vision's alice: not a team's limit
    assert set(batch.rows["cohort"].dropna()) == {"ml", "root"}
    again = _figures(parse_sacctmgr(WITH_HEADER, AT))  # the header's order wins
    assert again[("nlp", "h100", "limit_gpus")][0] == 3.0 and again[("vision", None, "fairshare_shares")][0] == 10.0


def _site(store) -> Config:
    """nlp and vision on 8 H100s, each allowed all 8 and shares 1:1 by the config."""
    store.upsert_teams(pd.DataFrame({"team": ["nlp", "vision"], "share": [1.0, 1.0], "quota_gpus": [0, 0]}))
    store.set_team_quotas(pd.DataFrame({"team": ["nlp", "vision"], "gpu_model": ["H100", "H100"],
                                        "guarantee_gpus": [0.0, 0.0], "limit_gpus": [8.0, 8.0]}))
    store.append_samples(table(*[gpu_rows("h", g, "H100", 120) for g in range(8)]))
    return Config()


def test_the_replay_starts_from_slurms_limits_and_shares_and_says_so(file_store, tmp_path, capsys):
    config = _site(file_store)
    before = {t.team: t for t in current_plan(file_store, config, AT).teams}
    assert before["nlp"].limit["H100"] == 8.0 and before["nlp"].share == 1.0
    file_store.record_queue_metrics(parse_sacctmgr(NO_HEADER, AT - timedelta(minutes=5)).rows)
    plan = current_plan(file_store, config, AT)
    teams = {t.team: t for t in plan.teams}
    assert teams["nlp"].limit["H100"] == 3.0 and teams["nlp"].source["H100"].startswith("reported by slurm at ")
    assert teams["vision"].limit["H100"] == 2.0  # untyped gres/gpu: vision has one model
    assert teams["nlp"].guarantee["H100"] == 0.0  # Slurm has no guarantee: the config's stays
    assert (teams["nlp"].share, teams["vision"].share) == (30.0, 10.0)
    notes = reported_notes(plan)
    assert any("nlp H100" in n and "vision H100" in n for n in notes), notes
    assert any(n.startswith("shares as Slurm's Fairshare") and "nlp 30" in n for n in notes), notes
    # a stale read is not the present state
    late = {t.team: t for t in current_plan(file_store, config, AT + READ_MAX_AGE + timedelta(minutes=10)).teams}
    assert late["nlp"].limit["H100"] == 8.0 and late["nlp"].share == 1.0


def test_shares_stay_the_configs_unless_every_team_reports_one(file_store):
    config = _site(file_store)
    file_store.record_queue_metrics(parse_sacctmgr("nlp||ml|30|gres/gpu:h100=3\n", AT - timedelta(minutes=5)).rows)
    teams = {t.team: t for t in current_plan(file_store, config, AT).teams}
    assert teams["nlp"].limit["H100"] == 3.0
    assert (teams["nlp"].share, teams["vision"].share) == (1.0, 1.0)  # half Slurm's, half the config's is neither


def test_slurms_limits_beside_the_plan(file_store):
    config = _site(file_store)
    file_store.record_queue_metrics(parse_sacctmgr(NO_HEADER, AT - timedelta(minutes=5)).rows)
    table_ = compare_with_scheduler(file_store, build_plan(file_store, config, at=AT), AT)
    slurm = table_[table_["scheduler"] == "slurm"].set_index(["queue", "flavor"], drop=False)
    assert slurm.loc[("nlp", "h100"), "status"] == "differs" and slurm.loc[("nlp", "h100"), "team"] == "nlp"
    assert (slurm.loc[("nlp", "h100"), "quota_in_force_gpus"], slurm.loc[("nlp", "h100"), "planned_gpus"]) == (3, 8)
    assert "vision" in set(slurm["queue"])  # its untyped limit is listed, not taken for a type
    assert not (slurm["queue"].isin(["ml", "infra"])).any()  # shares only: no limit to compare


def test_import_sacctmgr_stores_and_refuses_what_is_not_its_output(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    (tmp_path / "assoc.txt").write_text(NO_HEADER)
    assert main(["import", "sacctmgr", str(tmp_path / "assoc.txt"), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "imported sacctmgr:" in out and "2 user_association" in out, out
    (tmp_path / "junk.txt").write_text("Account User\nnlp alice\n")
    assert main(["import", "sacctmgr", str(tmp_path / "junk.txt"), "--db", str(db)]) == 2
    assert "sacctmgr -P show assoc format=Account,User,ParentName,Fairshare,GrpTRES" in capsys.readouterr().err
