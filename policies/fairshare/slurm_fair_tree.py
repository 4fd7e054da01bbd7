"""Slurm's Fair Tree (the default since Slurm 19.05): LevelFS = S / U at each level of the account tree, and a
rank-based FairShare for every user.

The tree is root -> department (`[teams.X] parent`, optional) -> team -> user. Shares: a team's from the config,
a department's the sum of its teams', one per user seen in the samples. Usage is GPU-hours decayed with the
half-life. At each level S is the share over the siblings' shares and U the usage over the parent's usage, so
LevelFS = S / U (infinite without usage, 0 without share): above 1 under-served, below 1 over-served. Users are
ranked by walking the tree from the root, children in descending LevelFS (users before accounts on a tie, tied
users sharing a rank, tied accounts merged), and get FairShare = rank / number of users: the top user 1.0.

A team's history carries its LevelFS and the mean FairShare of its users; `over_served` is LevelFS < 1.
`tree_rows` lists a tree in the columns of `sshare -l`, and `tree_from_associations` builds one from a real
Slurm's associations, to compare the two on the same usage.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.policies.fairshare.slurm_classic import decayed, decayed_lookback_days

UNKNOWN_USER = "(unknown)"  # samples without a user still count towards their team


@dataclass
class Node:
    """An association: an account (department, team) or a user."""
    name: str
    account: str  # the account it belongs to (its own name for an account)
    user: str | None
    shares: float
    usage: float = 0.0
    children: list["Node"] = field(default_factory=list)
    norm_shares: float = 0.0
    effective_usage: float = 0.0
    level_fs: float = 0.0
    fairshare: float | None = None  # users only

    @property
    def is_user(self) -> bool:
        return self.user is not None


def _set_levels(node: Node) -> None:
    total_shares = sum(c.shares for c in node.children)
    for child in node.children:
        child.norm_shares = child.shares / total_shares if total_shares > 0 else 0.0
        child.effective_usage = child.usage / node.usage if node.usage > 0 else 0.0
        if child.norm_shares == 0:
            child.level_fs = 0.0
        elif child.effective_usage == 0:
            child.level_fs = math.inf
        else:
            child.level_fs = child.norm_shares / child.effective_usage
        _set_levels(child)


def _rank(children: list[Node], rank: list[int], users: int) -> None:
    """Depth-first in descending LevelFS; `rank` is a one-element counter counting down from the number of users.

    Siblings with equal LevelFS are one group: its accounts' children are ranked together, and its users get
    the rank the group started at, which is that of the accounts' highest user (as Slurm's fair_tree.c does)."""
    ordered = sorted(children, key=lambda c: -c.level_fs)
    i = 0
    while i < len(ordered):
        tied = [c for c in ordered[i:] if c.level_fs == ordered[i].level_fs]
        top = rank[0]
        accounts = [c for c in tied if not c.is_user]
        if accounts:
            _rank([grandchild for account in accounts for grandchild in account.children], rank, users)
        tied_users = [c for c in tied if c.is_user]
        for user in tied_users:
            user.fairshare = top / users
        rank[0] -= len(tied_users)
        i += len(tied)


def build_tree(teams: pd.DataFrame, user_usage: dict[tuple[str, str], float]) -> Node:
    """The account tree with each association's (decayed) usage; `user_usage` maps (team, user) to usage."""
    root = Node("root", "root", None, 1.0)
    departments: dict[str, Node] = {}
    for row in teams.itertuples(index=False):
        team = Node(row.team, row.team, None, float(row.share))
        for (owner, user), used in sorted(user_usage.items()):
            if owner == row.team:
                team.children.append(Node(user, row.team, user, 1.0, used))
        parent = row.parent if isinstance(row.parent, str) and row.parent else None
        if parent is None:
            root.children.append(team)
            continue
        if parent not in departments:
            departments[parent] = Node(parent, parent, None, 0.0)
            root.children.append(departments[parent])
        department = departments[parent]
        department.children.append(team)
        department.shares += team.shares
    return _scored(root)


def tree_from_associations(rows: list[dict]) -> Node:
    """A tree from associations as `sshare -lP -a` lists them, in its order (`account`, `user` or None,
    `raw_shares`, `usage`, `depth`: the leading spaces of the Account column), with LevelFS and FairShare
    computed by gpuledger: to check it against a real Slurm on the same usage."""
    root = Node("root", "root", None, 1.0)
    stack = [(-1, root)]
    for row in rows:
        node = Node(row["user"] or row["account"], row["account"], row["user"], float(row["raw_shares"]),
                    float(row["usage"]))
        while stack[-1][0] >= row["depth"]:
            stack.pop()
        stack[-1][1].children.append(node)
        if node.user is None:
            stack.append((row["depth"], node))
    return _scored(root)


def _scored(root: Node) -> Node:
    """Roll users' usage up to their accounts, then set every LevelFS and rank every user."""
    for node in reversed([root, *_walk(root)]):  # children before their parents
        if node.children:
            node.usage = sum(c.usage for c in node.children)
    _set_levels(root)
    users = sum(1 for n in _walk(root) if n.is_user)
    _rank(root.children, [users], max(users, 1))
    return root


def _walk(node: Node):
    for child in node.children:
        yield child
        yield from _walk(child)


def tree_rows(root: Node) -> pd.DataFrame:
    """The tree as `sshare -l` lists it: Account, User, RawShares, NormShares, RawUsage, EffectvUsage,
    FairShare (users only), LevelFS."""
    rows = [{"account": n.account, "user": n.user, "raw_shares": n.shares, "norm_shares": n.norm_shares,
             "raw_usage": n.usage, "effectv_usage": n.effective_usage, "fairshare": n.fairshare,
             "level_fs": n.level_fs} for n in _walk(root)]
    return pd.DataFrame(rows)


class SlurmFairTree:
    name = "slurm_fair_tree"

    def lookback_days(self, config: Config) -> float:
        return decayed_lookback_days(config)

    def _decayed_users(self, inputs, config: Config) -> tuple[list[tuple[str, str]], np.ndarray]:
        usage = inputs.usage.assign(user=inputs.usage["user"].fillna(UNKNOWN_USER))
        keys = sorted(set(zip(usage["team"], usage["user"])))
        if not keys:
            return [], np.zeros((len(inputs.hours), 0))
        wide = usage.pivot_table(index="hour", columns=["team", "user"], values="gpu_hours", aggfunc="sum")
        wide = wide.reindex(index=inputs.hours, columns=pd.MultiIndex.from_tuples(keys)).fillna(0.0)
        return keys, decayed(wide.to_numpy(), config.fairshare.half_life_days * 24.0)

    def history(self, inputs, config: Config) -> pd.DataFrame:
        keys, used = self._decayed_users(inputs, config)
        hourly = inputs.wide()
        rows = []
        for i, hour in enumerate(inputs.hours):
            tree = build_tree(inputs.teams, dict(zip(keys, used[i])) if keys else {})
            for node in _walk(tree):
                if node.is_user or node.name not in hourly.columns or node.account != node.name:
                    continue
                factors = [u.fairshare for u in node.children if u.fairshare is not None]
                rows.append({"hour": hour, "team": node.name, "gpu_hours": float(hourly.at[hour, node.name]),
                             "decayed_usage": node.usage, "norm_share": node.norm_shares,
                             "effective_usage": node.effective_usage, "level_fs": node.level_fs,
                             "fairshare": float(np.mean(factors)) if factors else 1.0,
                             "over_served": node.level_fs < 1.0})
        return pd.DataFrame(rows)
