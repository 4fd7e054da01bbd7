"""The three fairshare algorithms on usage whose factors can be worked out by hand, and their independence from
the window a caller views."""
from __future__ import annotations

import math
from datetime import timedelta

import pandas as pd
import pytest

from gpuledger.analytics.config import Config, FairshareConfig
from gpuledger.policies.fairshare import FairshareInputs, fairshare_history
from gpuledger.policies.fairshare.kai_time_based import KaiTimeBased, windowed
from gpuledger.policies.fairshare.slurm_classic import SlurmClassic
from gpuledger.policies.fairshare.slurm_fair_tree import SlurmFairTree, build_tree, tree_rows
from tests.helpers import T0, gpu_rows, table

END = T0 + timedelta(hours=3)


def inputs(rows: list[tuple[int, str, str, float]], teams: list[tuple[str, float, str | None]], hours: int,
           capacity: float = 10.0) -> FairshareInputs:
    """rows: (hour index, team, user, GPU-hours)."""
    index = pd.date_range(T0, periods=hours, freq="h")
    usage = pd.DataFrame([{"hour": index[h], "team": t, "user": u, "gpu_hours": g} for h, t, u, g in rows],
                         columns=["hour", "team", "user", "gpu_hours"])
    return FairshareInputs(index, usage, pd.Series(capacity, index=index),
                           pd.DataFrame(teams, columns=["team", "share", "parent"]))


def test_slurm_classic_is_two_to_the_minus_usage_over_share():
    got = SlurmClassic().history(inputs([(0, "a", "u", 1.0), (1, "b", "v", 1.0)],
                                        [("a", 1.0, None), ("b", 1.0, None)], 2),
                                 Config(fairshare=FairshareConfig(half_life_days=1 / 24)))
    last = got[got["hour"] == got["hour"].max()].set_index("team")
    # at hour 1: a decayed to 0.5, b = 1 -> normalised usage 1/3 and 2/3, shares 1/2 each
    assert last.loc["a", "fairshare"] == pytest.approx(2 ** (-(1 / 3) / 0.5))
    assert last.loc["b", "fairshare"] == pytest.approx(2 ** (-(2 / 3) / 0.5))
    first = got[got["hour"] == got["hour"].min()].set_index("team")
    assert first.loc["a", "fairshare"] == pytest.approx(0.25) and first.loc["b", "fairshare"] == 1.0
    assert bool(first.loc["a", "over_served"]) and not bool(first.loc["b", "over_served"])


def test_slurm_classic_effective_usage_under_a_department():
    """Slurm's classic_fair_share: UE = UA + (UE_parent - UA) * S_child / S_siblings, S along the path."""
    got = SlurmClassic().history(inputs([(0, "a", "u", 3.0), (0, "b", "v", 1.0), (0, "c", "w", 4.0)],
                                        [("a", 1.0, "d"), ("b", 1.0, "d"), ("c", 2.0, None)], 1),
                                 Config(fairshare=FairshareConfig(half_life_days=7))).set_index("team")
    # tier 1: d (shares 2) and c (2): 0.5 each; a, b: 0.25 each. UA: a 3/8, b 1/8, c 1/2; UE_d = 1/2
    assert got.loc["a", "norm_share"] == pytest.approx(0.25)
    assert got.loc["a", "effective_usage"] == pytest.approx(3 / 8 + (1 / 2 - 3 / 8) * 0.5)
    assert got.loc["b", "fairshare"] == pytest.approx(2 ** -((1 / 8 + (1 / 2 - 1 / 8) * 0.5) / 0.25))
    assert got.loc["c", "fairshare"] == pytest.approx(0.5)


def test_fair_tree_level_fs_matches_a_real_sshare_row():
    """From the sshare -l excerpt in shared/docs/schedulers/slurm.md: general's LevelFS = 0.538554 / 0.800082."""
    root = build_tree(pd.DataFrame([("general", 8500.0, None), ("other", 8500 / 0.538554 - 8500, None)],
                                   columns=["team", "share", "parent"]),
                      {("general", "jakth2"): 0.800082, ("other", "x"): 1 - 0.800082})
    rows = tree_rows(root).set_index(["account", "user"], drop=False)
    general = rows[(rows["account"] == "general") & rows["user"].isna()].iloc[0]
    assert general["norm_shares"] == pytest.approx(0.538554, rel=1e-6)
    assert general["level_fs"] == pytest.approx(0.673123, rel=1e-5)


def test_fair_tree_ranks_users_through_the_tree():
    """Team a is under-served (LevelFS 2) and b over-served (2/3): every user of a ranks above every user of b."""
    teams = pd.DataFrame([("a", 1.0, None), ("b", 1.0, None)], columns=["team", "share", "parent"])
    root = build_tree(teams, {("a", "u1"): 1.0, ("a", "u2"): 0.0, ("b", "v1"): 2.0, ("b", "v2"): 0.5})
    rows = tree_rows(root)
    users = rows[rows["user"].notna()].set_index("user")
    assert users.loc["u2", "fairshare"] == 1.0  # no usage: LevelFS infinite, first in line
    assert users.loc["u1", "fairshare"] == 0.75
    assert users.loc["v2", "fairshare"] == 0.5 and users.loc["v1", "fairshare"] == 0.25
    accounts = rows[rows["user"].isna()].set_index("account")
    assert accounts.loc["a", "level_fs"] == pytest.approx(0.5 / (1 / 3.5))
    assert accounts.loc["b", "level_fs"] == pytest.approx(0.5 / (2.5 / 3.5))
    assert math.isinf(users.loc["u2", "level_fs"])


def test_fair_tree_history_marks_the_team_over_its_share():
    got = SlurmFairTree().history(inputs([(0, "a", "u", 1.0), (0, "b", "v", 3.0)],
                                         [("a", 1.0, None), ("b", 1.0, None)], 1), Config()).set_index("team")
    assert got.loc["a", "level_fs"] == pytest.approx(2.0) and got.loc["b", "level_fs"] == pytest.approx(2 / 3)
    assert bool(got.loc["b", "over_served"]) and got.loc["a", "fairshare"] == 1.0 and got.loc["b", "fairshare"] == 0.5


def test_kai_time_based_over_quota_weight():
    """KAI: U = windowed usage / windowed capacity, P = max(0, W + k (W - U))."""
    got = KaiTimeBased().history(inputs([(0, "a", "u", 6.0), (1, "a", "u", 6.0), (0, "b", "v", 2.0)],
                                        [("a", 1.0, None), ("b", 1.0, None)], 2, capacity=10.0),
                                 Config(fairshare=FairshareConfig(window_days=1, k_value=1.0)))
    last = got[got["hour"] == got["hour"].max()].set_index("team")
    assert last.loc["a", "usage"] == pytest.approx(12 / 20) and last.loc["b", "usage"] == pytest.approx(2 / 20)
    assert last.loc["a", "over_quota_weight"] == pytest.approx(max(0.0, 0.5 + (0.5 - 0.6)))
    assert last.loc["b", "over_quota_weight"] == pytest.approx(0.5 + (0.5 - 0.1))
    assert last.loc["b", "fairshare"] == pytest.approx(0.9 / 1.3) and bool(last.loc["a", "over_served"])


def test_kai_window_slides_and_decays():
    values = pd.Series([1.0, 1.0, 1.0, 1.0]).to_numpy()
    assert windowed(values, 2, 0).tolist() == [1.0, 2.0, 2.0, 2.0]
    assert windowed(values, 2, 1.0).tolist() == pytest.approx([1.0, 1.5, 1.5, 1.5])


@pytest.mark.parametrize("algorithm", ["slurm_classic", "slurm_fair_tree", "kai_time_based"])
def test_a_factor_does_not_depend_on_the_window_viewed(store, algorithm):
    store.upsert_teams(pd.DataFrame({"team": ["a", "b"], "share": [3.0, 1.0], "quota_gpus": [3, 1]}))
    store.append_samples(table(gpu_rows("n", 0, "H100", 180, util=90.0, job="a/1", team="a", user="x"),
                               gpu_rows("n", 1, "H100", 180, util=90.0, job="b/1", team="b", user="y"),
                               gpu_rows("n", 2, "H100", 60, util=90.0, job="b/2", team="b", user="z")))
    config = Config(fairshare=FairshareConfig(algorithm=algorithm, half_life_days=1))
    wide = fairshare_history(store, config, T0, END)
    narrow = fairshare_history(store, config, END - timedelta(hours=1), END)
    assert len(narrow) == 2 and len(wide) == 6
    last_hour = wide[wide["hour"] == narrow["hour"].max()].set_index("team")["fairshare"]
    assert narrow.set_index("team")["fairshare"].to_dict() == pytest.approx(last_hour.to_dict())
    b = wide[wide["team"] == "b"].sort_values("hour")
    assert bool(b["over_served"].iloc[-1])  # b used more than its quarter share
