"""The weekly cost report teams receive: one HTML page for everyone and one CSV per team.

The CSVs are what finance imports (one line per GPU model, priced), the HTML is what a
team lead reads: cost, efficiency, idle waste and the recommendations that concern them.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.cost import cost_by_team, cost_by_team_and_model
from gpuledger.analytics.store import Store
from gpuledger.analytics.waste import idle_runs, waste_by_team
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.samples import IDLE_CAPACITY, owner_label


@dataclass
class ReportFiles:
    label: str
    html: Path
    summary_csv: Path
    team_csvs: dict[str, Path] = field(default_factory=dict)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "_"


def _table(frame: pd.DataFrame, money: tuple[str, ...] = (), hours: tuple[str, ...] = ()) -> str:
    if frame.empty:
        return "<p><em>No data in this window.</em></p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False):
        cells = []
        for col, value in zip(frame.columns, row):
            if col in money:
                text = f"${value:,.2f}"
            elif col in hours or isinstance(value, float):
                text = f"{value:,.1f}"
            elif col == "team":
                text = owner_label(str(value))
            else:
                text = str(value)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def write_weekly_report(store: Store, config: Config, out_dir: str | Path, start: datetime, end: datetime,
                        label: str, recommendations: list[dict] | None = None) -> ReportFiles:
    out = Path(out_dir) / label
    out.mkdir(parents=True, exist_ok=True)
    costs = cost_by_team(store, start, end)
    waste = waste_by_team(store, start, end, config.idle_minutes, config.idle_util_pct,
                          config.oversized_mem_fraction)
    summary = costs.merge(waste[["team", "idle_gpu_hours", "idle_cost_usd"]], on="team", how="left").fillna(
        {"idle_gpu_hours": 0.0, "idle_cost_usd": 0.0})
    summary["efficiency"] = (summary["used_gpu_hours"] / summary["gpu_hours"]).fillna(0.0)
    summary.insert(0, "week", label)
    files = ReportFiles(label=label, html=out / f"gpuledger-{label}.html", summary_csv=out / "summary.csv")
    summary.to_csv(files.summary_csv, index=False)
    by_model = cost_by_team_and_model(store, start, end)
    for team, frame in by_model.groupby("team"):
        path = out / f"team-{_safe(str(team))}.csv"
        frame.insert(0, "week", label)
        frame.to_csv(path, index=False)
        files.team_csvs[str(team)] = path
    top_idle = idle_runs(store, start, end, config.idle_minutes, config.idle_util_pct).head(15)
    total = float(summary["cost_usd"].sum())
    idle_line = summary[summary["team"] == IDLE_CAPACITY]
    idle_cost = float(idle_line["cost_usd"].sum()) if not idle_line.empty else 0.0
    now = utc_now()
    unfinished = (f" <strong>This week is not over</strong>: figures cover up to {now:%Y-%m-%d %H:%M} UTC."
                  if end > now else "")
    recs = pd.DataFrame(recommendations or [])
    rec_html = _table(recs[["kind", "team", "reason"]]) if not recs.empty else "<p><em>None.</em></p>"
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuledger weekly cost report {html.escape(label)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2rem;color:#222}}table{{border-collapse:collapse;margin:1rem 0}}
td,th{{border:1px solid #ccc;padding:.3rem .6rem;text-align:right}}th{{background:#f3f3f3}}
td:first-child,th:first-child{{text-align:left}}</style></head><body>
<h1>GPU cost report — week {html.escape(label)}</h1>
<p>{html.escape(start.strftime('%Y-%m-%d'))} to {html.escape(end.strftime('%Y-%m-%d'))} (UTC).{unfinished}
Total <strong>${total:,.2f}</strong>, of which idle cluster capacity <strong>${idle_cost:,.2f}</strong>.</p>
<h2>Cost per team</h2>
{_table(summary[["team", "gpu_hours", "used_gpu_hours", "efficiency", "cost_usd", "idle_gpu_hours",
                 "idle_cost_usd", "unpriced_gpu_hours"]], money=("cost_usd", "idle_cost_usd"))}
<h2>Largest idle allocations</h2>
{_table(top_idle[["team", "job_id", "node", "gpu_model", "idle_minutes", "idle_gpu_hours", "idle_cost_usd"]]
        if not top_idle.empty else top_idle, money=("idle_cost_usd",))}
<h2>Recommendations</h2>
{rec_html}
<p>Per-team CSV files sit next to this page. Rates: USD per GPU-hour from the site rate card.</p>
</body></html>"""
    files.html.write_text(page, encoding="utf-8")
    return files
