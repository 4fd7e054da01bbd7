"""The weekly cost report: one HTML page for admins, and per team its own page and CSV.

The CSVs are what finance imports (one line per GPU model, priced), the HTML is what a
team lead reads: cost, efficiency, idle waste and the recommendations that concern them.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.cost import cost_by_team, cost_by_team_and_model, daily_cost_by_team
from gpuledger.analytics.access_review import EXPIRING_DAYS, UNUSED_DAYS, access_review
from gpuledger.analytics.cost_split import cents_usd
from gpuledger.analytics.records import write_csv
from gpuledger.analytics.store import Store
from gpuledger.analytics.team_scope import redact_for_team
from gpuledger.analytics.usage import NO_UTILISATION, cluster_utilization, covered_hours
from gpuledger.analytics.waste import job_table, waste
from gpuledger.analytics.windows import utc_now
from gpuledger.analytics.efficiency import job_efficiency
from gpuledger.analytics.inference import service_table, team_inference
from gpuledger.analytics.workload_classes import class_usage
from gpuledger.analytics.workloads import workload_summary
from gpuledger.collector.samples import IDLE_CAPACITY, owner_label


@dataclass
class ReportFiles:
    label: str
    html: Path
    summary_csv: Path
    team_csvs: dict[str, Path] = field(default_factory=dict)
    team_pages: dict[str, Path] = field(default_factory=dict)  # each team's own page (its line, jobs, advice)
    pdf: Path | None = None  # the admin page as PDF, when a renderer was at hand (deploy/report_delivery.py)


STYLE = """body{font-family:system-ui,sans-serif;margin:2rem;color:#222}table{border-collapse:collapse;margin:1rem 0}
td,th{border:1px solid #ccc;padding:.3rem .6rem;text-align:right}th{background:#f3f3f3;font-weight:600}
td:first-child,th:first-child{text-align:left}
@media print{body{margin:0;font-size:10pt}h1{font-size:15pt}h2{font-size:12pt;break-after:avoid}
table{width:100%;table-layout:fixed;font-size:7.5pt;break-inside:auto}tr{break-inside:avoid}
td,th{padding:.1rem .2rem;overflow-wrap:anywhere;white-space:normal}svg{max-width:100%;height:auto}
th:first-child,td:first-child{width:14%;white-space:nowrap;overflow-wrap:normal}}"""
# Printed (Chromium, A4 portrait, 1 cm margins) a table takes the page's width and wraps its cells, so the last
# columns of the cost table are on the page, not cut off; the first column (a team's name) is never broken inside a
# word (tests/test_report_layout.py reads the PDF's text).

# Column headers as a reader sees them, with their units; a column not listed gets its name with spaces.
HEADERS = {
    "team": "Team", "gpu_model": "GPU model", "job_id": "Job", "node": "Node", "kind": "Kind", "reason": "Reason",
    "gpus": "GPUs", "gpu_hours": "GPU-hours allocated", "used_gpu_hours": "GPU-hours busy",
    "efficiency": "Efficiency (busy / allocated, measured GPU-hours)", "cost_usd": "Cost (USD)",
    "util_coverage": "Utilisation measured (share of GPU-hours)",
    "cost_prev_week_usd": "Cost previous week (USD)", "cost_change": "Change on previous week",
    "idle_gpu_hours": "Idle GPU-hours (waste)", "idle_cost_usd": "Idle cost (USD, waste)",
    "unpriced_gpu_hours": "Unpriced GPU-hours", "usd_per_gpu_hour": "Rate (USD / GPU-hour)",
    "rate_card": "Rate card version", "usage_usd": "Usage (USD)", "adjustments_usd": "Adjustments (USD)",
    "total_usd": "Total (USD)", "usd": "Amount (USD)", "corrects": "Corrects period", "made_by": "By",
    "longest_idle_minutes": "Longest idle stretch (min)", "mean_util_pct": "Mean utilisation (%)",
    "idle_share": "Idle share", "allocated_gpu_hours": "GPU-hours allocated",
    "service": "Service (model served)", "slo_status": "SLO", "cost_per_million_tokens": "Cost per million tokens",
    "cost_per_thousand_requests": "Cost per thousand requests", "requests_per_s": "Requests / s",
    "generation_tokens_per_s": "Generated tokens / s", "ttft_p95_ms": "Time to first token p95 (ms)",
    "tpot_p95_ms": "Time per output token p95 (ms)", "e2e_p95_ms": "Latency p95 (ms)",
    "cost_note": "Cost note", "services": "Services", "requests": "Requests", "tokens": "Tokens",
    "services_without_cost": "Services without GPU samples", "flags": "Flags",
    "util_on_profiled_pct": "GPU utilisation (%)", "sm_active": "SM active", "tensor_active": "Tensor active",
}
# columns that rest on utilisation readings: an empty cell there says so (unknown is never zero)
UTILISATION_COLUMNS = {"used_gpu_hours", "efficiency", "mean_util_pct", "p95_util_pct", "idle_share",
                       "idle_gpu_hours", "idle_cost_usd", "util_coverage"}
LIKE_WITH_LIKE = 0.9  # coverages within 90% of each other compare week totals; else cost per covered day



def _page(title: str, body: str) -> str:
    """A self-contained HTML page: inline style and charts, nothing fetched when it is opened."""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>")


def _team_page(team: str, label: str, start: datetime, end: datetime, line: pd.DataFrame, by_model: pd.DataFrame,
               jobs: pd.DataFrame, idle: pd.DataFrame, recs: pd.DataFrame, chart: str, unfinished: str,
               coverage: str, work: pd.DataFrame, services: pd.DataFrame, flagged: pd.DataFrame) -> str:
    """What one team lead reads: the team's line of the bill, its cost per day, models, costliest jobs, idle
    allocations and the advice that concerns it."""
    name = owner_label(team)
    # the team's own advice, with other teams' jobs and users named only as "another team's" (team_scope.py)
    mine = pd.DataFrame([redact_for_team(r, team) for r in recs.to_dict(orient="records") if r.get("team") == team],
                        columns=recs.columns) if not recs.empty else recs
    row = line.iloc[0] if not line.empty else None
    headline = (f"Cost <strong>${row['cost_usd']:,.2f}</strong>, {row['gpu_hours']:,.1f} GPU-hours allocated, "
                + _efficiency(row) + (f", {row['cost_change']:+.0%} on the week before"
                                                          + (" per covered day" if row["change_basis"] == PER_DAY
                                                             else "")
                                                          if pd.notna(row["cost_change"]) else "")
                if row is not None else "No usage this week.")
    body = f"""<h1>GPU cost report — {html.escape(name)} — week {html.escape(label)}</h1>
<p>{start:%Y-%m-%d} to {end:%Y-%m-%d} (UTC).{unfinished} {headline}.</p>
<p>{coverage}</p>
<h2>Cost per day</h2>
{chart}
<h2>Cost per GPU model</h2>
{_table(by_model.drop(columns=["team", "week", "rate_from"], errors="ignore"), money=("usd_per_gpu_hour", "cost_usd"))}
<h2>Costliest jobs</h2>
{_table(jobs, money=("cost_usd",), percent=("idle_share", "util_coverage"))}
<h2>Largest idle allocations</h2>
{_table(idle, money=("idle_cost_usd",))}
<h2>Queue and outcomes</h2>
{_queue(work.drop(columns="team"))}
<h2>Inference: cost per million tokens</h2>
{_inference(services)}
<h2>Efficiency beyond utilisation</h2>
{_flagged(flagged)}
<h2>Recommendations</h2>
{_recommendations(mine, ["kind", "gpu_model", "reason"])}"""
    return _page(f"gpuledger {name} {label}", body)


def _efficiency(row: pd.Series) -> str:
    """The headline's efficiency, saying what it rests on: "no utilisation data" rather than a guess."""
    if pd.isna(row["efficiency"]):
        return f"efficiency unknown ({NO_UTILISATION})"
    cover = row.get("util_coverage")
    partial = f" (utilisation measured on {cover:.0%} of GPU-hours)" if pd.notna(cover) and cover < 1 - 1e-9 else ""
    return f"efficiency {row['efficiency']:.0%}{partial}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "_"


def _table(frame: pd.DataFrame, money: tuple[str, ...] = (), hours: tuple[str, ...] = (),
           percent: tuple[str, ...] = (), headers: dict[str, str] | None = None,
           whole: tuple[str, ...] = ()) -> str:
    """`whole`: columns shown without decimals (milliseconds)."""
    if frame.empty:
        return "<p><em>No data in this window.</em></p>"
    named = {**HEADERS, **(headers or {})}
    head = "".join(f"<th>{html.escape(named.get(str(c), str(c).replace('_', ' ')))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False):
        cells = []
        for col, value in zip(frame.columns, row):
            if _missing(value):
                text = NO_UTILISATION if col in UTILISATION_COLUMNS else "–"
            elif isinstance(value, (list, tuple, dict)):
                text = ", ".join(map(str, value)) if not isinstance(value, dict) else str(value)
            elif col in money:
                text = f"${value:,.2f}"
            elif col in whole:
                text = f"{float(value):,.0f}"
            elif col in percent:
                text = f"{value:+.0%}" if col.endswith("change") else f"{value:.0%}"
            elif col in hours or isinstance(value, (float, np.floating)):
                text = f"{float(value):,.1f}"
            elif col == "team":
                text = owner_label(str(value))
            else:
                text = str(value)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _missing(value: object) -> bool:
    """None, NaN, NaT or pd.NA, and the text a missing value became on its way ("None", "nan"): shown as a dash."""
    if isinstance(value, str):
        return value.strip().lower() in ("", "none", "nan", "nat", "<na>")
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or an array: not one missing value
        return False


def _insufficient(recs: pd.DataFrame) -> pd.DataFrame:
    """The insufficient-data notes, one row per GPU model and reason: which teams it leaves without advice."""
    if recs.empty or "status" not in recs:
        return pd.DataFrame()
    notes = recs[recs["status"] == "insufficient_data"]
    rows: dict[tuple[str, str], list[str]] = {}
    for rec in notes.to_dict(orient="records"):
        evidence = rec.get("evidence") if isinstance(rec.get("evidence"), dict) else {}
        model = str(rec.get("gpu_model") or "unknown")
        if not evidence.get("capacity_gpus"):
            why = f"no {model} GPU present at the evaluation"
        elif evidence.get("coverage") is not None:
            why = (f"samples cover {float(evidence['coverage']):.0%} of the policy window's hours "
                   f"({float(evidence.get('min_coverage') or 0):.0%} needed)")
        else:
            why = "too few samples in the policy window"
        rows.setdefault((model, why), []).append(owner_label(str(rec.get("team"))))
    return pd.DataFrame([{"gpu_model": model, "why": why, "teams": ", ".join(sorted(set(teams)))}
                         for (model, why), teams in sorted(rows.items())])


def _recommendations(recs: pd.DataFrame, columns: list[str]) -> str:
    """Advice with a number as a table, then the insufficient-data notes grouped: one line per GPU model."""
    if recs.empty:
        return "<p><em>None.</em></p>"
    advice = recs[recs["status"] != "insufficient_data"] if "status" in recs else recs
    parts = []
    if not advice.empty and "evidence" in advice:
        advice = advice.assign(simulated_effect=[_effect(e) for e in advice["evidence"]])
        columns = [*columns[:-1], "status", "simulated_effect", columns[-1]]
        if "alternatives" in advice and advice["alternatives"].notna().any():
            parts.append(_savings(advice))
            advice = advice.assign(alternatives=[_alternative(a) for a in advice["alternatives"]])
            columns = [*columns[:-1], "alternatives", columns[-1]]
    parts.insert(0, _table(advice[[c for c in columns if c in advice]]) if not advice.empty
                 else "<p><em>No advice with a number.</em></p>")
    notes = _insufficient(recs)
    if not notes.empty:
        items = "".join(f"<li>not enough data for <strong>{html.escape(r.gpu_model)}</strong> ({html.escape(r.why)}):"
                        f" {'team' if ',' not in r.teams else 'teams'} {html.escape(r.teams)}</li>"
                        for r in notes.itertuples(index=False))
        parts.append(f"<p>No quota advice where the data is too thin:</p><ul>{items}</ul>")
    return "\n".join(parts)


def _alternative(alternatives: object) -> str:
    """An advice's group of alternatives (policies/alternatives.py) in a cell."""
    if not isinstance(alternatives, dict):
        return ""
    counted = ", counted" if alternatives.get("counted") else ""
    return (f"alone{counted}" if alternatives.get("of", 1) <= 1
            else f"{alternatives.get('rank')} of {alternatives.get('of')} in {alternatives.get('group')}{counted}")


def _savings(advice: pd.DataFrame) -> str:
    """The potential-savings line under the advice table: each group of alternatives counted once (the advice
    its `alternatives` marks counted); unknown, not zero, when no advice shown is priced."""
    shown = [(a, e) for a, e in zip(advice["alternatives"], advice["evidence"])
             if isinstance(a, dict) and isinstance(e, dict)]
    priced = [(a, float(e["effect_usd_per_week"])) for a, e in shown if e.get("effect_usd_per_week") is not None]
    if not priced:
        return "<p>Potential savings: unknown (no placement advice shown prices its effect).</p>"
    total = sum(usd for a, usd in priced if a.get("counted"))
    groups = len({a.get("group") for a, _ in shown})
    return (f"<p>Potential savings <strong>${total:,.2f} per week</strong>: {groups} group(s) of alternatives "
            "(advice wanting the same free GPUs or job), each counted once, by the most valuable set of its advice "
            "that can all be done together; quota advice is judged by waits, not dollars.</p>")


def _effect(evidence: object) -> str:
    """A quota advice's simulated effect in a line: who gains and who pays (p95 wait, minutes) and how well the
    replay reproduced the record (its backtest); placement advice has none."""
    if not isinstance(evidence, dict):
        return ""
    if evidence.get("simulated_effect_unknown"):
        return f"unknown: {evidence['simulated_effect_unknown']}"
    effect = evidence.get("simulated_effect")
    if not isinstance(effect, dict):
        return ""
    moved = lambda rows: ", ".join(  # noqa: E731 - a row's team and its p95 wait before -> after
        f"{r['team']} {r['p95_wait_minutes']['current']:.0f}->{r['p95_wait_minutes']['proposed']:.0f} min"
        for r in rows) or "nobody"
    worst = effect.get("backtest_worst")
    tested = (f"backtest {'calibrated' if effect.get('calibrated') else 'NOT calibrated'}"
              + (f", worst error {worst['error_minutes']:+.0f} min ({worst['team']})" if worst else ""))
    return f"gains: {moved(effect.get('gains') or [])}; pays: {moved(effect.get('pays') or [])}; {tested}"


PER_DAY = "per covered day"


def _coverage(store: Store, start: datetime, end: datetime) -> tuple[int, float]:
    """(clock hours in [start, end) holding at least one sample of any GPU, hours in [start, end))."""
    found = covered_hours(store, start, end)
    hours = {pd.Timestamp(h) for listed in found["hours"] for h in listed} if not found.empty else set()
    return len(hours), (end - start).total_seconds() / 3600.0


def _days(hours: float) -> str:
    return f"{hours / 24:.1f}".removesuffix(".0")


def _coverage_note(now: tuple[int, float], before: tuple[int, float], basis: str | None) -> str:
    """What both weeks' data covers, and how the change compares them."""
    text = (f"Data coverage: this week has samples in {now[0]} of {now[1]:.0f} hours ({_days(now[0])} of "
            f"{_days(now[1])} days); the previous week has data for {_days(before[0])} of {_days(before[1])} days "
            f"({before[0]} of {before[1]:.0f} hours).")
    if basis == PER_DAY:
        return text + (" The coverages differ, so the change on the previous week compares cost per covered day, "
                       "not week totals.")
    if basis is None:
        return text + " No change on the previous week is given: one of the weeks has no data."
    return text


QUEUE_COLUMNS = ["team", "gpu_model", "workload_class", "jobs_started", "wait_p50_minutes", "wait_p95_minutes",
                 "wait_max_minutes", "jobs_finished", "run_gpu_hours", "lost_gpu_hours", "waiting_gpu_hours",
                 "pending_jobs", "gang_jobs_waiting"]


def _queue(work: pd.DataFrame, by_class: pd.DataFrame | None = None) -> str:
    """Queue waits and outcomes per team and model (analytics/workloads.py), then per workload class, or why there
    are none: no wait is ever shown as zero where no scheduler's job records were loaded."""
    if work.empty:
        return ("<p><em>No job records from a scheduler this week (load them with <code>gpuledger import "
                "sacct</code>, or serve with <code>--jobs-from prometheus</code>): queue waits and outcomes are not "
                "known.</em></p>")
    html_out = _table(work[[c for c in QUEUE_COLUMNS if c in work]])
    if by_class is not None and not by_class.empty:
        html_out += "<h3>By workload class</h3>" + _table(by_class[[c for c in QUEUE_COLUMNS if c in by_class]])
    return html_out


def _class_costs(usage: pd.DataFrame) -> str:
    """Cost, efficiency and waste per workload class over the cluster (analytics/workload_classes.py)."""
    if usage.empty:
        return ""
    per = usage.groupby("workload_class").agg(
        jobs=("jobs", "sum"), gpu_hours=("gpu_hours", "sum"), cost_usd=("cost_usd", "sum"),
        used_gpu_hours=("used_gpu_hours", lambda s: s.sum(min_count=1)),
        idle_gpu_hours=("idle_gpu_hours", lambda s: s.sum(min_count=1)),
        idle_cost_usd=("idle_cost_usd", lambda s: s.sum(min_count=1))).reset_index()
    per = per.sort_values("cost_usd", ascending=False)
    return ("<h3>Cost and waste by workload class</h3>"
            + _table(per, money=("cost_usd", "idle_cost_usd")))


SERVICE_COLUMNS = ["service", "team", "kind", "slo_status", "cost_per_million_tokens", "cost_per_thousand_requests",
                   "requests_per_s", "generation_tokens_per_s", "ttft_p95_s", "tpot_p95_s", "e2e_p95_s", "cost_usd",
                   "cost_note"]
LATENCY_MS = ("ttft_p95_s", "tpot_p95_s", "e2e_p95_s")
FLAG_COLUMNS = ["job_id", "team", "flags", "gpus", "gpu_model", "cost_usd", "util_on_profiled_pct", "sm_active",
                "tensor_active"]


def _inference(services: pd.DataFrame, teams: pd.DataFrame | None = None) -> str:
    """Cost per million tokens per team and each service against its SLO (analytics/inference.py), or why none."""
    if services.empty:
        return ("<p><em>No inference server's metrics this week (point gpuledger at them with "
                "<code>[[apps.targets]]</code> or <code>serve --apps-from prometheus</code>).</em></p>")
    out = ""
    teams = team_inference(services) if teams is None else teams
    if not teams.empty:
        out += _table(teams, money=("cost_usd", "cost_per_million_tokens"), whole=("requests", "tokens"))
    shown = services[[c for c in SERVICE_COLUMNS if c in services]].copy()
    for column in LATENCY_MS:  # tens of milliseconds: shown in milliseconds, not as 0.0 s
        shown[column] = shown[column] * 1000.0
    return out + "<h3>Services against their SLOs</h3>" + _table(
        shown.rename(columns={c: c.removesuffix("_s") + "_ms" for c in LATENCY_MS}),
        money=("cost_usd", "cost_per_million_tokens", "cost_per_thousand_requests"),
        whole=tuple(c.removesuffix("_s") + "_ms" for c in LATENCY_MS))


def _flagged(jobs: pd.DataFrame) -> str:
    """Jobs whose profiling readings flag them (analytics/efficiency.py), or that none did."""
    flagged = jobs[jobs["flags"].map(len) > 0] if not jobs.empty else jobs
    if flagged.empty:
        return "<p><em>No job flagged by its profiling readings (SM, tensor and DRAM activity).</em></p>"
    return _table(flagged[[c for c in FLAG_COLUMNS if c in flagged]].head(20), money=("cost_usd",),
                  percent=("sm_active", "tensor_active"))


def _idle_by_job(runs: pd.DataFrame) -> pd.DataFrame:
    """Idle stretches per job (not per GPU): GPUs, idle GPU-hours and cost, the longest stretch."""
    columns = ["team", "job_id", "node", "gpu_model", "gpus", "longest_idle_minutes", "idle_gpu_hours",
               "idle_cost_usd"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    # a job's row names every node and model it idled on (a job of two nodes is one row, not two); stretches of no
    # job stay one row per node
    runs = runs.assign(row=runs["job_id"].fillna("(no job) " + runs["node"].astype(str)),
                       job_id=runs["job_id"].fillna("(no job)"))
    grouped = runs.groupby(["team", "row"], as_index=False).agg(
        job_id=("job_id", "first"), node=("node", lambda v: ", ".join(sorted(set(map(str, v))))),
        gpu_model=("gpu_model", lambda v: ", ".join(sorted(set(map(str, v))))),
        gpus=("gpu_uuid", "nunique"), longest_idle_minutes=("idle_minutes", "max"),
        idle_gpu_hours=("idle_gpu_hours", "sum"), idle_cost_usd=("idle_cost_usd", "sum"))
    return grouped.sort_values("idle_cost_usd", ascending=False)[columns].reset_index(drop=True)


PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


def _cost_chart(daily: pd.DataFrame, width: int = 720, height: int = 260) -> str:
    """Cost per day stacked by team, as inline SVG: the page needs no network and no script to show it."""
    if daily.empty:
        return "<p><em>No data in this window.</em></p>"
    wide = daily.pivot_table(index="day", columns="team", values="cost_usd", aggfunc="sum").fillna(0.0)
    teams = list(wide.columns)
    top = float(wide.sum(axis=1).max()) or 1.0
    left, bottom, plot_h = 60, 30, height - 50
    bar_w = (width - left - 10) / len(wide)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 20 * len(teams) + 20}" '
             f'role="img" aria-label="cost per day by team">',
             f'<text x="5" y="15" font-size="11">${top:,.0f}</text>',
             f'<line x1="{left}" y1="{10 + plot_h}" x2="{width - 10}" y2="{10 + plot_h}" stroke="#999"/>']
    for i, (day, row) in enumerate(wide.iterrows()):
        y = 10 + plot_h
        for j, team in enumerate(teams):
            h = row[team] / top * plot_h
            y -= h
            parts.append(f'<rect x="{left + i * bar_w + 2:.1f}" y="{y:.1f}" width="{bar_w - 4:.1f}" height="{h:.1f}" '
                         f'fill="{PALETTE[j % len(PALETTE)]}"><title>{html.escape(owner_label(str(team)))} '
                         f'{pd.Timestamp(day):%a %d}: ${row[team]:,.2f}</title></rect>')
        parts.append(f'<text x="{left + i * bar_w + bar_w / 2:.1f}" y="{height - bottom + 28}" font-size="11" '
                     f'text-anchor="middle">{pd.Timestamp(day):%a %d}</text>')
    for j, team in enumerate(teams):
        y = height + 10 + 20 * j
        parts.append(f'<rect x="{left}" y="{y}" width="12" height="12" fill="{PALETTE[j % len(PALETTE)]}"/>'
                     f'<text x="{left + 18}" y="{y + 11}" font-size="12">{html.escape(owner_label(str(team)))}</text>')
    return "".join(parts) + "</svg>"


def _utilisation_chart(series: pd.DataFrame, width: int = 720, height: int = 200) -> str:
    """GPUs present, allocated and busy (average concurrent) over the week, as inline SVG lines."""
    if series.empty:
        return "<p><em>No data in this window.</em></p>"
    left, plot_h = 60, height - 40
    top = float(series["total_gpus"].max()) or 1.0
    step = (width - left - 10) / max(len(series) - 1, 1)
    lines = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 30}" role="img" '
             f'aria-label="GPUs present, allocated and busy">', f'<text x="5" y="15" font-size="11">{top:,.0f}</text>',
             f'<line x1="{left}" y1="{10 + plot_h}" x2="{width - 10}" y2="{10 + plot_h}" stroke="#999"/>']
    for j, (column, label) in enumerate((("total_gpus", "present"), ("allocated_gpus", "allocated"),
                                         ("used_gpus", "busy (utilisation-weighted)"))):
        points = " ".join(f"{left + i * step:.1f},{10 + plot_h - v / top * plot_h:.1f}"
                          for i, v in enumerate(series[column].fillna(0.0)))
        lines.append(f'<polyline fill="none" stroke="{PALETTE[j]}" stroke-width="1.5" points="{points}"/>')
        lines.append(f'<rect x="{left + 170 * j}" y="{height + 8}" width="12" height="12" fill="{PALETTE[j]}"/>'
                     f'<text x="{left + 170 * j + 18}" y="{height + 19}" font-size="12">{label}</text>')
    first, last = series["bucket"].iloc[0], series["bucket"].iloc[-1]
    lines.append(f'<text x="{left}" y="{height - 12}" font-size="11">{pd.Timestamp(first):%a %d %H:%M}</text>'
                 f'<text x="{width - 10}" y="{height - 12}" font-size="11" text-anchor="end">'
                 f'{pd.Timestamp(last):%a %d %H:%M}</text>')
    return "".join(lines) + "</svg>"


def _access(store: Store, now: datetime) -> str:
    """The admin page's access review as of now (analytics/access_review.py): live tokens per role, and those to
    look at (never used, unused for a month, expiring soon)."""
    by_role, look = access_review(store, now)
    if by_role.empty:
        return "<p><em>No API tokens: the server runs on its bootstrap --token, or reads are open.</em></p>"
    roles = ", ".join(f"{int(r.tokens)} {html.escape(str(r.role))}" for r in by_role.itertuples(index=False))
    intro = (f"<p>Live tokens by role, as of {now:%Y-%m-%d %H:%M} UTC: {roles}. To look at: tokens never used, unused "
             f"for {UNUSED_DAYS} days, or expiring within {EXPIRING_DAYS} days.</p>")
    return intro + (_table(look) if not look.empty else "<p><em>None.</em></p>")


def write_weekly_report(store: Store, config: Config, out_dir: str | Path, start: datetime, end: datetime,
                        label: str, recommendations: list[dict] | Callable[[], list[dict]] | None = None
                        ) -> ReportFiles:
    """The week's HTML page, its team pages and CSV files. `recommendations`: the advice to show, or a callable
    giving it, called once the week's figures are read (the caller may be working it out meanwhile)."""
    out = Path(out_dir) / label
    out.mkdir(parents=True, exist_ok=True)
    costs = cost_by_team(store, start, end)
    # whole cents by largest remainder: the lines add up to the week's total, and each team's CSV to its line
    costs["cost_usd"] = cents_usd(costs["cost_usd"])
    found = waste(store, start, end, config.waste, oversized=False)
    per_team = found.by_team
    summary = costs.merge(per_team[["team", "idle_gpu_hours", "idle_cost_usd"]], on="team", how="left").fillna(
        {"idle_gpu_hours": 0.0, "idle_cost_usd": 0.0})
    # efficiency over the GPU-hours with a utilisation reading; idle waste unknown (not 0) for a line with none
    measured = summary["gpu_hours"] * summary["util_coverage"]
    summary["efficiency"] = summary["used_gpu_hours"] / measured.where(measured > 0)
    unmeasured = (summary["util_coverage"].fillna(0.0) <= 0) & (summary["team"] != IDLE_CAPACITY)
    summary.loc[unmeasured, ["idle_gpu_hours", "idle_cost_usd"]] = float("nan")
    # the idle-capacity line is GPUs no job held: all of it is idle, none of it an idle allocation of a job (the
    # waste table's rule), so it read "0 idle GPU-hours" beside its whole cost
    capacity = summary["team"] == IDLE_CAPACITY
    summary.loc[capacity, "idle_gpu_hours"] = summary.loc[capacity, "gpu_hours"]
    summary.loc[capacity, "idle_cost_usd"] = summary.loc[capacity, "cost_usd"]
    prev_start = start - (end - start)
    before = cost_by_team(store, prev_start, start)[["team", "cost_usd"]]
    summary = summary.merge(before.rename(columns={"cost_usd": "cost_prev_week_usd"}), on="team", how="left")
    # like with like: a week whose data covers materially less (under 90% of the other's covered hours) is
    # compared per covered day, never as a week total against a fuller one
    cover, cover_prev = _coverage(store, start, end), _coverage(store, prev_start, start)
    share, share_prev = cover[0] / cover[1], cover_prev[0] / cover_prev[1]
    if not (share > 0 and share_prev > 0):
        basis, scale = None, float("nan")
    elif min(share, share_prev) >= LIKE_WITH_LIKE * max(share, share_prev):
        basis, scale = "week", 1.0
    else:
        basis, scale = PER_DAY, cover_prev[0] / cover[0]
    summary["cost_change"] = (summary["cost_usd"] * scale / summary["cost_prev_week_usd"] - 1.0).where(
        summary["cost_prev_week_usd"] > 0)
    summary["change_basis"] = basis
    summary["covered_hours"], summary["covered_hours_prev_week"] = cover[0], cover_prev[0]
    summary["week_hours"] = cover[1]
    coverage = html.escape(_coverage_note(cover, cover_prev, basis))
    summary.insert(0, "week", label)
    files = ReportFiles(label=label, html=out / f"gpuledger-{label}.html", summary_csv=out / "summary.csv")
    write_csv(summary, files.summary_csv)
    by_model = cost_by_team_and_model(store, start, end)
    line_cents = dict(zip(summary["team"], (summary["cost_usd"] * 100).round()))
    for team, frame in by_model.groupby("team"):
        path = out / f"team-{_safe(str(team))}.csv"
        frame = frame.assign(cost_usd=cents_usd(frame["cost_usd"], line_cents.get(team)))
        frame.insert(0, "week", label)
        write_csv(frame, path)
        files.team_csvs[str(team)] = path
    top_idle = _idle_by_job(found.runs).head(15)
    daily = daily_cost_by_team(store, start, end)
    chart = _cost_chart(daily)
    # the page's total is the sum of the cents summary.csv shows per team, so the two never differ by a cent
    total = round(float(summary["cost_usd"].round(2).sum()), 2)
    idle_line = summary[summary["team"] == IDLE_CAPACITY]
    idle_cost = round(float(idle_line["cost_usd"].round(2).sum()), 2) if not idle_line.empty else 0.0
    now = utc_now()
    unfinished = (f" <strong>This week is not over</strong>: figures cover up to {now:%Y-%m-%d %H:%M} UTC."
                  if end > now else "")
    services = service_table(store, start, min(end, now), config.slo)
    efficiency_jobs = job_efficiency(store, start, min(end, now), config.efficiency, limit=1000)
    work = workload_summary(store, start, end, min(end, now))
    work_by_class = workload_summary(store, start, end, min(end, now), by=("workload_class",))
    classes = class_usage(store, start, min(end, now))
    utilisation = cluster_utilization(store, start, end, 60)
    all_jobs = job_table(store, start, end, limit=100_000, mem_fraction=config.waste.oversized_mem_fraction,
                         p95=False, profiling=False)  # the team pages show neither
    recs = pd.DataFrame((recommendations() if callable(recommendations) else recommendations) or [])
    if not recs.empty and end <= now:  # placement advice is about what runs now: stale for a week that is over
        recs = recs[recs["kind"] == "quota"]
    rec_html = _recommendations(recs, ["kind", "team", "gpu_model", "reason"])
    rec_note = ("Quota advice as the policy stood at the week's end." if end <= now
                else "Open advice as of now.")
    body = f"""<h1>GPU cost report — week {html.escape(label)}</h1>
<p>{html.escape(start.strftime('%Y-%m-%d'))} to {html.escape(end.strftime('%Y-%m-%d'))} (UTC).{unfinished}
Cost of the GPUs present <strong>${total:,.2f}</strong> (every GPU at the rate card, held by a job or not), of which idle
capacity (GPUs no job held) <strong>${idle_cost:,.2f}</strong>; GPUs jobs held but left idle are the idle allocations
below, part of the teams' cost.</p>
<p>{coverage}</p>
<h2>Cost per day</h2>
{chart}
<h2>GPUs present, allocated and busy</h2>
{_utilisation_chart(utilisation)}
<h2>Cost per team</h2>
{_table(summary[["team", "gpu_hours", "used_gpu_hours", "efficiency", "util_coverage", "cost_usd",
                 "cost_prev_week_usd", "cost_change", "idle_gpu_hours", "idle_cost_usd", "unpriced_gpu_hours"]],
        money=("cost_usd", "cost_prev_week_usd", "idle_cost_usd"),
        percent=("efficiency", "util_coverage", "cost_change"),
        headers={"cost_change": "Change on previous week, per covered day"} if basis == PER_DAY else None)}
<h2>Largest idle allocations</h2>
{_table(top_idle, money=("idle_cost_usd",))}
<h2>Queue and outcomes</h2>
{_queue(work, work_by_class)}
{_class_costs(classes)}
<h2>Inference: cost per million tokens</h2>
{_inference(services)}
<h2>Efficiency beyond utilisation</h2>
<p>Jobs busy by GPU utilisation whose SMs mostly wait, or whose tensor cores stay idle (SM and tensor activity from
the profiling fields, where the GPUs report them).</p>
{_flagged(efficiency_jobs)}
<h2>Recommendations</h2>
<p>{rec_note}</p>
{rec_html}
<h2>Access review</h2>
{_access(store, now)}
<p>Per-team pages and CSV files sit next to this page. Rates: USD per GPU-hour from the site rate card.</p>"""
    page = _page(f"gpuledger weekly cost report {label}", body)
    idle_jobs = _idle_by_job(found.runs)
    job_columns = ["job_id", "gpus", "gpu_model", "gpu_hours", "cost_usd", "mean_util_pct", "idle_share",
                   "util_coverage"]
    for team in sorted(set(summary["team"]) - {IDLE_CAPACITY}):
        path = out / f"team-{_safe(str(team))}.html"
        team_jobs = all_jobs[all_jobs["team"] == team][job_columns].head(15) if not all_jobs.empty else all_jobs
        team_idle = idle_jobs[idle_jobs["team"] == team].head(15) if not idle_jobs.empty else idle_jobs
        path.write_text(_team_page(
            str(team), label, start, end, summary[summary["team"] == team],
            by_model[by_model["team"] == team], team_jobs, team_idle, recs,
            _cost_chart(daily[daily["team"] == team]), unfinished, coverage, work[work["team"] == team],
            services[services["team"] == team] if not services.empty else services,
            efficiency_jobs[efficiency_jobs["team"] == team] if not efficiency_jobs.empty else efficiency_jobs),
            encoding="utf-8")
        files.team_pages[str(team)] = path
    files.html.write_text(page, encoding="utf-8")
    return files


STATEMENT_COLUMNS = ["kind", "period", "state", "team", "shared_from", "gpu_model", "rate_card", "usd_per_gpu_hour",
                     "gpu_hours", "used_gpu_hours", "cost_usd", "corrects", "reason", "made_by", "made_at"]


def _statement_coverage(cover: dict | None) -> str:
    """The statement's coverage in a line: hours with samples of the period's, and the note when it is short."""
    if not cover:
        return ""
    line = f"Samples in {cover['hours_with_data']:,} of the period's {cover['hours_elapsed']:,.0f} hours"
    return (f"<p><strong>Coverage</strong>: {html.escape(line)}"
            + (f" — {html.escape(cover['note'])}" if cover.get("note") else "") + ".</p>")


def write_statement(found: dict, out: Path, team: str | None = None) -> tuple[Path, Path]:
    """A period's statement (analytics/ledger.py `statement`, already narrowed to `team` when given) as CSV, its
    lines then its adjustments, each row saying which (`kind`: usage, idle share, shared cost, adjustment), and as
    a self-contained page (for PDF).
    Returns (csv, html)."""
    out.mkdir(parents=True, exist_ok=True)
    base = out / (f"statement-{found['period']}" + (f"-{_safe(team)}" if team else ""))
    lines = pd.DataFrame(found["lines"], columns=[c for c in STATEMENT_COLUMNS if c not in
                                                  ("period", "state", "corrects", "reason", "made_by", "made_at")])
    adjustments = pd.DataFrame(found["adjustments"], columns=["team", "usd", "corrects", "reason", "made_by",
                                                              "made_at"])
    rows = pd.concat([lines,
                      adjustments.rename(columns={"usd": "cost_usd"}).assign(kind="adjustment")], ignore_index=True)
    rows = rows.assign(period=found["period"], state=found["state"]).reindex(columns=STATEMENT_COLUMNS)
    write_csv(rows, base.with_suffix(".csv"))
    state = ("Closed " + f"{pd.Timestamp(found['closed_at']):%Y-%m-%d %H:%M} UTC by {found['closed_by']}: final."
             if found["state"] == "closed" else
             f"<strong>Draft</strong>: the period is open until {pd.Timestamp(found['closes_at']):%Y-%m-%d %H:%M} "
             "UTC and these figures will change.")
    title = found["period"] + (f" — {owner_label(team)}" if team else "")
    body = f"""<h1>GPU statement — {html.escape(title)}</h1>
<p>{pd.Timestamp(found['start']):%Y-%m-%d} to {pd.Timestamp(found['end']):%Y-%m-%d} (UTC, end exclusive).
{html.escape(state) if found['state'] == 'closed' else state} Split: {html.escape(found['split'])}.
Total <strong>${found['total_usd']:,.2f}</strong>.</p>
{_statement_coverage(found.get('coverage'))}
<h2>Per team</h2>
{_table(pd.DataFrame(found['teams']), money=("usage_usd", "adjustments_usd", "total_usd"))}
<h2>Lines (per team, GPU model and rate card version)</h2>
{_table(lines.drop(columns=["rate_from"], errors="ignore"), money=("usd_per_gpu_hour", "cost_usd"),
        percent=("util_coverage",))}
<h2>Adjustments</h2>
{_table(adjustments, money=("usd",))}"""
    page = base.with_suffix(".html")
    page.write_text(_page(f"gpuledger statement {found['period']}", body), encoding="utf-8")
    return base.with_suffix(".csv"), page
