"""How a statement splits the costs no team ran up: idle capacity and shared-cost teams, the way OpenCost users know
them, and the rounding that keeps every bill adding up to the cluster's cost to the cent.

- Idle capacity (GPUs no job held) is its own line (`[ledger] idle = "own_line"`), or shared (`"shared"`) to the
  bill lines that allocated the same GPU model at the same rate, by their allocated GPU-hours, across the cluster
  (`idle_by = "cluster"`) or per node (`"node"`: a node's idle GPUs go to whoever allocated on that node; a node
  nobody allocated on keeps its idle line). Idle of a model nobody allocated stays idle capacity.
- Shared-cost teams (`shared_teams`, e.g. a platform team's GPUs) are spread, after the idle split, over the other
  lines by their cost (`share_by = "cost"`) or evenly (`"even"`); with nobody to spread to they stay.
Each moved amount becomes a line of its recipient that says what it is (`kind`) and whose cost it was
(`shared_from`), with its share of the GPU-hours, so nothing is hidden and GPU-hours add up too. Cents are given
out by largest remainder over all lines, so the lines' cents sum to the cluster's cost rounded once, whatever
the mode.
"""
from __future__ import annotations

import math

import pandas as pd

from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED

LINE_KINDS = ("usage", "idle share", "shared cost")  # what a statement line is: own use, or a share of whose
USAGE, IDLE_SHARE, SHARED_COST = LINE_KINDS
IDLE_MODES = ("own_line", "shared")
IDLE_SCOPES = ("cluster", "node")
SHARE_BY = ("cost", "even")
KEY = ["gpu_model", "rate_from", "rate_variant"]  # what an idle share stays within: the same card at the same rate
SUMMED = ["gpu_hours", "used_gpu_hours", "measured_gpu_hours", "cost"]


def _by_weight(amount_rows: pd.DataFrame, weights: pd.Series, kind: str, source: str) -> pd.DataFrame:
    """`amount_rows` (GPU-hours and exact cost to move) given to the recipients in `weights` (team -> weight > 0),
    as lines of `kind` from `source`."""
    total = float(weights.sum())
    moved = []
    for team, weight in weights.items():
        share = weight / total
        part = amount_rows.copy()
        part["team"] = team
        for column in ("gpu_hours", "cost"):
            part[column] = part[column] * share
        part["used_gpu_hours"], part["measured_gpu_hours"] = math.nan, 0.0  # a share was not used by its recipient
        part["kind"], part["shared_from"] = kind, source
        moved.append(part)
    return pd.concat(moved, ignore_index=True) if moved else amount_rows.iloc[0:0]


def share_idle(lines: pd.DataFrame, scope: str) -> pd.DataFrame:
    """`lines` (per team, node, model and rate; exact `cost`) with the idle-capacity lines shared to the lines
    that allocated the same model at the same rate (per node with `scope` node), by allocated GPU-hours."""
    group = KEY + (["node"] if scope == "node" else [])
    idle = lines[lines["team"] == IDLE_CAPACITY]
    kept, moved = [lines[lines["team"] != IDLE_CAPACITY]], []
    for key, rows in idle.groupby(group, dropna=False):
        match = pd.Series(True, index=kept[0].index)
        for column, value in zip(group, key):
            match &= kept[0][column].isna() if pd.isna(value) else kept[0][column] == value
        weights = kept[0][match].groupby("team")["gpu_hours"].sum()
        weights = weights[weights > 0]
        if weights.empty:
            kept.append(rows)  # nobody allocated this card here: it stays idle capacity
        else:
            moved.append(_by_weight(rows, weights, IDLE_SHARE, IDLE_CAPACITY))
    return pd.concat(kept + moved, ignore_index=True)


def spread_shared(lines: pd.DataFrame, shared: tuple[str, ...], share_by: str) -> pd.DataFrame:
    """`lines` with each shared-cost team's lines spread over the other bill lines (not idle capacity, not other
    shared teams) by their cost, or evenly."""
    for team in shared:
        own = lines[(lines["team"] == team)]
        receivers = lines[~lines["team"].isin((*shared, IDLE_CAPACITY))]
        if own.empty or receivers.empty:
            continue
        if share_by == "cost" and receivers["cost"].sum() > 0:
            weights = receivers.groupby("team")["cost"].sum()
        else:
            weights = pd.Series(1.0, index=sorted(receivers["team"].unique()))
        weights = weights[weights > 0]
        lines = pd.concat([lines[lines["team"] != team], _by_weight(own, weights, SHARED_COST, team)],
                          ignore_index=True)
    return lines


def in_cents(costs: pd.Series, total_cents: int | None = None) -> pd.Series:
    """Exact costs as whole cents whose sum is the total rounded once (or `total_cents`, a total already shown
    elsewhere in whole cents): each floored, and the cents left over given to the largest remainders (Hamilton's
    method), so no line is off by more than a cent and the bill adds up."""
    cents = costs.fillna(0.0).astype(float) * 100.0
    floors = cents.apply(math.floor)
    total = int(round(float(cents.sum()))) if total_cents is None else int(total_cents)
    left = total - int(floors.sum())
    order = (cents - floors).sort_values(ascending=False, kind="stable").index
    floors.loc[order[:max(left, 0)]] += 1
    return floors.astype("int64")


def cents_usd(costs: pd.Series, total_cents: int | None = None) -> pd.Series:
    """`in_cents` as dollars: exact costs as whole cents, still adding up to their total, for an answer or a file
    that shows amounts to the cent."""
    return in_cents(costs, total_cents) / 100.0


def split(lines: pd.DataFrame, idle: str = "own_line", idle_by: str = "cluster", shared: tuple[str, ...] = (),
          share_by: str = "cost") -> pd.DataFrame:
    """Per-node lines (team, node, gpu_model, rate_from, rate_variant, rate_card, usd_per_gpu_hour, gpu_hours,
    used_gpu_hours,
    measured_gpu_hours, exact `cost`) as a statement's lines in the chosen modes: per team, kind, source, model and
    rate, with `cost_cents` that add up to the cluster's cost to the cent."""
    lines = lines.assign(kind=USAGE, shared_from=None)
    if idle == "shared":
        lines = share_idle(lines, idle_by)
    if shared:
        lines = spread_shared(lines, tuple(t for t in shared if t not in (IDLE_CAPACITY, UNATTRIBUTED)), share_by)
    keys = ["team", "kind", "shared_from", "gpu_model", "rate_from", "rate_variant", "rate_card"]
    out = (lines.groupby(keys, dropna=False, sort=False)
           .agg(usd_per_gpu_hour=("usd_per_gpu_hour", "first"), **{c: (c, "sum") for c in SUMMED},
                measured_any=("measured_gpu_hours", lambda s: bool((s > 0).any())))
           .reset_index())
    out["used_gpu_hours"] = out["used_gpu_hours"].where(out["measured_any"])  # unknown is never zero
    out["util_coverage"] = (out["measured_gpu_hours"] / out["gpu_hours"].where(out["gpu_hours"] > 0)).clip(upper=1.0)
    out["cost_cents"] = in_cents(out["cost"])
    order = out["team"].eq(IDLE_CAPACITY).astype(int)
    return (out.assign(_idle=order).sort_values(["_idle", "team", "kind", "gpu_model", "rate_from", "rate_variant"])
            .drop(columns=["_idle", "measured_any", "measured_gpu_hours", "cost"]).reset_index(drop=True))
