"""Demand forecast per GPU model: the trend of the GPU-hours the teams kept busy plus those their jobs waited for,
week by week, and how many weeks at that growth until the model's GPUs are all in use. What the monthly capacity
review (`gpuledger capacity`, GET /v1/capacity/forecast, the dashboard's What-if page) reads to decide what to buy
before the queues say so.

Per model and week (whole weeks ending at the last whole hour before the instant asked, so a week is a run of the
rollups' clock hours): busy GPU-hours (allocated, with a utilisation reading at or over [waste] idle_util_pct:
analytics/usage.py hourly_demand) plus queued GPU-hours (jobs waiting for that model, from the schedulers' job
records: analytics/workloads.py waiting_demand; a job that named no model waits for its team's most used model, as
the quota advice counts it). Capacity is the model's GPUs present at the end (capacity_by_model) x 168 hours.

Unknown is never zero, so the basis can change and says so (`basis`, `basis_reason`):
- a model whose allocated GPU-hours have no utilisation reading (or readings on under MIN_COVERAGE of them in a
  fitted week) has no busy figure to trust: its demand is the GPU-hours allocated (busy's upper bound);
- without any job record in the window the queue is unknown: demand is use alone, and the answer says so.

The trend is a least-squares line through the whole weeks only (samples of the model in at least MIN_COVERAGE of
the week's hours): a history that starts mid-week, or a collector that was down, would otherwise read as growth.
Its slope has a standard error, and the 80% interval of the slope (Student's t with n - 2 degrees of freedom: with
three weeks the normal quantile would make the interval 2.4 times too narrow) gives the range of the weeks to
saturation. Fewer than MIN_WEEKS whole weeks is `insufficient_data` with the reason, never a guessed trend.
"""
from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.analytics.usage import capacity_by_model, covered_hours, hourly_demand
from gpuledger.analytics.windows import as_utc, utc_now
from gpuledger.analytics.workloads import first_job_record, job_records_between, waiting_demand
from gpuledger.collector.errors import InputError
from gpuledger.collector.gpu_catalog import UNKNOWN_MODEL

WEEK = timedelta(days=7)
HOURS_PER_WEEK = 168
DEFAULT_WEEKS = 8  # two months: the monthly review sees the month before the last as well
MAX_WEEKS = 104
MIN_WEEKS = 3  # a line through two points has no error estimate: the range would be invented
MIN_COVERAGE = 0.9  # of a week's hours with samples of the model (and of its allocated GPU-hours with a reading)
STATUSES = ("forecast", "saturated", "not_saturating", "insufficient_data")
BASES = ("busy + queued", "allocated + queued", "busy only", "allocated only")
FAR_WEEKS = 5200.0  # a century: no date is given beyond it (a near-flat trend divides by almost nothing)
# Student's t, 0.90 quantile (the two-sided 80% interval), by degrees of freedom; beyond the table the normal's
_T80 = {1: 3.078, 2: 1.886, 3: 1.638, 4: 1.533, 5: 1.476, 6: 1.440, 7: 1.415, 8: 1.397, 9: 1.383, 10: 1.372,
        11: 1.363, 12: 1.356, 13: 1.350, 14: 1.345, 15: 1.341, 16: 1.337, 17: 1.333, 18: 1.330, 19: 1.328,
        20: 1.325, 25: 1.316, 30: 1.310, 40: 1.303, 60: 1.296, 120: 1.289}
Z80 = 1.2816


def t80(dof: int) -> float:
    """The 0.90 quantile of Student's t with `dof` degrees of freedom: the tabulated one at or below `dof` (a
    slightly wider interval between table rows, never a narrower one), the normal's past the table."""
    if dof > max(_T80):
        return Z80
    return _T80[max(d for d in _T80 if d <= max(dof, 1))]


def forecast_window(end: datetime, weeks: int) -> tuple[datetime, datetime]:
    """[start, end) of `weeks` whole weeks ending at the last whole hour at or before `end`: the rollups count
    clock hours, so a week that cut an hour would share it with its neighbour."""
    if not MIN_WEEKS <= weeks <= MAX_WEEKS:
        raise InputError(f"a forecast fits {MIN_WEEKS} to {MAX_WEEKS} weeks, not {weeks}")
    stop = as_utc(end).replace(minute=0, second=0, microsecond=0)
    return stop - weeks * WEEK, stop


def _week_of(instants: pd.Series, start: datetime) -> pd.Series:
    """The week index (0: the oldest) of each instant, counted from `start`."""
    return ((pd.to_datetime(instants, utc=True) - pd.Timestamp(start)) // pd.Timedelta(WEEK)).astype(int)


def weekly_demand(store: Store, start: datetime, end: datetime, idle_util_pct: float) -> tuple[pd.DataFrame, dict]:
    """Per GPU model seen and week of [start, end) (whole weeks; 0 the oldest): the hours with a sample of the model
    (`covered_hours`), GPU-hours allocated, allocated with a utilisation reading (`measured`), busy (measured and
    at or over `idle_util_pct`) and queued. With it, what the queue figures rest on: `queue_known` (any job record
    in the window), `unplaced_queued` (GPU-hours of jobs naming no model from teams that held no GPU, so in no
    model's demand) and `any_queued` (those counted for their team's most used model)."""
    weeks = round((end - start) / WEEK)
    columns = ["covered_hours", "allocated", "measured", "busy", "queued"]
    grid: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: dict.fromkeys(columns, 0.0))

    hourly = hourly_demand(store, start, end, idle_util_pct)
    home: dict[str, str] = {}
    if len(hourly):
        hourly["gpu_model"] = hourly["gpu_model"].fillna(UNKNOWN_MODEL)  # as capacity_by_model names it
        hourly["week"] = _week_of(hourly["hour"], start)
        hourly = hourly[(hourly["week"] >= 0) & (hourly["week"] < weeks)].copy()
        hourly["busy"] = (hourly["measured_gpus"] - hourly["idle_gpus"]).clip(lower=0)
        sums = hourly.groupby(["gpu_model", "week"])[["allocated_gpus", "measured_gpus", "busy"]].sum()
        for (model, week), row in sums.iterrows():
            cell = grid[(str(model), int(week))]
            cell.update(allocated=float(row["allocated_gpus"]), measured=float(row["measured_gpus"]),
                        busy=float(row["busy"]))
        held = hourly.groupby(["team", "gpu_model"])["allocated_gpus"].sum().reset_index()
        for team, rows in held.groupby("team"):
            best = rows.sort_values(["allocated_gpus", "gpu_model"], ascending=[False, True]).iloc[0]
            home[str(team)] = str(best["gpu_model"])

    covered = covered_hours(store, start, end)
    for model, hours in zip(covered["gpu_model"], covered["hours"]):
        if hours is None or not len(hours):
            continue
        per_week = _week_of(pd.Series(list(hours)), start).value_counts()
        for week, count in per_week.items():
            if 0 <= int(week) < weeks:
                grid[(str(model) if model is not None else UNKNOWN_MODEL, int(week))]["covered_hours"] += float(count)

    queue_known = job_records_between(store, start, end) > 0
    unplaced = any_queued = 0.0
    queue_weeks: set[int] = set()  # the weeks from the first job record on: only their queue is known
    first = first_job_record(store) if queue_known else None
    if queue_known:
        at = min(end, utc_now())  # a job still open waits until now, or until the end asked if that is earlier
        for week in range(weeks):
            lo = start + week * WEEK
            if first is None or lo + WEEK <= first:
                continue  # before the first job record: no scheduler's records were loaded, the queue is unknown
            queue_weeks.add(week)
            waits = waiting_demand(store, lo, lo + WEEK, at)
            for team, model, hours in zip(waits["team"], waits["gpu_model"], waits["waiting_gpu_hours"]):
                if model == "any":
                    any_queued += float(hours)
                    if str(team) not in home:
                        unplaced += float(hours)
                        continue
                    model = home[str(team)]
                grid[(str(model), week)]["queued"] += float(hours)

    rows = [{"gpu_model": model, "week": week, **cell} for (model, week), cell in grid.items()]
    frame = pd.DataFrame(rows, columns=["gpu_model", "week", *columns])
    return (frame.sort_values(["gpu_model", "week"]).reset_index(drop=True),
            {"queue_known": queue_known, "unplaced_queued": unplaced, "any_queued": any_queued,
             "queue_weeks": frozenset(queue_weeks)})


def _weeks_to(capacity: float, level: float, growth: float) -> float | None:
    """Weeks until `level` grows to `capacity` at `growth` a week: 0 when it is there already, None (never, at this
    trend) when it does not grow."""
    if level >= capacity:
        return 0.0
    return (capacity - level) / growth if growth > 0 else None


def _basis(model: str, fitted: pd.DataFrame, queue_known: bool) -> tuple[str, str | None, bool]:
    """(basis, why, busy?): busy + queued where every fitted week's allocated GPU-hours were measured enough to
    trust busy, else allocated; `only` where the queue is unknown."""
    allocated = fitted["allocated"]
    shares = (fitted["measured"] / allocated.where(allocated > 0)).dropna()
    reasons = []
    use_busy = bool((shares >= MIN_COVERAGE).all())
    if not use_busy:
        if float(fitted["measured"].sum()) <= 0:
            reasons.append(f"no utilisation reading for {model}: its busy GPU-hours are unknown, so demand counts "
                           "every GPU-hour allocated (busy's upper bound)")
        else:
            reasons.append(f"utilisation readings cover only {float(shares.min()):.0%} of the {model} GPU-hours "
                           f"allocated in a fitted week (under {MIN_COVERAGE:.0%}): busy would move with the "
                           "readings, not the work, so demand counts every GPU-hour allocated")
    if not queue_known:
        reasons.append("no scheduler job record in the window: queued demand is unknown and not counted (the trend "
                       "is of use alone; load job records with `gpuledger import` or a job source)")
    use = "busy" if use_busy else "allocated"
    basis = f"{use} + queued" if queue_known else f"{use} only"
    return basis, "; ".join(reasons) or None, use_busy


def _series(mine: pd.DataFrame, start: datetime, weeks: int, use_busy: bool, queue_known: bool,
            queue_weeks: frozenset[int] | None = None) -> list[dict]:
    """The window's weeks, oldest first, with what is known of each: a week without any sample of the model has
    no use figure (null), a week without job records no queue figure; `fitted`: whole, so in the trend."""
    by_week = mine.set_index("week")
    out = []
    for week in range(weeks):
        cell = by_week.loc[week] if week in by_week.index else None
        covered = float(cell["covered_hours"]) if cell is not None else 0.0
        seen = covered > 0
        allocated = float(cell["allocated"]) if cell is not None else 0.0
        measured = float(cell["measured"]) if cell is not None else 0.0
        busy = float(cell["busy"]) if cell is not None and (measured > 0 or allocated <= 0) else None
        known = queue_known and (queue_weeks is None or week in queue_weeks)
        queued = (float(cell["queued"]) if cell is not None else 0.0) if known else None
        use = (busy if use_busy else allocated) if seen else None
        out.append({"week_start": start + week * WEEK, "week_end": start + (week + 1) * WEEK,
                    "covered_hours": covered, "fitted": covered >= MIN_COVERAGE * HOURS_PER_WEEK,
                    "allocated_gpu_hours": allocated if seen else None, "busy_gpu_hours": busy if seen else None,
                    "util_coverage": min(1.0, measured / allocated) if allocated > 0 else None,
                    "queued_gpu_hours": queued,
                    "demand_gpu_hours": None if use is None else use + (queued or 0.0)})
    return out


def model_forecast(model: str, gpus: float, mine: pd.DataFrame, start: datetime, end: datetime, weeks: int,
                   queue_known: bool, queue_weeks: frozenset[int] | None = None) -> dict[str, Any]:
    """One model's weekly demand, its trend and the weeks until it fills `gpus` GPUs (see the module's doc)."""
    capacity = gpus * HOURS_PER_WEEK
    fitted = mine[mine["covered_hours"] >= MIN_COVERAGE * HOURS_PER_WEEK]
    basis, why, use_busy = _basis(model, fitted, queue_known)
    series = _series(mine, start, weeks, use_busy, queue_known, queue_weeks)
    points = [(float((s["week_start"] - start) / WEEK), s["demand_gpu_hours"]) for s in series if s["fitted"]]
    row: dict[str, Any] = {
        "gpu_model": model, "gpus": gpus, "capacity_gpu_hours_per_week": capacity, "basis": basis,
        "basis_reason": why, "whole_weeks": len(points), "demand_now_gpu_hours_per_week": None,
        "utilisation_now": None, "growth_gpu_hours_per_week": None, "growth_stderr": None, "growth_80_low": None,
        "growth_80_high": None, "weeks_to_saturation": None, "weeks_to_saturation_80_low": None,
        "weeks_to_saturation_80_high": None, "saturates_around": None, "weeks": series}
    # an observation, not a trend: said whatever the status (a queue that outgrew the GPUs is the news)
    over = (f"; the last whole week's demand, {points[-1][1]:,.0f} GPU-hours, was already at or over the capacity "
            f"({capacity:,.0f}): busy plus queued asked more than the GPUs give" if points and
            points[-1][1] >= capacity else "")
    if len(points) < MIN_WEEKS:
        partial = sum(1 for s in series if s["covered_hours"] > 0 and not s["fitted"])
        return {**row, "status": "insufficient_data",
                "reason": f"{len(points)} whole week(s) of {model} samples in the {weeks} weeks to "
                          f"{end:%Y-%m-%d %H:%M} UTC ({partial} more partly covered; a week counts when samples "
                          f"cover {MIN_COVERAGE:.0%} of its {HOURS_PER_WEEK} hours): a trend needs at least "
                          f"{MIN_WEEKS}, so there is no forecast yet{over}"}
    x = [p[0] for p in points]
    y = [p[1] for p in points]
    n = len(points)
    x_mean, y_mean = sum(x) / n, sum(y) / n
    sxx = sum((v - x_mean) ** 2 for v in x)
    slope = sum((a - x_mean) * (b - y_mean) for a, b in zip(x, y)) / sxx
    intercept = y_mean - slope * x_mean
    residual = sum((b - (intercept + slope * a)) ** 2 for a, b in zip(x, y))
    stderr = math.sqrt(residual / (n - 2) / sxx)
    spread = t80(n - 2) * stderr
    low, high = slope - spread, slope + spread
    level = intercept + slope * (weeks - 1)  # the trend's demand in the window's last week
    row.update({"demand_now_gpu_hours_per_week": level, "utilisation_now": level / capacity if capacity else None,
                "growth_gpu_hours_per_week": slope, "growth_stderr": stderr, "growth_80_low": low,
                "growth_80_high": high})
    trend = (f"demand {level:,.0f} GPU-hours a week on the trend now, of {capacity:,.0f} the {gpus:g} GPUs give, "
             f"growing {slope:+,.1f} a week (80%: {low:+,.1f} to {high:+,.1f}) over {n} whole weeks")
    if level >= capacity:
        return {**row, "status": "saturated", "weeks_to_saturation": 0.0, "weeks_to_saturation_80_low": 0.0,
                "weeks_to_saturation_80_high": 0.0, "saturates_around": end,
                "reason": f"already saturated: {trend}"}
    soonest, latest = _weeks_to(capacity, level, high), _weeks_to(capacity, level, low)
    row.update({"weeks_to_saturation_80_low": soonest, "weeks_to_saturation_80_high": latest})
    if slope <= 0:
        could = (f"; at the top of the 80% range it would saturate in {soonest:,.1f} weeks"
                 if soonest is not None else "")
        return {**row, "status": "not_saturating",
                "reason": f"not saturating at the current trend (flat or falling): {trend}{could}{over}"}
    weeks_to = (capacity - level) / slope
    row.update({"weeks_to_saturation": weeks_to,
                "saturates_around": end + weeks_to * WEEK if weeks_to < FAR_WEEKS else None})
    bound = (f"{soonest:,.1f} to {latest:,.1f} weeks" if latest is not None else
             f"{soonest:,.1f} weeks or never (at the low end of the range demand does not grow)")
    return {**row, "status": "forecast",
            "reason": f"saturates in {weeks_to:,.1f} weeks (80%: {bound}) at the current growth: {trend}{over}"}


def demand_forecast(store: Store, end: datetime, weeks: int = DEFAULT_WEEKS,
                    idle_util_pct: float | None = None) -> dict[str, Any]:
    """Per GPU model present at `end`: the weekly demand of the `weeks` whole weeks before it, its trend with its
    uncertainty and the weeks until it fills the model's GPUs; with the notes a capacity review needs (demand for
    models no longer present, queued hours no model could take). `idle_util_pct`: [waste] idle_util_pct (default:
    the threshold the rollups were built with)."""
    start, stop = forecast_window(end, weeks)
    idle = store.idle_util_pct if idle_util_pct is None else idle_util_pct
    capacity = capacity_by_model(store, stop)
    gpus = {str(m): float(g) for m, g in zip(capacity["gpu_model"], capacity["gpus"]) if float(g) > 0}
    weekly, queue = weekly_demand(store, start, stop, idle)
    columns = list(weekly.columns)
    models = [model_forecast(model, gpus[model], weekly[weekly["gpu_model"] == model] if len(weekly)
                             else pd.DataFrame(columns=columns), start, stop, weeks, queue["queue_known"],
                             queue["queue_weeks"])
              for model in sorted(gpus)]
    notes = []
    gone = weekly[~weekly["gpu_model"].isin(list(gpus))].groupby("gpu_model")[["allocated", "queued"]].sum()
    for model, row in gone.iterrows():
        if row["allocated"] + row["queued"] > 0:
            notes.append(f"{model}: {row['allocated']:,.1f} GPU-hours allocated and {row['queued']:,.1f} queued in the "
                         "window, but no GPU of it present at its end: no capacity to forecast against")
    if queue["any_queued"] > 0:
        notes.append(f"{queue['any_queued']:,.1f} queued GPU-hours of jobs that named no GPU model count for their "
                     "team's most used model, as the quota advice counts them")
    if queue["unplaced_queued"] > 0:
        notes.append(f"{queue['unplaced_queued']:,.1f} of them, from teams that held no GPU in the window, are in no "
                     "model's demand")
    if not queue["queue_known"]:
        notes.append("no scheduler job record in the window: queued demand is unknown (not zero), so every trend "
                     "is of use alone and saturation may come sooner than shown")
    return {"start": start, "end": stop, "weeks": weeks, "min_weeks": MIN_WEEKS, "min_coverage": MIN_COVERAGE,
            "idle_util_pct": idle, "queue_known": queue["queue_known"], "models": models, "notes": notes}
