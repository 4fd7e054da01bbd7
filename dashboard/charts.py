"""What the dashboard's charts and tables are drawn from, kept apart from Streamlit so each is testable: the one
team -> colour map, the daily cost bars (partial days labelled), the per-model series (gaps stay gaps), the GPU
heatmap (each cell its bucket's span), advice in words, and tables with readable cells."""
from __future__ import annotations

import zlib
from typing import Any, Iterable

import pandas as pd

from gpuledger.collector.samples import IDLE_CAPACITY, UNATTRIBUTED, owner_label

# Tableau 10: a team's colour is its place in the sorted team list, the same on every page and chart
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
           "#79706e")
# the bill's own lines are greys, never a team's colour
SHARED_COLOURS = {owner_label(IDLE_CAPACITY): "#c7c7c7", owner_label(UNATTRIBUTED): "#a0a0a0"}
BLANK = "—"


def team_colours(teams: Iterable[str]) -> dict[str, str]:
    """Shown team name -> colour: the sorted list of teams takes the palette in order (the bill's shared lines are
    grey), so a team has one colour on every page."""
    named = sorted({owner_label(t) for t in teams} - set(SHARED_COLOURS))
    colours = {name: PALETTE[k % len(PALETTE)] for k, name in enumerate(named)}
    return {**colours, **SHARED_COLOURS}


def colour_of(colours: dict[str, str], team: str) -> str:
    """A team's colour; one the list did not name (it appeared since) gets a stable one from its name."""
    return colours.get(team) or PALETTE[zlib.crc32(team.encode()) % len(PALETTE)]


def colour_scale(colours: dict[str, str], teams: Iterable[str]) -> dict[str, list[str]]:
    """A vega-lite colour scale for these teams, from the one mapping."""
    domain = sorted(set(teams), key=lambda t: (t in SHARED_COLOURS, t))
    return {"domain": domain, "range": [colour_of(colours, t) for t in domain]}


def team_bar_spec(value: str, title: str, colours: dict[str, str], teams: Iterable[str]) -> dict:
    """A vega-lite bar per team of `value`, each in its team's colour (the one mapping every chart uses)."""
    return {
        "mark": {"type": "bar", "tooltip": True},
        "encoding": {
            "x": {"field": "team", "type": "nominal", "title": None, "sort": "-y", "axis": {"labelAngle": 0}},
            "y": {"field": value, "type": "quantitative", "title": title},
            "color": {"field": "team", "type": "nominal", "legend": None, "scale": colour_scale(colours, teams)},
        },
    }


def daily_bars(daily: pd.DataFrame, start: pd.Timestamp, end: pd.Timestamp,
               covered: pd.Series | None = None, bucket_minutes: int = 60) -> pd.DataFrame:
    """/v1/costs/daily's rows (day, team, cost_usd) with the part of each UTC day they stand for: the day within the
    window [start, end) and, given `covered` (the starts of the utilisation buckets that hold data, each
    `bucket_minutes` long), within the data. `hours` is how many hours that is; `label` names a whole day by its
    date and a partial one (the window's or the history's first day, today) by the hours it holds, so a partial
    day never reads as a whole one."""
    out = daily.copy()
    out["team"] = out["team"].map(owner_label)
    out["day"] = out["day"].dt.tz_convert("UTC")
    spans = {}
    for day in out["day"].unique():
        since, until = max(day, start), min(day + pd.Timedelta(days=1), end)
        hours = max((until - since).total_seconds(), 0.0) / 3600.0
        if covered is not None and len(covered):
            step = pd.Timedelta(minutes=bucket_minutes)
            pieces = [(max(b, since), min(b + step, until)) for b in pd.DatetimeIndex(covered)
                      if b < until and b + step > since]
            if pieces:
                since, until = min(a for a, _ in pieces), max(z for _, z in pieces)
                hours = sum((z - a).total_seconds() for a, z in pieces) / 3600.0
        spans[day] = (since, until, round(hours, 1))
    out["hours"] = out["day"].map(lambda d: spans[d][2])
    out["partial"] = out["hours"] < 24.0

    def label(d: pd.Timestamp) -> str:
        since, until, hours = spans[d]
        if hours >= 24.0:
            return f"{d:%a %b %d}"
        to = "24:00" if until == d + pd.Timedelta(days=1) else f"{until:%H:%M}"
        return f"{d:%b %d} · {since:%H:%M}–{to} · (partial)"  # three lines under its bar

    out["label"] = out["day"].map(label)
    out["cost_usd"] = out["cost_usd"].round(2)
    return out.sort_values(["day", "team"]).reset_index(drop=True)


def daily_spec(bars: pd.DataFrame, colours: dict[str, str]) -> dict:
    """Stacked bars per day and team; partial days are lighter and say so in their label."""
    order = bars.drop_duplicates("label").sort_values("day")["label"].tolist()
    return {
        "mark": {"type": "bar", "tooltip": True},
        "encoding": {
            "x": {"field": "label", "type": "ordinal", "sort": order, "title": None,
                  "axis": {"labelAngle": 0, "labelLimit": 400, "labelOverlap": False,
                           "labelExpr": "split(datum.label, ' · ')"}},
            "y": {"field": "cost_usd", "type": "quantitative", "title": "USD", "stack": "zero"},
            "color": {"field": "team", "type": "nominal", "title": "team",
                      "scale": colour_scale(colours, bars["team"].unique())},
            "opacity": {"condition": {"test": "datum.partial", "value": 0.45}, "value": 1.0},
            "tooltip": [{"field": "label", "title": "day"}, {"field": "team"},
                        {"field": "cost_usd", "title": "USD", "format": ",.2f"},
                        {"field": "hours", "title": "hours in the window"}],
        },
    }


def model_gaps(per_model: pd.DataFrame, covered: pd.Series, start: pd.Timestamp, end: pd.Timestamp,
               bucket_minutes: int) -> pd.DataFrame:
    """One GPU model's allocated GPUs on the window's whole bucket grid: the API's value where it has one, 0 where
    the cluster reported (`covered`: the buckets of the team's series) and the API's model series left the bucket
    out (it lists buckets with usage only), and nothing (NaN: a gap, never a line) where no data came at all.
    `segment` numbers the runs between gaps, so a line drawn per segment never bridges one."""
    step = pd.Timedelta(minutes=bucket_minutes)
    first = start.floor(f"{bucket_minutes}min")
    grid = pd.date_range(first, end - pd.Timedelta(microseconds=1), freq=step, tz="UTC", name="bucket")
    values = per_model.set_index("bucket")["allocated_gpus"] if not per_model.empty else pd.Series(dtype=float)
    out = pd.DataFrame(index=grid)
    out["allocated_gpus"] = values.reindex(grid)
    reported = grid.isin(pd.DatetimeIndex(covered))
    out.loc[reported & out["allocated_gpus"].isna(), "allocated_gpus"] = 0.0
    gap = out["allocated_gpus"].isna()
    out["segment"] = gap.cumsum().where(~gap)
    return out.reset_index()


def model_spec(model: str, quota: dict[str, float]) -> dict:
    """Allocated GPUs of one model, a line per run of reported buckets, and the quota's guarantee and limit as
    rules."""
    layers: list[dict[str, Any]] = [{
        "mark": {"type": "line", "point": {"size": 12}},
        "encoding": {"x": {"field": "bucket", "type": "temporal", "title": None, "axis": {"format": "%b %d %H:%M"}},
                     "y": {"field": "allocated_gpus", "type": "quantitative", "title": f"{model} GPUs allocated"},
                     "detail": {"field": "segment", "type": "nominal"}},
    }]
    for (name, value), colour in zip(quota.items(), ("#54a24b", "#e45756")):
        layers.append({"mark": {"type": "rule", "color": colour, "strokeDash": [4, 3]},
                       "encoding": {"y": {"datum": value}}})
        layers.append({"mark": {"type": "text", "align": "left", "dx": 4, "dy": -6, "color": colour},
                       "encoding": {"y": {"datum": value}, "x": {"value": 0}, "text": {"value": f"{name} {value:g}"}}})
    return {"layer": layers}


def heatmap(points: pd.DataFrame, shown: str, bucket_minutes: int) -> pd.DataFrame:
    """/v1/gpus series rows as heatmap cells: each GPU's bucket from its start (`bucket`) to its end (`bucket_end`,
    `bucket_minutes` later), so every cell covers its own bucket and nothing else."""
    cells = points.dropna(subset=[shown]).copy()
    cells["gpu"] = cells["node"] + " / " + cells["gpu_uuid"].str[:12]
    end = cells["bucket"] + pd.Timedelta(minutes=bucket_minutes)
    cells["bucket_end"] = end.dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    cells["bucket"] = cells["bucket"].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    fraction = cells[shown].abs().max() <= 1.0 if len(cells) else False  # a 0..1 reading keeps its precision
    cells[shown] = cells[shown].round(3 if fraction else 1)
    return cells[["bucket", "bucket_end", "gpu", shown]].reset_index(drop=True)


def heatmap_spec(shown: str, title: str) -> dict:
    return {
        "mark": {"type": "rect", "tooltip": True},
        "encoding": {
            "x": {"field": "bucket", "type": "temporal", "title": None, "axis": {"format": "%b %d %H:%M"}},
            "x2": {"field": "bucket_end"},
            "y": {"field": "gpu", "type": "nominal", "title": None, "sort": None, "axis": {"labelLimit": 260}},
            "color": {"field": shown, "type": "quantitative", "title": title},
            "tooltip": [{"field": "gpu"}, {"field": "bucket", "type": "temporal", "format": "%b %d %H:%M",
                                           "title": "from"},
                        {"field": "bucket_end", "type": "temporal", "format": "%H:%M", "title": "to"},
                        {"field": shown, "title": title}],
        },
    }


def _words(value: Any) -> str:
    """An action's or evidence's value as plain words: numbers rounded, lists and mappings spelled out, none as
    the blank mark."""
    if value is None:
        return BLANK
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.2f}".rstrip("0").rstrip(".") if abs(value) < 1e6 else f"{value:,.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_words(v)}" for k, v in value.items()) or BLANK
    if isinstance(value, (list, tuple)):
        return ", ".join(_words(v) for v in value) or BLANK
    return str(value)


def words(value: Any) -> str:
    return _words(value)


def change(kind: str, action: dict[str, Any]) -> str:
    """What the advice changes, in words, for every kind of advice (policies/recommendation.py KINDS); a shape the
    dashboard does not know yet is spelled out field by field."""
    a = action.get
    if kind == "quota" and "guarantee_gpus" in action:
        was = a("current_guarantee_gpus")
        return (f"guarantee {'none' if was is None else _words(was)} → {_words(a('guarantee_gpus'))}, "
                f"limit {_words(a('limit_gpus'))}")
    if kind == "reclaim" and "gpus" in action:
        return f"give back {_words(a('gpus'))} GPU(s) held idle on {_words(a('node'))}"
    if kind == "resize" and "move_to" in action:
        return f"{_words(a('gpus'))} × {_words(a('from'))} → {_words(a('move_to'))}"
    if kind == "consolidate" and "node" in action:
        moves = a("move") or []
        return (f"move {len(moves)} job(s) off {_words(a('node'))} to free {_words(a('frees_gpus'))} GPU(s): "
                + "; ".join(f"{_words(m.get('job_id'))} ({_words(m.get('gpus'))} GPU) → {_words(m.get('to_node'))}"
                            for m in moves if isinstance(m, dict)))
    if kind == "colocate" and "node" in action:
        island = a("island")
        return (f"run all {_words(a('gpus'))} GPUs on {_words(a('node'))}"
                + (f", inside NVLink island {_words(island)}" if island is not None else ""))
    if kind == "separate" and "from_gpu" in action:
        target = a("to_node")
        return (f"move off shared GPU {_words(a('from_gpu'))} on {_words(a('node'))} → "
                + (f"a GPU of its own on {_words(target)}" if target else "no free GPU now"))
    if kind == "efficiency" and "bottleneck" in action:
        return f"{_words(str(a('bottleneck')).replace('_', ' '))}: {_words(a('do'))}"
    return "; ".join(f"{k.replace('_', ' ')}: {_words(v)}" for k, v in action.items()) or BLANK


def alternative(alternatives: dict[str, Any] | None) -> str:
    """An advice's place among the advice it competes with, in words ("2 of 3 in alt-…, counted"); blank for
    advice in no group (quota advice)."""
    if not isinstance(alternatives, dict):
        return BLANK
    if alternatives.get("of", 1) <= 1:
        return "alone" + (", counted" if alternatives.get("counted") else "")
    return (f"{alternatives.get('rank')} of {alternatives.get('of')} in {alternatives.get('group')}"
            + (", counted" if alternatives.get("counted") else ""))


def readable(frame: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """A table as shown: empty text cells as the blank mark (each table says what a blank means), floats
    rounded."""
    out = frame.copy()
    for column in out.columns:
        series = out[column]
        if pd.api.types.is_float_dtype(series):
            out[column] = series.round(digits)
        elif pd.api.types.is_object_dtype(series) or pd.api.types.is_string_dtype(series):
            out[column] = series.map(lambda v: BLANK if v is None or (isinstance(v, float) and pd.isna(v)) else v)
    return out
