"""Budgets per team and ledger period, the period-end forecast, and the conditions that raise alerts.

A team's budget is USD per ledger period (`[ledger] period`: a month by default), from `[budgets]` in the config
or, over it, from `PUT /v1/budgets/{team}`. The spend is the team's cost so far in the period at the rate card in
force at each hour. The forecast adds, for each hour left in the period, the team's mean cost at that hour of the
week over the last seven days (its run rate, with the week's shape: nights, weekends); an hour of the week the
history does not cover takes the team's mean hourly cost instead. With less than a day of history there is no
forecast (null, and the basis says why): a guess is not a number a team can act on.

Alert conditions (analytics only: the server raises, resolves and delivers them, deploy/alerting.py):
- `budget spend`: the spend crossed `[alerts] warn_at` or `alert_at` of the budget (one per threshold and period);
- `budget forecast`: the forecast crossed one of them (resolved when it falls back under);
- `idle job`: a job has held GPUs idle (under `[waste] idle_util_pct`) for `[alerts] idle_hours`, up to now.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from gpuledger.analytics.config import Config, WasteConfig
from gpuledger.analytics.cost import PRICED
from gpuledger.analytics.ledger import period_of
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.alerts import stored_budgets
from gpuledger.analytics.store.gpu_inventory import held_conditions
from gpuledger.analytics.waste import job_stretches, idle_runs
from gpuledger.analytics.windows import as_utc
from gpuledger.collector.samples import UNATTRIBUTED

ALERT_KINDS = ("budget spend", "budget forecast", "idle job", "gpu held", "more alerts")
SPEND, FORECAST, IDLE_JOB, GPU_HELD, MORE = ALERT_KINDS
# the most alerts of one kind one team gets at once: past it, the rest are one alert that lists them (one push that
# attached idle GPUs to a team's job raised 32 "idle job" alerts, and mail to the team queued behind them)
MAX_PER_TEAM_AND_KIND = 10
CLUSTER = ""  # the team of an alert about the cluster itself (a GPU held from a node): for the admins
HISTORY = timedelta(days=7)
MIN_HISTORY_HOURS = 24
ONGOING = timedelta(minutes=15)  # an idle stretch ending this close to now is still going on


def budgets_in_force(store: Store, config: Config) -> dict[str, tuple[float, str]]:
    """team -> (USD per period, where it comes from: config, or who set it through the API)."""
    found = {team: (usd, "config") for team, usd in config.budgets.items()}
    for row in stored_budgets(store).itertuples(index=False):
        found[row.team] = (float(row.usd), f"API, set by {row.set_by}")
    return found


def _hourly_costs(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Per UTC hour of [start, end) and owner: the cost of what was allocated; and the hours with any sample."""
    sql = f"""SELECT utc_hour(bucket) AS hour, CASE WHEN allocated THEN owner(team, $unattributed) END AS team,
                     sum(cost_usd) AS cost
              FROM {PRICED} GROUP BY ALL"""
    return store.query_usage(sql, {"start": start, "end": end, "unattributed": UNATTRIBUTED})


def _forecast(history: pd.DataFrame, covered: set[pd.Timestamp], team: str, spend: float, now: datetime,
              end: datetime) -> tuple[float | None, str]:
    """The period-end forecast of one team and what it rests on."""
    if len(covered) < MIN_HISTORY_HOURS:
        return None, f"no forecast: {len(covered)} hour(s) of history, under {MIN_HISTORY_HOURS}"
    mine = history[history["team"] == team].groupby("hour")["cost"].sum()
    per_hour = {h: float(mine.get(h, 0.0)) for h in covered}  # a covered hour without this team's use cost 0
    slots: dict[tuple[int, int], list[float]] = {}
    for hour, cost in per_hour.items():
        slots.setdefault((hour.weekday(), hour.hour), []).append(cost)
    mean = sum(per_hour.values()) / len(per_hour)
    rest, hour = 0.0, now.replace(minute=0, second=0, microsecond=0)
    left_now = 1.0 - (now - hour).total_seconds() / 3600.0  # what is left of the hour in progress
    while hour < end:
        values = slots.get((hour.weekday(), hour.hour))
        rest += (sum(values) / len(values) if values else mean) * (left_now if hour <= now else 1.0)
        hour += timedelta(hours=1)
    return spend + rest, (f"spend so far plus, for each hour left, the mean cost at that hour of the week over the "
                          f"last {len(covered)} covered hours")


def budget_status(store: Store, config: Config, now: datetime) -> list[dict[str, Any]]:
    """Per team with a budget, for the ledger period holding `now`: budget, where it comes from, spend, forecast
    (null without a day of history) and its basis, and both as shares of the budget."""
    now = as_utc(now)
    period = period_of(now, config.ledger.period)
    budgets = budgets_in_force(store, config)
    if not budgets:
        return []
    history = _hourly_costs(store, now - HISTORY, now)
    covered = {pd.Timestamp(h) for h in history["hour"].unique()}
    spent = _hourly_costs(store, period.start, now)
    spend_by_team = spent[spent["team"].notna()].groupby("team")["cost"].sum()
    out = []
    for team, (usd, source) in sorted(budgets.items()):
        spend = float(spend_by_team.get(team, 0.0))
        forecast, basis = _forecast(history, covered, team, spend, now, period.end)
        out.append({"team": team, "period": period.name, "period_end": period.end, "budget_usd": usd,
                    "source": source, "spend_usd": round(spend, 2),
                    "forecast_usd": round(forecast, 2) if forecast is not None else None, "forecast_basis": basis,
                    "spend_share": spend / usd, "forecast_share": forecast / usd if forecast is not None else None})
    return out


def _crossed(share: float | None, config: Config) -> list[float]:
    return [t for t in (config.alerts.warn_at, config.alerts.alert_at) if share is not None and share >= t]


def conditions(store: Store, config: Config, now: datetime) -> list[dict[str, Any]]:
    """Every alert condition holding at `now`: key, kind, team, subject (one line) and detail (the evidence)."""
    found = []
    for row in budget_status(store, config, now):
        for kind, share, figure in ((SPEND, row["spend_share"], row["spend_usd"]),
                                    (FORECAST, row["forecast_share"], row["forecast_usd"])):
            for threshold in set(_crossed(share, config)):
                what = "spent" if kind == SPEND else "is forecast to spend"
                found.append({
                    "key": f"{kind}:{row['team']}:{row['period']}:{threshold:g}", "kind": kind, "team": row["team"],
                    "subject": f"{row['team']} {what} ${figure:,.2f} of its ${row['budget_usd']:,.2f} budget for "
                               f"{row['period']} ({share:.0%}, threshold {threshold:.0%})",
                    "detail": {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}
                    | {"threshold": threshold}})
    found += idle_conditions(store, config.waste, config.alerts.idle_hours, now)
    found += [{**c, "kind": GPU_HELD, "team": CLUSTER} for c in held_conditions(store, now)]
    return capped(found)


def capped(found: list[dict[str, Any]], most: int = MAX_PER_TEAM_AND_KIND) -> list[dict[str, Any]]:
    """At most `most` alerts per team and kind: the first `most - 1` as they are, the rest as one alert naming
    how many and which (its key is stable while they hold, so it fires once, not at every check)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for condition in found:
        groups.setdefault((condition["team"], condition["kind"]), []).append(condition)
    out: list[dict[str, Any]] = []
    for (team, kind), items in groups.items():
        if len(items) <= most:
            out += items
            continue
        out += items[:most - 1]
        rest = items[most - 1:]
        out.append({"key": f"{MORE}:{kind}:{team}", "kind": MORE, "team": team,
                    "subject": f"{len(rest)} more '{kind}' alerts for {team or 'the cluster'} (the first "
                               f"{most - 1} are alerts of their own)",
                    "detail": {"kind": kind, "count": len(rest), "subjects": [c["subject"] for c in rest[:50]]}})
    return out


def idle_conditions(store: Store, waste: WasteConfig, idle_hours: float, now: datetime) -> list[dict[str, Any]]:
    """Jobs holding GPUs idle for `idle_hours` up to now (a stretch still going on)."""
    start = now - timedelta(hours=idle_hours) - timedelta(hours=1)
    runs = idle_runs(store, start, now, waste)
    if runs.empty:
        return []
    found = []
    for row in job_stretches(runs).to_dict(orient="records"):
        end = pd.Timestamp(row["end_ts"])
        if pd.isna(row.get("job_id")) or row["idle_minutes"] < idle_hours * 60 or end < pd.Timestamp(now) - ONGOING:
            continue
        found.append({
            "key": f"{IDLE_JOB}:{row['job_id']}", "kind": IDLE_JOB, "team": row["team"],
            "subject": f"job {row['job_id']} of {row['team']} has held {row.get('gpus', 1):g} GPU(s) idle for "
                       f"{row['idle_minutes'] / 60:.1f} h (under {waste.idle_util_pct:g}% utilisation), "
                       f"${row['idle_cost_usd']:,.2f} so far",
            "detail": {"job_id": row["job_id"], "idle_minutes": float(row["idle_minutes"]),
                       "idle_cost_usd": float(row["idle_cost_usd"]),
                       "since": pd.Timestamp(row["start_ts"]).isoformat()}})
    return found
