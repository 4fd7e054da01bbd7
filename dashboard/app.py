"""gpuledger admin dashboard: utilisation, cost and waste per team, fairshare, recommendations.

Run with `gpuledger dashboard --api URL` (or `gpuledger demo`, which starts it for you).
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pandas as pd
import streamlit as st

from gpuledger.collector.samples import IDLE_CAPACITY, owner_label
from gpuledger.dashboard.client import (
    ApiUnavailable,
    NeedsToken,
    Unanswerable,
    api_base,
    calls,
    deployment_token,
    FORECAST_COLUMNS,
    forecast_frames,
    frame,
    get_json,
    capacity_changes,
    post_decision,
    post_json,
    proxied_token,
    quota_edits,
)
from gpuledger.dashboard.charts import (
    BLANK,
    alternative,
    change,
    colour_of,
    daily_bars,
    daily_spec,
    heatmap,
    heatmap_spec,
    model_gaps,
    model_spec,
    readable,
    team_bar_spec,
    team_colours,
    words,
)
from gpuledger.dashboard.escape import md

FAIRSHARE_TITLES = {
    "slurm_classic": "Slurm classic, F = 2^(-U/S): 0.5 = used exactly its share, lower = over-served",
    "slurm_fair_tree": "Slurm Fair Tree: mean rank-based FairShare of the team's users, 1 = first in line",
    "kai_time_based": "KAI time-based: the team's part of over-quota GPUs, P = max(0, W + k(W - U))",
}
# every kind of advice (policies/recommendation.py KINDS), in words
ADVICE_KINDS = {
    "quota": "Set the team's guarantee and limit for this GPU model",
    "reclaim": "Take back GPUs a job holds idle",
    "resize": "Move a job to a smaller MIG slice or card that fits its memory",
    "consolidate": "Move running jobs to free a node for a job waiting for whole GPUs",
    "colocate": "Run a job that talks across nodes inside one NVLink island",
    "separate": "Give a latency-sensitive job a GPU of its own",
    "efficiency": "Fix what keeps a job's SMs waiting (input pipeline, communication, memory, tensor cores idle)",
}
TOTAL_LABEL = "Cost of GPUs present"  # the header's figures: what they are, in their names
IDLE_LABEL = "Idle capacity (no job) cost"
GLOSSARY = {
    "allocated": "held by a job, busy or not",
    "busy": "allocated and at or over the idle threshold of utilisation ([waste] idle_util_pct), as /metrics' "
    "gpuledger_*_busy_gpus and the quota advice count it",
    "used": "allocated GPU time weighted by utilisation (a GPU held at 40% counts 0.4 of a GPU), averaged over the "
    "window, as a share of the GPUs present: not the busy count (allocated and at or over the idle threshold)",
    "idle capacity": "GPUs no job held: the cluster's unused capacity, its own line of the bill",
    "idle allocation": "GPUs a job held under the idle threshold: waste charged to the team",
}
st.set_page_config(page_title="gpuledger", page_icon="📊", layout="wide")
BASE = api_base()


@st.cache_data(ttl=30, show_spinner="Loading from the gpuledger API…")
def fetch(base: str, path: str, **params):
    return get_json(base, path, TOKEN, **params)


st.title("gpuledger — GPU usage, cost and fairness")
days = st.sidebar.slider("Window (days)", min_value=1, max_value=14, value=7)
bucket = st.sidebar.selectbox("Utilisation bucket (minutes)", [15, 60, 240], index=1)
st.sidebar.caption(f"API: {BASE}")
signed_in = st.sidebar.text_input(
    "API token",
    type="password",
    key="token",
    help="An admin, reader or team token (`gpuledger token create`). Empty: the dashboard's own token, if any.",
)
try:
    PROXIED_USER, PROXIED = proxied_token(st.context.headers)
    TOKEN = signed_in or PROXIED or deployment_token()
    WHO = get_json(BASE, "/v1/whoami", TOKEN)
except NeedsToken as exc:
    st.error(f"That token is not accepted: {md(exc)}")
    st.stop()
except ApiUnavailable as exc:
    st.error(md(exc))
    st.stop()
by_proxy = f" for {md(PROXIED_USER)}, named by the site's proxy" if PROXIED and not signed_in else ""
st.sidebar.caption(f"Signed in as {md(WHO['actor'])} ({md(WHO['role'])}){by_proxy}")
if st.sidebar.button("Refresh"):
    st.cache_data.clear()


@st.cache_data(ttl=30, show_spinner="Loading from the gpuledger API…")
def fetch_batch(
    base: str, token: str | None, batch: tuple[tuple[str, str, tuple[tuple[str, object], ...]], ...]
) -> dict:
    """Calls at once: the API serves reads concurrently, so a page costs its slowest call, not their sum."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {name: pool.submit(get_json, base, path, token, **dict(params)) for name, path, params in batch}
        return {name: future.result() for name, future in futures.items()}


END = pd.Timestamp.now(tz="UTC").floor("min").isoformat()  # the window's end, the same for every call of a redraw
CALLS = calls(days, bucket, END)


def get(*names: str) -> dict:
    """The named calls' answers (one batch, cached); an unreachable API stops the page with its reason."""
    try:
        return fetch_batch(BASE, TOKEN, tuple((n, CALLS[n][0], tuple(sorted(CALLS[n][1].items()))) for n in names))
    except NeedsToken as exc:
        st.warning(f"Sign in with a token in the sidebar to see this page ({md(exc)}).")
        st.stop()
    except ApiUnavailable as exc:
        st.error(md(exc))
        st.stop()


def open_advice(advice: dict) -> tuple[list[dict], list[dict]]:
    """(advice with a number, pairs with not enough data)."""
    return (
        [r for r in advice["recommendations"] if r["status"] != "insufficient_data"],
        [r for r in advice["recommendations"] if r["status"] == "insufficient_data"],
    )


got = get("health", "util", "costs", "costs_before", "util_before", "nodes", "teams")  # the header, on every page
# one team -> colour map for every chart on every page: the sorted team list takes a fixed palette in order
COLOURS = team_colours([t["team"] for t in got["teams"]] + [t["team"] for t in got["costs"]["teams"]])
health, costs, costs_before = got["health"], got["costs"], got["costs_before"]
util, util_before = frame(got["util"], ("bucket",)), frame(got["util_before"])
nodes = frame(got["nodes"], ("last_seen",))

if health["samples"] == 0:
    st.warning("The store holds no samples yet. Start a collector (`gpuledger serve`) or run `gpuledger demo`.")
    st.stop()

if not nodes.empty and nodes["stale"].any():
    stale = nodes[nodes["stale"]]
    st.warning(f"{len(stale)} stale node(s), no batch for 3 intervals: " + ", ".join(map(md, stale["node"])))

# no bill line yet (samples newer than the server's first fold): an empty table with the columns the pages read
cost_df = frame(costs["teams"]) if costs["teams"] else pd.DataFrame({"team": [], "cost_usd": []})
idle_line = cost_df[cost_df["team"] == IDLE_CAPACITY]
cost_df["team"] = cost_df["team"].map(owner_label)


def shares(series: pd.DataFrame) -> tuple[float, float | None, float | None]:
    """Mean allocated, busy and used share of the GPUs present over a utilisation series; busy and used are None
    where no bucket had a utilisation reading (unknown, never zero)."""
    if series.empty or not series["total_gpus"].mean():
        return 0.0, None, None
    total = series["total_gpus"].mean()

    def known(column: str) -> float | None:
        values = series[column].dropna() if column in series else pd.Series(dtype=float)
        return float(values.mean() / total) if len(values) else None

    return float(series["allocated_gpus"].mean() / total), known("busy_gpus"), known("used_gpus")


def points(now: float | None, then: float | None) -> str | None:
    """A share's change in percentage points, or None (no arrow) where either side is unknown."""
    return f"{(now - then) * 100:+.1f} pts" if had_before and now is not None and then is not None else None


idle_before = sum(t["cost_usd"] for t in costs_before["teams"] if t["team"] == IDLE_CAPACITY)


def usd_change(now: float, then: float) -> str:
    """A signed dollar change, sign first so the delta arrow points the right way."""
    change = now - then
    return f"{'-' if change < 0 else '+'}${abs(change):,.0f}"


(mean_alloc, mean_busy, mean_used), (alloc_before, busy_before, used_before) = shares(util), shares(util_before)
had_before = costs_before["total_usd"] > 0
col1, col2, col3, col4, col5 = st.columns(5)
col1.metric(
    TOTAL_LABEL,
    f"${costs['total_usd']:,.0f}",
    help=f"every GPU present x the rate card, last {days} day(s), whether a job held it or not: it moves only when "
    f"GPUs are added, removed or repriced, or samples are missing (the change is against the {days} day(s) before). "
    "What jobs held is the teams' lines (Cost & waste); what no job held is the idle capacity beside it",
    delta=usd_change(costs["total_usd"], costs_before["total_usd"]) if had_before else None,
    delta_color="inverse",
)
col2.metric(
    IDLE_LABEL,
    f"${float(idle_line['cost_usd'].sum()):,.0f}",
    help=GLOSSARY["idle capacity"],
    delta=usd_change(float(idle_line["cost_usd"].sum()), idle_before) if had_before else None,
    delta_color="inverse",
)
col3.metric("GPUs allocated", f"{mean_alloc:.0%}", help=GLOSSARY["allocated"], delta=points(mean_alloc, alloc_before))
col4.metric(
    "GPUs busy",
    "no utilisation data" if mean_busy is None else f"{mean_busy:.0%}",
    help=GLOSSARY["busy"],
    delta=points(mean_busy, busy_before),
)
col5.metric(
    "Utilisation-weighted",
    "no utilisation data" if mean_used is None else f"{mean_used:.0%}",
    help=GLOSSARY["used"],
    delta=points(mean_used, used_before),
)
st.caption(f"Latest sample {md(health['latest_sample'])} · {health['samples']:,} samples in store")

# lazy tabs: only the page shown runs (and fetches), so a window change redraws one page, not eight
(tab_util, tab_teams, tab_jobs, tab_work, tab_inf, tab_cost, tab_fair, tab_recs, tab_whatif, tab_health,
 tab_nodes) = st.tabs(
    ["Overview", "Teams", "Jobs", "Workloads", "Inference", "Cost & waste", "Fairshare", "Recommendations",
     "What-if", "GPU health", "Nodes"],
    on_change="rerun",
    key="page",
)
def utc_minute(stamp: str) -> str:
    """An API instant as people read it on a page: to the minute, in UTC, saying so. (A page-local helper of this
    name once shadowed `when` below for every page that ran after it in the same script run.)"""
    return f"{pd.Timestamp(stamp):%Y-%m-%d %H:%M} UTC"


def when(label: str | None = None, **kwargs) -> dict:
    return st.column_config.DatetimeColumn(label, format="YYYY-MM-DD HH:mm", **kwargs)


# how every money, hour, share and time column is shown, by the API's column names
READABLE = {
    "cost_usd": st.column_config.NumberColumn("cost", format="$%.2f"),
    "idle_cost_usd": st.column_config.NumberColumn("idle cost", format="$%.2f"),
    "usd_per_gpu_hour": st.column_config.NumberColumn("rate ($/GPU-h)", format="$%.2f"),
    "gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.1f"),
    "dra_claims": st.column_config.TextColumn("DRA claims", help="the Kubernetes ResourceClaims its GPUs came "
                                              "through; blank: none (the device plugin)"),
    "used_gpu_hours": st.column_config.NumberColumn("used GPU-hours", format="%.1f"),
    "idle_gpu_hours": st.column_config.NumberColumn("idle GPU-hours", format="%.1f"),
    "unpriced_gpu_hours": st.column_config.NumberColumn("unpriced GPU-hours", format="%.1f"),
    "oversized_gpu_hours": st.column_config.NumberColumn("oversized GPU-hours", format="%.1f"),
    "idle_minutes": st.column_config.NumberColumn("idle minutes", format="%.0f"),
    "mean_util_pct": st.column_config.NumberColumn("mean util", format="%.0f%%"),
    "p95_util_pct": st.column_config.NumberColumn("p95 util", format="%.0f%%"),
    "peak_mem_mib": st.column_config.NumberColumn("peak memory (MiB)", format="%.0f"),
    "mem_total_mib": st.column_config.NumberColumn("card memory (MiB)", format="%.0f"),
    "start_ts": when("idle from"),
    "end_ts": when("idle until"),
    "first_ts": when("first seen"),
    "last_ts": when("last seen"),
    "idle_share": st.column_config.ProgressColumn("idle share", min_value=0.0, max_value=1.0, format="percent"),
    "job_id": "job",
    "fits": "fits in",
    "team": "team",
    "gpu_model": "GPU model",
    "gpus": st.column_config.NumberColumn("GPUs", format="%g"),
    "user": st.column_config.TextColumn("user", help=f"{BLANK}: not known (no pod or process owner)"),
    "mig_profile": st.column_config.TextColumn("MIG profile", help=f"{BLANK}: a whole GPU"),
    "waste": st.column_config.CheckboxColumn("waste", help="idle share at least 50%, or memory-oversized"),
    "jobs": st.column_config.NumberColumn("jobs", format="%d"),
    "idle_stretches": "idle stretches",
    "oversized_jobs": "oversized jobs",
    "cost_per_million_tokens": st.column_config.NumberColumn(
        "$ / M tokens", format="$%.3f", help=f"GPU cost of its pods over prompt + generated tokens; {BLANK}: unknown"),
    "cost_per_million_generated_tokens": st.column_config.NumberColumn("$ / M generated", format="$%.3f"),
    "cost_per_thousand_requests": st.column_config.NumberColumn("$ / 1k requests", format="$%.3f"),
    "requests_per_s": st.column_config.NumberColumn("requests/s", format="%.2f"),
    "generation_tokens_per_s": st.column_config.NumberColumn("generated tokens/s", format="%.0f"),
    "ttft_p95_s": st.column_config.NumberColumn("TTFT p95 (s)", format="%.3f"),
    "tpot_p95_s": st.column_config.NumberColumn("time/token p95 (s)", format="%.3f"),
    "e2e_p95_s": st.column_config.NumberColumn("latency p95 (s)", format="%.2f"),
    "e2e_p99_s": st.column_config.NumberColumn("latency p99 (s)", format="%.2f"),
    "slo_status": st.column_config.TextColumn("SLO", help=f"met, missed or unknown; {BLANK}: no objective set"),
    "tokens": st.column_config.NumberColumn("tokens", format="localized", help="prompt plus generated"),
    "requests": st.column_config.NumberColumn("requests", format="localized"),
}
# the columns people read first, first: cost and how well the GPUs were used, then who and when
JOB_COLUMNS = (
    "job_id",
    "team",
    "gpus",
    "gpu_model",
    "gpu_hours",
    "cost_usd",
    "mean_util_pct",
    "p95_util_pct",
    "sm_active",
    "tensor_active",
    "idle_share",
    "waste",
    "peak_mem_mib",
    "mem_total_mib",
    "user",
    "mig_profile",
    "dra_claims",
    "first_ts",
    "last_ts",
)
BLANK_JOB = st.column_config.TextColumn("job", help=f"{BLANK}: no job (unattributed workload)")


def column_labels(df: pd.DataFrame, **extra) -> dict:
    """A readable label (and format, where READABLE has one) for every column of a table."""
    return {c: READABLE.get(c, c.replace("_", " ")) for c in df.columns} | extra


def dollars(df: pd.DataFrame) -> dict:
    """Column formats showing every USD column (named *_usd or usd) in dollars to the cent."""
    def label(column: str) -> str:
        known = READABLE.get(column)  # a label, or a column config of its own (whose label is not a string here)
        return known if isinstance(known, str) else column.replace("_", " ")
    return {c: st.column_config.NumberColumn(label(c), format="dollar")
            for c in df.columns if c == "usd" or c.endswith("_usd")}


def show_named(df: pd.DataFrame, names: dict[str, str], digits: int = 2, **config) -> None:
    """A table of `df`'s columns `names` under the words given (the page's own labels), floats rounded, missing
    values as the blank mark."""
    st.dataframe(
        readable(df[list(names)].rename(columns=names), digits),
        hide_index=True,
        placeholder=BLANK,
        width="stretch",
        column_config=config,
    )


def show_topology(topology: dict) -> None:
    """The Nodes page's NVLink islands: per node how its GPUs are joined, how that is known, and since when; the
    nodes with no topology stored are named (their islands are unknown, and placement says so)."""
    st.subheader("Topology: NVLink islands")
    if not topology["nodes"]:
        st.info("No node has reported its GPU topology yet (the NVML agent reads it every 10 minutes; a "
                "dcgm-exporter page gives it from the GPUs' model).")
    else:
        rows = pd.DataFrame([{
            "node": n["node"], "islands": " + ".join(str(i["gpus"]) for i in n["islands"]),
            "largest_island": n["largest_island"], "gpus": n["gpus"], "basis": n["basis"], "source": n["source"],
            "clique_id": n["clique_id"], "rack": n["rack"], "observed_at": n["observed_at"][:16],
        } for n in topology["nodes"]])
        st.caption("An island is the GPUs of a node joined by NVLink (directly or through NVSwitch): a multi-GPU "
                   "job kept inside one talks at NVLink speed. Measured: asked of NVML (or dcgm-exporter's P2P "
                   "status) pair by pair; inferred: from the GPUs' model, as the notes say.")
        show_named(rows, {"node": "Node", "islands": "GPUs per island", "largest_island": "Largest island",
                          "gpus": "GPUs", "basis": "Basis", "source": "Source", "clique_id": "NVLink clique",
                          "rack": "Rack", "observed_at": "Since (UTC)"})
        notes = [f"{md(n['node'])}: {md(note)}" for n in topology["nodes"] for note in n["notes"]]
        if notes:
            with st.expander(f"Assumptions and contradictions ({len(notes)})"):
                for note in notes:
                    st.markdown(f"- {note}")
        for kind, label, word in (("cliques", "clique_id", "NVLink clique"), ("racks", "rack", "Rack")):
            for group in topology[kind]:
                st.caption(f"{word} {md(group[label])}: {', '.join(map(md, group['nodes']))}")
    if topology["missing"]:
        st.info(f"No topology stored for {', '.join(map(md, topology['missing']))}: their islands are unknown, "
                "and the placement API ranks them after nodes that keep a job inside one island.")


def show_held(inventory: dict) -> None:
    """Rows an agent sent for a GPU that is not its node's (registered to another node, or new on a node whose
    inventory is closed): held, not billed, until an admin moves the GPU (POST /v1/nodes/{node}/gpus)."""
    held = frame(inventory["held"], ("first_ts", "last_ts"))
    if held.empty:
        return
    st.subheader("Held: GPUs a node sent that are not its own")
    st.warning(f"{len(held)} GPU(s) sent by a node they are not registered to: their rows are held, not billed. "
               "If a GPU really moved, an admin registers it to its new node (POST /v1/nodes/{node}/gpus) and the "
               "held rows are billed; otherwise a node is claiming another's GPUs.")
    show_named(held, {"node": "Sent by", "gpu_uuid": "GPU", "reason": "Why held", "registered_to": "Registered to",
                      "rows": "Rows", "gpu_hours": "GPU-hours held", "first_ts": "From (UTC)",
                      "last_ts": "To (UTC)"})


def show_table(df: pd.DataFrame, order: list[str] | tuple[str, ...] | None = None, digits: int = 2, **extra) -> None:
    """A table as every page shows one: readable labels, floats rounded, empty text cells as the blank mark."""
    st.dataframe(
        readable(df, digits),
        hide_index=True,
        placeholder=BLANK,
        width="stretch",
        column_config=column_labels(df, **extra),
        column_order=[c for c in order if c in df] if order else None,
    )

with tab_util:
    if tab_util.open:
        got = get("daily", "waste")
        daily, waste = frame(got["daily"], ("day",)), got["waste"]
        st.subheader("Cost per day by team")
        if daily.empty:
            st.info("No cost in this window.")
        else:
            window_end = pd.Timestamp(END)
            reported = util["bucket"] if "bucket" in util else None  # the hours that hold data
            bars = daily_bars(daily, window_end - pd.Timedelta(days=days), window_end, reported, bucket)
            partial = bars[bars["partial"]].drop_duplicates("label")
            st.caption(
                "Stacked per UTC day: each team, the unattributed bucket, and the idle capacity (GPUs no job held)."
                + (
                    " Partial days (the window's or the data's first day, and today): "
                    + " and ".join(
                        f"{md(label.removesuffix(' · (partial)').replace(' · ', ' '))} ({hours:g} h)"
                        for label, hours in zip(partial["label"], partial["hours"])
                    )
                    + ". They are drawn lighter: their costs are for those hours only, not a whole day."
                    if not partial.empty
                    else ""
                )
            )
            st.vega_lite_chart(bars, daily_spec(bars, COLOURS), width="stretch")
        top = frame(waste["by_team"])
        if not top.empty and "idle_cost_usd" in top:
            st.subheader("Top waste")
            top = top.sort_values("idle_cost_usd", ascending=False).head(5)
            top["team"] = top["team"].map(owner_label)
            show_table(
                top,
                idle_gpu_hours=st.column_config.NumberColumn(
                    "idle GPU-hours", format="%.1f", help=GLOSSARY["idle allocation"]
                ),
            )
        st.subheader("Cluster utilization over time")
        if util.empty:
            st.info("No samples in this window.")
        else:
            st.caption(
                f"Per {bucket}-minute bucket. Used: {GLOSSARY['used']}. Busy as /metrics and the quota advice count "
                "it is the GPUs allocated and at or over the idle threshold."
            )
            st.line_chart(
                util.set_index("bucket")[["total_gpus", "allocated_gpus", "used_gpus"]].rename(
                    columns={
                        "total_gpus": "present",
                        "allocated_gpus": "allocated",
                        "used_gpus": "used (utilisation-weighted)",
                    }
                ),
                y_label="GPUs (average concurrent)",
            )

with tab_teams:
    if tab_teams.open:
        got = get("teams", "fairness", "advice")
        teams, fairness = frame(got["teams"]), got["fairness"]
        fair = frame(fairness["history"], ("hour",))
        recs, _ = open_advice(got["advice"])
        names = sorted(t for t in teams["team"].tolist()) if not teams.empty else []
        if not names:
            st.info("No team has a share or usage yet.")
        else:
            chosen = st.selectbox("Team", names, format_func=owner_label)
            try:
                usage = fetch(BASE, f"/v1/teams/{chosen}/usage", days=days, bucket_minutes=bucket, end=END)
                team_jobs = frame(
                    fetch(BASE, "/v1/jobs", days=days, team=chosen, limit=200, end=END), ("first_ts", "last_ts")
                )
            except ApiUnavailable as exc:
                st.error(md(exc))
                st.stop()
            totals = usage["totals"]
            t1, t2, t3, t4 = st.columns(4)
            t1.metric("Cost", f"${totals['cost_usd']:,.0f}")
            t2.metric("GPU-hours allocated", f"{totals['allocated_gpu_hours']:,.0f}", help=GLOSSARY["allocated"])
            coverage = totals.get("util_coverage")
            t3.metric(
                "Efficiency",
                "no utilisation data" if totals.get("efficiency") is None else f"{totals['efficiency']:.0%}",
                help="used GPU-hours (weighted by utilisation) over the allocated GPU-hours that had a utilisation "
                "reading" + (f"; measured on {coverage:.0%} of its GPU-hours" if coverage is not None and coverage < 1
                             else ""),
            )
            t4.metric("Jobs", f"{totals['jobs']:,}")
            series = frame(usage["series"], ("bucket",))
            quota = teams.set_index("team").get("quota_gpus", pd.Series(dtype=float)).get(chosen)
            if not series.empty:
                plot = series.set_index("bucket")[["allocated_gpus", "used_gpus"]]
                if quota is not None and pd.notna(quota):
                    plot["quota_gpus"] = float(quota)
                st.line_chart(
                    plot.rename(
                        columns={
                            "allocated_gpus": "allocated",
                            "used_gpus": "used (utilisation-weighted)",
                            "quota_gpus": "quota",
                        }
                    ),
                    y_label="GPUs (average concurrent)",
                )
            quotas = frame(usage["quotas"])
            per_model = frame(usage["model_series"], ("bucket",))
            if not quotas.empty:
                st.markdown(
                    "**Quota vs usage per GPU model** (the guarantee is promised, the limit the most it may hold)"
                )
                model = st.selectbox("GPU model", quotas["gpu_model"].tolist(), key="quota-model")
                held = per_model[per_model["gpu_model"] == model] if "gpu_model" in per_model else per_model
                if held.empty:
                    st.info(f"{md(owner_label(chosen))} held no {md(model)} in this window.")
                else:
                    row = quotas.set_index("gpu_model").loc[model]
                    quota = {
                        label: float(row[column])
                        for column, label in (("guarantee_gpus", "guarantee"), ("limit_gpus", "limit"))
                        if pd.notna(row[column])
                    }
                    window_end = pd.Timestamp(END)
                    reported = series["bucket"] if "bucket" in series else pd.Series([], dtype="datetime64[ns, UTC]")
                    line = model_gaps(held, reported, window_end - pd.Timedelta(days=days), window_end, bucket)
                    line["bucket"] = line["bucket"].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
                    st.vega_lite_chart(line, model_spec(model, quota), width="stretch")
                    st.caption(
                        f"Per {bucket}-minute bucket. A gap is a bucket the cluster sent no data for; 0 is a bucket "
                        f"it reported in which {md(owner_label(chosen))} held no {md(model)}. Dashed: the quota's "
                        "guarantee and limit."
                    )
            mine = fair[fair["team"] == chosen] if not fair.empty else fair
            if not mine.empty:
                st.markdown("**Fairshare** (the line at 0.5 is at share for Slurm's classic factor)")
                line = mine.set_index("hour")[["fairshare"]]
                if fairness["algorithm"] == "slurm_classic":
                    line["at share"] = 0.5
                st.line_chart(line)
            st.markdown("**Cost by GPU model**")
            show_table(frame(usage["by_model"]))
            st.markdown("**Jobs**")
            show_table(team_jobs, JOB_COLUMNS)
            theirs = [r for r in recs if r["team"] == chosen]
            st.markdown(f"**Recommendations** ({len(theirs)})")
            for r in theirs:
                st.markdown(f"- {md(r['kind'])}: {md(r['reason'])}")

with tab_jobs:
    if tab_jobs.open:
        st.subheader("Jobs")
        st.caption(
            "One row per job, most costly first, like jobstats. Waste: idle share at least 50% (an idle "
            "allocation), or peak memory under the oversized threshold of the card."
        )
        query = st.text_input("Search job id or user", "")
        try:
            listing = frame(
                fetch(BASE, "/v1/jobs", days=days, q=query or None, limit=1000, end=END), ("first_ts", "last_ts")
            )
        except ApiUnavailable as exc:
            st.error(md(exc))
            st.stop()
        if listing.empty:
            st.info("No job matches in this window.")
        else:
            listing["team"] = listing["team"].map(owner_label)
            show_table(listing, JOB_COLUMNS)
        st.subheader("Users")
        st.caption(
            "Per team and user, most costly first: what a team lead reads. Utilisation is over the GPU-hours with a "
            "reading (coverage); blank: none had one. `gpuledger notes` writes each owner the jobs that wasted GPUs."
        )
        users = frame(get("users")["users"])
        if users.empty:
            st.info("No job in this window.")
        else:
            users["team"] = users["team"].map(owner_label)
            show_table(users, ("team", "user", "jobs", "gpu_hours", "cost_usd", "mean_util_pct", "util_coverage",
                               "idle_gpu_hours", "flagged_jobs", "flagged_cost_usd"), **dollars(users),
                       util_coverage=st.column_config.NumberColumn("measured", format="percent"))
        st.subheader("Efficiency beyond GPU utilisation")
        st.caption(
            "GPU utilisation counts the time any kernel ran; SM activity is the share of the SMs' time spent "
            "working. A job at 100% utilisation with 10% SM activity keeps a tenth of the card busy. Means are over "
            "the GPU-seconds that read each field; blank: the GPU or its exporter does not report it (DCGM profiling "
            "fields, or NVML GPM on Hopper and later)."
        )
        eff = get("efficiency")["efficiency"]
        flagged = frame(eff["flagged"])
        per_team = frame(eff["teams"])
        if not per_team.empty:
            per_team["team"] = per_team["team"].map(owner_label)
            show_table(per_team, ("team", "gpu_hours", "mean_util_pct", "sm_active", "sm_occupancy", "tensor_active",
                                  "dram_active", "profiling_coverage", "nvlink_gb", "pcie_gb"), digits=3)
        if flagged.empty:
            st.info("No running or finished job in this window is flagged by its profiling readings.")
        else:
            st.markdown("**Jobs flagged by their profiling readings**")
            for flag, meaning in eff["flags"].items():
                st.caption(f"**{md(flag.replace('_', ' '))}**: {md(meaning)}")
            jobs_eff = frame(eff["jobs"])
            jobs_eff = jobs_eff[jobs_eff["flags"].map(len) > 0].copy()
            jobs_eff["flags"] = jobs_eff["flags"].map(lambda f: ", ".join(x.replace("_", " ") for x in f))
            jobs_eff["team"] = jobs_eff["team"].map(owner_label)
            show_table(jobs_eff, ("job_id", "team", "flags", "gpus", "gpu_model", "workload_class", "cost_usd",
                                  "util_on_profiled_pct", "sm_active", "tensor_active", "dram_active",
                                  "interconnect_gbps_per_gpu"), digits=3)

with tab_work:
    if tab_work.open:
        got_work = get("workloads", "queues", "job_coverage")
        work, queues, seen = got_work["workloads"], got_work["queues"], got_work["job_coverage"]
        st.subheader("Queue and outcomes")
        st.caption(
            "From the schedulers' job records (`gpuledger import sacct`, `serve --jobs-from prometheus`, the demo's "
            "simulated scheduler): waits from submission to start of the jobs that started in the window, jobs and "
            "GPU-hours by how they ended, and what waits now. Lost GPU-hours: jobs that failed, timed out, ran out of memory, lost their node or "
            "were preempted."
        )
        per_team = frame(work["by_team"])
        if per_team.empty:
            st.info(
                "No job records from a scheduler in this window, so no queue wait is known (never taken as zero). "
                "Load a site's history with `gpuledger import sacct FILE`."
            )
        else:
            per_team["team"] = per_team["team"].map(owner_label)
            shown = {
                "team": "team", "gpu_model": "GPU model", "jobs_started": "jobs started",
                "wait_p50_minutes": "wait p50 (min)", "wait_p95_minutes": "wait p95 (min)",
                "wait_max_minutes": "longest wait (min)", "jobs_finished": "jobs finished",
                "run_gpu_hours": "GPU-hours run", "lost_gpu_hours": "GPU-hours lost",
                "waiting_gpu_hours": "GPU-hours waiting", "restarts": "restarts", "pending_jobs": "waiting now",
                "pending_gpus": "GPUs waiting now", "longest_pending_minutes": "waiting longest (min)",
                "gang_jobs_waiting": "gang jobs waiting", "gang_gpus_waiting": "their GPUs",
            }
            show_named(per_team, shown, 1,
                       **{"GPU model": st.column_config.TextColumn("GPU model", help="any: the jobs named none"),
                          "gang jobs waiting": st.column_config.NumberColumn(
                              "gang jobs waiting", help="jobs of several GPUs, or several pods of one owner, that "
                                                        "must start together")})
            per_class = frame(work["by_class"])
            if not per_class.empty:
                st.subheader("Waits by workload class")
                st.caption("Training, fine-tuning, batch or online inference, interactive, agentic: from a label, "
                           "priority class, partition or QOS named so, else from the job's owner and name (the "
                           "docs/howto/jobs.md lists the rules); unclassified where nothing places it.")
                per_class["team"] = per_class["team"].map(owner_label)
                show_named(per_class, {"team": "team", "workload_class": "class", **{
                    k: v for k, v in shown.items() if k not in ("team", "gpu_model")}}, 1)
            ended = frame(work["outcomes"])
            if not ended.empty:
                st.subheader("Finished jobs by outcome")
                ended["team"] = ended["team"].map(owner_label)
                show_named(ended, {"team": "team", "gpu_model": "GPU model", "outcome": "outcome", "jobs": "jobs",
                                   "gpu_hours": "GPU-hours", "lost": "lost"}, 1,
                           lost=st.column_config.CheckboxColumn("lost", help="the work is lost"))
        usage = frame(work["class_usage"])
        if not usage.empty:
            st.subheader("Cost, efficiency and waste by workload class")
            st.caption("Every billed job in its class (a job without a scheduler record placed by what its GPUs "
                       "did, where a rule fits); efficiency is used over measured GPU-hours, waste the idle ones.")
            usage["team"] = usage["team"].map(owner_label)
            show_named(usage, {"team": "team", "workload_class": "class", "jobs": "jobs", "gpu_hours": "GPU-hours",
                               "cost_usd": "cost ($)", "efficiency": "efficiency", "idle_gpu_hours":
                               "idle GPU-hours", "idle_cost_usd": "idle cost ($)", "util_coverage": "measured",
                               "placed_by_telemetry": "placed by telemetry"}, 2)
        waiting = frame(work["waiting_now"], ("submit_ts",))
        st.subheader("Waiting now")
        if waiting.empty:
            st.caption("No job waits now.")
        else:
            waiting["team"] = waiting["team"].map(owner_label)
            cols = {"job_id": "job", "team": "team", "gpu_model": "GPU model", "gpus": "GPUs",
                    "wait_minutes": "waited (min)", "pending_reason": "why (the scheduler's reason)",
                    "workload_class": "class", "submit_ts": "submitted", "source": "scheduler"}
            show_named(waiting, cols, 0, submitted=when("submitted"))
        st.subheader("Quotas in the scheduler and in gpuledger's plan")
        in_force = frame(queues["queues"], ("read_at",))
        if in_force.empty:
            st.caption("No Kueue or KAI metrics read, so the quotas in force are not known here: run the server "
                       "with `--jobs-from prometheus`, or `gpuledger import kueue|kai FILE`.")
        else:
            st.caption("The quota each Kueue ClusterQueue (per flavor) or KAI queue runs, as its metrics say, "
                       "beside the guarantee in gpuledger's plan (accepted advice, else the config): `differs` is "
                       "drift to review before an export is applied.")
            show_named(in_force, {"scheduler": "scheduler", "queue": "queue", "flavor": "flavor", "team": "team",
                                  "gpu_model": "GPU model", "quota_in_force_gpus": "quota in force",
                                  "planned_gpus": "planned", "difference_gpus": "planned - in force",
                                  "usage_gpus": "GPUs used", "pending_workloads": "waiting", "status": "status",
                                  "read_at": "read at"}, 1, **{"read at": when("read at")})
            waits = frame(queues["admission_waits"])
            if not waits.empty:
                st.caption("Kueue's admission waits in the window (from its histogram; null: not enough reads)")
                show_named(waits, {"queue": "queue", "admitted": "admitted", "wait_mean_s": "mean wait (s)",
                                   "wait_p50_s": "p50 (s)", "wait_p95_s": "p95 (s)"}, 1)
        st.subheader("Scheduler and telemetry: where they disagree")
        st.caption(f"Counted and named, never resolved by a guess (grace {seen['grace_minutes']:g} min): "
                   f"{seen['scheduler_jobs']:,} GPU jobs in the schedulers' records, "
                   f"{seen['telemetry_jobs']:,} job ids in the GPU telemetry.")
        unrecorded = seen["samples_without_record"]
        st.dataframe(pd.DataFrame([
            {"what": "the scheduler says it runs, no recent GPU sample",
             "jobs": seen["running_without_samples"]["count"],
             "examples": ", ".join(seen["running_without_samples"]["examples"][:5])},
            {"what": "ran and ended in the window, no GPU sample at all",
             "jobs": seen["ended_without_samples"]["count"],
             "examples": ", ".join(seen["ended_without_samples"]["examples"][:5])},
            {"what": "GPU telemetry of a job no scheduler record knows", "jobs": unrecorded["count"],
             "examples": ", ".join(unrecorded["examples"][:5])},
        ]), hide_index=True, placeholder=BLANK, width="stretch")

with tab_inf:
    if tab_inf.open:
        answer = get("inference")["inference"]
        services, per_team = frame(answer["services"], ("first_ts", "last_ts")), frame(answer["teams"])
        st.subheader("Cost per million tokens by team")
        st.caption(
            "From the inference servers' own metrics (vLLM, Triton, TGI, SGLang) joined by pod to the GPU cost of "
            "the pods serving them, at the rate card. Tokens are prompt plus generated."
        )
        if services.empty:
            st.info(
                "No inference server's metrics in this window. Point gpuledger at them with `[[apps.targets]]` in "
                "the config (docs/howto/inference.md), then this page fills within a read."
            )
        else:
            per_team["team"] = per_team["team"].map(owner_label)
            priced = per_team.dropna(subset=["cost_per_million_tokens"])
            if not priced.empty:
                st.vega_lite_chart(priced[["team", "cost_per_million_tokens"]].round(4),
                                   team_bar_spec("cost_per_million_tokens", "USD per million tokens", COLOURS,
                                                 priced["team"]), width="stretch")
            show_table(per_team, ("team", "cost_per_million_tokens", "cost_usd", "tokens", "requests", "services",
                                  "services_without_cost"), digits=3)
            st.subheader("Services against their SLOs")
            missed = services[services["slo_status"] == "missed"]
            if len(missed):
                st.warning(f"{len(missed)} service(s) missed their latency objective in this window.")
            services["team"] = services["team"].map(owner_label)
            services["slo_missed"] = services["slo_missed"].map(lambda m: ", ".join(m) if len(m) else None)
            show_table(services, ("service", "team", "kind", "slo_status", "slo_missed", "cost_per_million_tokens",
                                  "cost_per_thousand_requests", "requests_per_s", "generation_tokens_per_s",
                                  "ttft_p95_s", "tpot_p95_s", "e2e_p95_s", "e2e_p99_s", "requests_waiting",
                                  "kv_cache_usage", "kv_cache_usage_max", "pods", "gpu_model", "cost_usd",
                                  "cost_note"), digits=3)
            if answer["unknown_slos"]:
                unknown = ", ".join(md(n) for n in answer["unknown_slos"])
                st.info(f"SLOs set for names no service or team has: {unknown}")

with tab_cost:
    if tab_cost.open:
        waste = get("waste")["waste"]
        st.subheader("Cost per team")
        st.vega_lite_chart(cost_df[["team", "cost_usd"]].round(2),
                           team_bar_spec("cost_usd", "USD", COLOURS, cost_df["team"]), width="stretch")
        show_table(cost_df)
        st.subheader("Waste per team")
        waste_df = frame(waste["by_team"])
        if not waste_df.empty:
            waste_df["team"] = waste_df["team"].map(owner_label)
        show_table(waste_df)
        st.subheader("Longest idle allocations")
        st.caption(
            f"Idle allocations: {GLOSSARY['idle allocation']}. Not the header's idle capacity ("
            f"{GLOSSARY['idle capacity'].split(':')[0]}): the two never overlap, so together they are all the idle "
            "GPU cost."
        )
        runs = frame(waste["idle_runs"], ("start_ts", "end_ts")).drop(columns="gpu_uuids", errors="ignore")
        first = [
            c
            for c in ("job_id", "team", "gpus", "idle_minutes", "idle_cost_usd", "idle_gpu_hours", "mean_util_pct")
            if c in runs
        ]
        show_table(runs, first + [c for c in runs.columns if c not in first], job_id=BLANK_JOB)
        st.subheader("Memory-oversized jobs")
        oversized = frame(waste["oversized_jobs"], ("first_ts", "last_ts"))
        if not oversized.empty:
            oversized["fits"] = oversized["fits"].map(lambda f: f["target"] if isinstance(f, dict) else None)
        first = [
            c
            for c in ("job_id", "team", "fits", "peak_mem_mib", "mem_total_mib", "p95_util_pct", "cost_usd")
            if c in oversized
        ]
        show_table(
            oversized,
            first + [c for c in oversized.columns if c not in first],
            fits=st.column_config.TextColumn(
                "fits in", help=f"the smallest MIG slice or card that fits; {BLANK}: none"
            ),
        )

        st.subheader("Ledger: periods and statements")
        periods = frame(get("periods")["periods"], ("start", "end", "closes_at", "closed_at"))
        if periods.empty:
            st.info("No period yet: the ledger starts with the first sample.")
        else:
            shown = periods[["period", "state", "start", "end", "closes_at", "closed_by", "total_usd"]]
            show_table(shown, **dollars(shown))
            chosen = st.selectbox("Statement", periods["period"].iloc[::-1].tolist(),
                                  help="a closed period's stored, final statement; an open period's draft so far")
            CALLS["statement"] = (f"/v1/ledger/statements/{quote(str(chosen))}", {})
            found = get("statement")["statement"]
            said = (f"final, closed {utc_minute(found['closed_at'])} by {md(found['closed_by'])}"
                    if found["state"] == "closed" else f"a draft: open until {utc_minute(found['closes_at'])}")
            st.caption(f"{md(chosen)}: {said} · total ${found['total_usd']:,.2f} · {md(found['split'])} · each "
                       "line names the rate card version that priced it")
            teams_df = frame(found["teams"])
            if not teams_df.empty:
                teams_df["team"] = teams_df["team"].map(owner_label)
            show_table(teams_df, **dollars(teams_df))
            lines_df = frame(found["lines"]).drop(columns=["rate_from"], errors="ignore")
            if not lines_df.empty:
                lines_df["team"] = lines_df["team"].map(owner_label)
            show_table(lines_df, **dollars(lines_df))
            if found["adjustments"]:
                adjustments = frame(found["adjustments"], ("made_at",))
                adjustments["team"] = adjustments["team"].map(owner_label)
                show_table(adjustments, **dollars(adjustments))
        st.subheader("Budgets and alerts")
        budgets = frame(get("budgets")["budgets"], ("period_end",))
        if budgets.empty:
            st.info("No team has a budget: set one under [budgets] in the config or with PUT /v1/budgets/{team}.")
        else:
            show_table(budgets.drop(columns=["period_end"]), **dollars(budgets))
            st.caption("Forecast: the spend so far plus, for each hour left in the period, the team's mean cost at "
                       "that hour of the week over the last seven days; none with under a day of history.")
        raised = frame(get("alerts")["alerts"], ("fired_at", "resolved_at"))
        if raised.empty:
            st.caption("No alert raised yet (budget spend and forecast, jobs holding GPUs idle: [alerts]).")
        else:
            show_table(raised[["kind", "team", "subject", "fired_at", "resolved_at"]])

with tab_fair:
    if tab_fair.open:
        fairness = get("fairness")["fairness"]
        fair = frame(fairness["history"], ("hour",))
        st.subheader(
            f"Fairshare factor per team ({FAIRSHARE_TITLES.get(fairness['algorithm'], md(fairness['algorithm']))})"
        )
        if fair.empty:
            st.info("No team with a share has usage in this window.")
        else:
            wide = fair.pivot_table(index="hour", columns="team", values="fairshare")
            wide.columns = [owner_label(t) for t in wide.columns]
            st.line_chart(wide, y_label="fairshare factor", color=[colour_of(COLOURS, t) for t in wide.columns])
            st.caption(
                f"{len(wide):,} hours from {wide.index.min():%Y-%m-%d %H:%M} to {wide.index.max():%Y-%m-%d %H:%M} "
                "UTC; each hour's factor comes from the algorithm's whole memory, so the window only chooses "
                "which hours are shown. The table is the last hour's."
            )
            shown = [
                c
                for c in ("team", "norm_share", "norm_usage", "level_fs", "weight", "usage", "fairshare", "over_served")
                if c in fair and fair[c].notna().any()
            ]
            latest = fair.sort_values("hour").groupby("team").tail(1)[shown]
            st.dataframe(
                readable(latest, 3),
                hide_index=True,
                placeholder=BLANK,
                width="stretch",
                column_config={
                    "team": "team",
                    "norm_share": st.column_config.NumberColumn("share (normalised)", format="%.3f"),
                    "norm_usage": st.column_config.NumberColumn("usage (normalised)", format="%.3f"),
                    "level_fs": st.column_config.NumberColumn("level fairshare", format="%.3f"),
                    "weight": st.column_config.NumberColumn(format="%.3f"),
                    "usage": st.column_config.NumberColumn("usage (GPU-hours, decayed)", format="%.1f"),
                    "fairshare": st.column_config.NumberColumn(
                        format="%.3f", help=FAIRSHARE_TITLES.get(fairness["algorithm"], "")
                    ),
                    "over_served": "over-served",
                },
            )

with tab_recs:
    if tab_recs.open:
        got = get("advice", "decided")
        advice, decided = got["advice"], got["decided"]
        recs, no_data = open_advice(advice)
        st.subheader("Recommendations")
        window = advice["policy_window"]
        st.caption(
            f"From the policy window {md(window['start'][:16])} to {md(window['end'][:16])} UTC, whatever window the "
            "sidebar shows. A quota is per team and GPU model: the guarantee is promised (reclaimed from others "
            "when the team asks), the limit is the most it may hold, borrowing idle GPUs. Decide with "
            "`gpuledger decide ID accept|reject|applied --by NAME` or POST /v1/recommendations/ID/decision."
        )
        if not recs:
            st.success("Nothing to change: quotas match demand and no GPU is held idle.")
        else:

            def impact(r: dict) -> float:
                """$ per week freed or granted, where the evidence says it."""
                return float(r["evidence"].get("effect_usd_per_week") or 0.0)

            ranked = sorted(recs, key=impact, reverse=True)
            savings = advice.get("potential_savings") or {}
            if savings.get("advice"):
                total = savings.get("usd_per_week")
                st.metric(
                    "Potential savings",
                    BLANK if total is None else f"${total:,.0f} per week",
                    help="Each group of alternatives (advice wanting the same free GPUs or the same job) counted "
                    f"once: {savings.get('basis', '')}. {len(savings.get('left_out') or [])} priced advice not "
                    "counted because an alternative in its group is worth more.",
                )
            table = pd.DataFrame(
                [
                    {
                        "id": r["id"],
                        "status": r["status"],
                        "kind": r["kind"],
                        "team": owner_label(r["team"]),
                        "GPU model": r.get("gpu_model"),
                        "job": r.get("job_id"),
                        "change": change(r["kind"], r["action"]),
                        "$ per week": impact(r) or None,
                        "alternatives": alternative(r.get("alternatives")),
                        "reason": r["reason"],
                    }
                    for r in ranked
                ]
            )
            st.dataframe(
                readable(table),
                hide_index=True,
                placeholder=BLANK,
                width="stretch",
                column_config={
                    "$ per week": st.column_config.NumberColumn(
                        "$ per week", format="$%.2f", help="freed or granted per week where the advice prices it"
                    ),
                    "GPU model": st.column_config.TextColumn("GPU model", help=f"{BLANK}: every model"),
                    "job": st.column_config.TextColumn("job", help=f"{BLANK}: the advice is about a team, not a job"),
                    "alternatives": st.column_config.TextColumn(
                        "alternatives",
                        help="advice wanting the same free GPUs or job share a group: only one set of them can be "
                        "done; 'counted' = in the potential-savings total",
                    ),
                },
            )
            token = TOKEN if WHO["may_decide"] else None
            if not token:
                st.caption("Sign in with an admin token (sidebar) to accept or reject advice here.")
            for r in ranked[:20]:
                with st.expander(f"{md(r['kind'])}: {md(r['reason'])}"):
                    st.markdown(
                        f"**{md(ADVICE_KINDS.get(r['kind'], r['kind']))}**: {md(change(r['kind'], r['action']))}"
                    )
                    st.markdown(
                        "  \n".join(
                            f"**{md(k.replace('_', ' '))}**: {md(words(v))}" for k, v in r["action"].items()
                        )
                    )
                    evidence = "; ".join(
                        f"{md(k.replace('_', ' '))}: {md(words(v))}" for k, v in r["evidence"].items()
                    )
                    st.caption(f"Evidence: {evidence or BLANK}")
                    if token and r["status"] == "proposed":
                        accept, reject = st.columns(2)
                        for column, choice in ((accept, "accept"), (reject, "reject")):
                            if column.button(choice.capitalize(), key=f"{choice}-{r['id']}"):
                                try:
                                    post_decision(BASE, r["id"], choice, "dashboard", token)
                                    st.cache_data.clear()
                                    st.success(f"{choice}ed {md(r['id'])}")
                                except ApiUnavailable as exc:
                                    st.error(md(exc))
        if no_data:
            st.warning(
                f"{len(no_data)} team and GPU model pair(s) get no quota advice for lack of data: "
                + md(no_data[0]["reason"])
                + ("; ..." if len(no_data) > 1 else "")
            )
        st.subheader("Decision history")
        if not decided:
            st.info("No recommendation has been stored yet.")
        else:
            history = frame(
                [
                    {
                        "created": r["created"],
                        "status": r["status"],
                        "kind": r["kind"],
                        "team": owner_label(r["team"]),
                        "GPU model": r.get("gpu_model"),
                        "decided by": r["decided_by"],
                        "decided at": r["decided_at"],
                        "note": r["note"],
                        "id": r["id"],
                    }
                    for r in decided
                ],
                ("created", "decided at"),
            )
            history["decided at"] = history["decided at"].dt.strftime("%Y-%m-%d %H:%M").fillna(BLANK)
            st.dataframe(
                readable(history),
                hide_index=True,
                placeholder=BLANK,
                width="stretch",
                column_config={
                    "created": when("created"),
                    "decided at": st.column_config.TextColumn("decided at", help=f"{BLANK}: not decided yet"),
                    "decided by": st.column_config.TextColumn("decided by", help=f"{BLANK}: not decided yet"),
                    "note": st.column_config.TextColumn("note", help=f"{BLANK}: none given"),
                    "GPU model": st.column_config.TextColumn("GPU model", help=f"{BLANK}: every model"),
                },
            )

# the scheduler models a what-if replays under (policies/whatif); None leaves the choice to the site's config
WHATIF_MODELS = {None: "the site's ([whatif] model)", "kueue": "Kueue", "kai": "KAI", "slurm": "Slurm"}
# per team, the figures shown under the quotas in force and under the proposal: the API's name -> the page's words
WHATIF_FIGURES = {
    "wait_p50_minutes": "wait p50 (min)",
    "wait_p95_minutes": "wait p95 (min)",
    "completion_p95_hours": "completion p95 (h)",
    "gpu_hours": "GPU-hours",
    "preemptions": "preemptions",
    "still_waiting": "still waiting",
}
WHATIF_HELP = {
    "wait p50 (min)": "from submission to first start; a job still waiting counts what it had waited by the "
    f"replay's end; {BLANK}: no job",
    "wait p95 (min)": f"as the p50; {BLANK}: no job",
    "completion p95 (h)": f"from submission to the end of the jobs that ended; {BLANK}: none ended",
    "GPU-hours": "served in the window",
    "preemptions": "jobs evicted to give GPUs back to a team's guarantee",
    "still waiting": "jobs not started by the replay's end (the window, then as long again to drain)",
}
# the quota editor's columns, as the API names them, and the page's words for them
WHATIF_QUOTA_COLUMNS = {
    "team": "team",
    "gpu_model": "GPU model",
    "current_guarantee_gpus": "guarantee in force",
    "current_limit_gpus": "limit in force",
    "proposed_guarantee_gpus": "proposed guarantee",
    "proposed_limit_gpus": "proposed limit",
}


@st.cache_data(ttl=30, show_spinner="Replaying the window's jobs…")
def ask(base: str, token: str | None, path: str, body: dict) -> dict:
    """A question to the API: it changes nothing, so the same question is answered once within the cache's life."""
    return post_json(base, path, body, token)


def digest(value: object) -> str:
    """A short fingerprint of what an editor was seeded with, for its key: a new seed starts without old edits."""
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def whatif_teams(answer: dict) -> pd.DataFrame:
    """Per team (all teams last) each figure under the quotas in force, then under the proposal; a figure the
    replay could not give (no job, none ended) stays missing, never 0."""
    now, then = (answer["configurations"][c]["teams"] for c in ("current", "proposed"))
    rows = []
    for team in sorted(set(now) | set(then), key=lambda t: (t == "all", owner_label(t))):
        mine, theirs = now.get(team) or {}, then.get(team) or {}
        row = {"team": "all teams" if team == "all" else owner_label(team),
               "jobs": mine.get("jobs", theirs.get("jobs"))}
        for figure, label in WHATIF_FIGURES.items():
            row[f"{label}: current"] = mine.get(figure)
            row[f"{label}: proposed"] = theirs.get(figure)
        rows.append(row)
    return pd.DataFrame(rows)


def share(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0%}"


def show_backtest(tested: dict | None) -> None:
    """Whether the replay of the quotas in force gives back what was measured: without that, the differences
    below are between two fictions, so an uncalibrated replay is said first and loudly."""
    if not tested:
        st.warning("No backtest: the replay of the quotas in force could not be checked against the record.")
        return
    tol = tested["tolerance"]
    rows = [{"team": owner_label(r["team"]) if r["team"] != "all" else "all teams",
             "jobs": r["jobs"]["measured"], "p95 wait measured (min)": r["wait_p95_minutes"]["measured"],
             "p95 wait replayed (min)": r["wait_p95_minutes"]["replayed"],
             "error (min)": r["p95_error_minutes"],
             "judged": ("within" if r.get("within_tolerance") else "OFF") if r["judged"] else "too few jobs"}
            for r in tested["teams"]]
    text = (f"tolerance max({tol['minutes']:g} min, {tol['fraction']:.0%} of the measured p95 wait), teams with "
            f"{tol['min_jobs']:g} or more jobs")
    if tested["calibrated"]:
        st.success(f"Backtest: the replay of the quotas in force reproduces the measured waits ({text}).")
    else:
        st.warning(f"Backtest failed: the replay of the quotas in force does not reproduce the measured waits ({text}); "
                 "the differences below are not effects to act on.")
    with st.expander("Backtest per team", expanded=not tested["calibrated"]):
        st.dataframe(readable(pd.DataFrame(rows), 1), hide_index=True, placeholder=BLANK, width="stretch")


def show_whatif(answer: dict) -> None:
    """A what-if's answer: per team current -> proposed, utilisation under both, what changed, what was assumed."""
    st.caption(
        f"{answer['jobs']:,} jobs replayed from {md(str(answer['start'])[:16])} to {md(str(answer['end'])[:16])} "
        f"UTC through the {md(WHATIF_MODELS.get(answer['model'], answer['model']))}-like model, "
        f"in {answer['seconds']:.2f} s."
    )
    show_backtest(answer.get("backtest"))
    table = whatif_teams(answer)
    counts = ("preemptions", "still waiting")
    st.dataframe(
        readable(table, 1),
        hide_index=True,
        placeholder=BLANK,
        width="stretch",
        column_config={
            "jobs": st.column_config.NumberColumn("jobs", format="%d", help="submitted in the window"),
            **{
                column: st.column_config.NumberColumn(
                    column, format="%d" if column.split(": ")[0] in counts else "%.1f",
                    help=WHATIF_HELP[column.split(": ")[0]],
                )
                for column in table.columns
                if ": " in column
            },
        },
    )
    before, after = (answer["configurations"][c]["utilisation"] for c in ("current", "proposed"))
    u1, u2 = st.columns(2)
    u1.metric("Utilisation, quotas in force", share(before), help="GPU-hours served over GPU-hours present")
    u2.metric(
        "Utilisation, proposal",
        share(after),
        help="GPU-hours served over the proposal's GPU-hours present",
        delta=f"{(after - before) * 100:+.1f} pts" if before is not None and after is not None else None,
    )
    now, then = answer["capacity"]["current"], answer["capacity"]["proposed"]
    moved = [f"{md(m)} {now.get(m, 0)} → {then.get(m, 0)}" for m in sorted({*now, *then}) if now.get(m, 0) !=
             then.get(m, 0)]
    st.caption(
        "GPUs present: " + (", ".join(f"{md(m)} {n}" for m, n in sorted(now.items())) or "none")
        + ("; the proposal's: " + ", ".join(moved) if moved else "; the proposal keeps them")
    )
    changed = frame([q for q in answer["quotas"] if q.get("changed")])
    if not changed.empty:
        st.markdown(f"**Quotas the proposal changes** ({len(changed)})")
        changed["team"] = changed["team"].map(owner_label)
        show_named(changed, WHATIF_QUOTA_COLUMNS, 2)
    if answer["assumptions"]:
        st.markdown("**What the replay assumed** where the job records leave it open")
        st.markdown("\n".join(f"- {md(a['meaning'])} ({a['jobs']:,} job(s))" for a in answer["assumptions"]))
    if answer["notes"]:
        st.markdown("**Notes**")
        st.markdown("\n".join(f"- {md(note)}" for note in answer["notes"]))


# what each forecast status means, in the page's words (analytics/forecast.py STATUSES)
FORECAST_STATUS = {
    "forecast": "saturates",
    "saturated": "saturated now",
    "not_saturating": "not saturating",
    "insufficient_data": "insufficient data",
}


def show_forecast() -> None:
    """The capacity forecast (GET /v1/capacity/forecast): per GPU model its status and weeks to saturation, then
    the weekly demand it rests on. A model without enough history shows its reason as information, not an error:
    too short a history is a state of the cluster, not a fault."""
    path, params = CALLS["forecast"]
    try:
        answer = fetch(BASE, path, **params)
    except NeedsToken as exc:
        st.warning(f"Sign in with a token in the sidebar to see the capacity forecast ({md(exc)}).")
        return
    except ApiUnavailable as exc:
        st.error(md(exc))
        return
    st.subheader("Capacity: weeks until each GPU model is full")
    st.caption(
        f"Busy plus queued GPU-hours per whole week over the {answer['weeks']} weeks to "
        f"{md(str(answer['end'])[:16])} UTC, a least-squares trend through them, and the weeks until it reaches the "
        "model's GPUs x 168 hours, with the range the trend's 80% interval implies. The monthly capacity review "
        "(`gpuledger capacity`) prints the same answer."
    )
    models, weeks = forecast_frames(answer)
    if models.empty:
        st.info("No GPU present at the window's end: nothing to forecast.")
        return
    models["status"] = models["status"].map(lambda s: FORECAST_STATUS.get(s, s))
    show_named(
        models, FORECAST_COLUMNS, 1,
        **{
            "of capacity": st.column_config.NumberColumn(
                "of capacity", format="percent", help=f"the trend's demand now over capacity; {BLANK}: no trend"),
            "weeks to saturation": st.column_config.NumberColumn(
                "weeks to saturation", format="%.1f",
                help=f"at the current growth; {BLANK}: not saturating or no trend"),
            "latest (80%)": st.column_config.NumberColumn(
                "latest (80%)", format="%.1f", help=f"at the low end of the growth's range; {BLANK}: never there"),
            "around": when("around", help=f"{BLANK}: not saturating, no trend, or over a century away"),
        },
    )
    for model in answer["models"]:
        if model["status"] == "insufficient_data":
            st.info(f"**{md(model['gpu_model'])}**: {md(model['reason'])}")
        if model.get("basis_reason"):
            st.caption(f"{md(model['gpu_model'])}: {md(model['basis_reason'])}")
    with st.expander("Weekly demand per GPU model (GPU-hours)"):
        show_named(
            weeks,
            {"gpu_model": "GPU model", "week_start": "week of", "covered_hours": "hours with samples",
             "fitted": "in the trend", "allocated_gpu_hours": "allocated", "busy_gpu_hours": "busy",
             "queued_gpu_hours": "queued", "demand_gpu_hours": "demand"},
            1,
            **{"week of": when("week of"),
               "in the trend": st.column_config.CheckboxColumn("in the trend", help="a whole week: samples in 90% "
                                                               "of its hours; partial weeks are shown, not fitted"),
               "demand": st.column_config.NumberColumn("demand", format="%.1f", help=f"busy (or allocated, where the "
                                                       f"model has no utilisation reading) + queued; {BLANK}: no "
                                                       "sample that week")},
        )
    for note in answer["notes"]:
        st.caption(f"Note: {md(note)}")
    st.divider()


with tab_whatif:
    if tab_whatif.open:
        show_forecast()
        st.subheader("What-if: the window's jobs replayed under other quotas")
        st.caption(
            "The scheduler's recorded jobs of the window replayed twice on the same clock through a model of the "
            "scheduler: under the quotas in force, and under a proposal (the open recommendations if chosen, then "
            "the edits below). Nothing is stored or applied: it is a question to POST /v1/whatif."
        )
        c1, c2, c3 = st.columns(3)
        model = c1.selectbox("Scheduler model", list(WHATIF_MODELS), format_func=WHATIF_MODELS.get)
        length = c2.number_input("Replay window (days)", min_value=1, max_value=90, value=days, step=1,
                                 help="ending now; the sidebar's window unless changed here")
        from_advice = c3.checkbox("Start from the open recommendations", value=True,
                                  help="else the proposal starts from the quotas in force")
        question = {"start": (pd.Timestamp(END) - pd.Timedelta(days=int(length))).isoformat(), "end": END,
                    "use_recommendations": from_advice} | ({"model": model} if model else {})
        try:
            seed = ask(BASE, TOKEN, "/v1/whatif", question)
        except NeedsToken as exc:
            st.warning(f"Sign in with a token in the sidebar to see this page ({md(exc)}).")
            st.stop()
        except Unanswerable as exc:  # nothing to replay yet (no job records in the window): a state, not a fault
            st.info(f"Nothing to replay: {md(exc)}")
            st.stop()
        except ApiUnavailable as exc:
            st.error(md(exc))
            st.stop()
        seeded = pd.DataFrame(seed["quotas"], columns=list(WHATIF_QUOTA_COLUMNS))
        numbers = [c for c in WHATIF_QUOTA_COLUMNS if c.endswith("_gpus")]
        seeded[numbers] = seeded[numbers].astype(float)  # a quota not set is missing (blank), never 0
        seeded["team"] = seeded["team"].map(owner_label)
        present = seed["capacity"]["proposed"]
        inventory = pd.DataFrame({"gpu_model": list(present), "gpus": list(present.values())}, dtype=object)
        inventory["gpus"] = inventory["gpus"].astype(float)
        with st.form("whatif-edits", border=False):
            left, right = st.columns([3, 1])
            with left:
                st.markdown("**Quotas** per team and GPU model: edit a proposed guarantee or limit")
                edited = st.data_editor(
                    seeded,
                    key=f"whatif-quotas-{digest(seed['quotas'])}",
                    hide_index=True,
                    width="stretch",
                    placeholder=BLANK,
                    disabled=[c for c in WHATIF_QUOTA_COLUMNS if not c.startswith("proposed_")],
                    column_config={
                        "team": "team",
                        "gpu_model": "GPU model",
                        **{
                            c: st.column_config.NumberColumn(
                                WHATIF_QUOTA_COLUMNS[c], format="%g", min_value=0.0,
                                help=f"GPUs; {BLANK}: none set" + ("" if c.startswith("current_") else
                                                                   " (an emptied cell is no edit)"),
                            )
                            for c in numbers
                        },
                    },
                )
            with right:
                st.markdown("**GPUs** per model in the proposal")
                capacity = st.data_editor(
                    inventory,
                    key=f"whatif-capacity-{digest(present)}",
                    hide_index=True,
                    width="stretch",
                    num_rows="dynamic",
                    column_config={
                        "gpu_model": st.column_config.TextColumn("GPU model", help="add a row to try a model"),
                        "gpus": st.column_config.NumberColumn("GPUs", format="%d", min_value=0, step=1,
                                                              help="0 or a deleted row retires the model"),
                    },
                )
            st.form_submit_button("Replay with these edits")
        edits, gpus = quota_edits(seed["quotas"], edited), capacity_changes(present, capacity)
        answer = seed
        if edits or gpus:
            st.caption(
                f"Edited: {sum(len(m) for m in edits.values())} quota(s) and {len(gpus)} GPU model(s) "
                "beyond the proposal they were seeded from."
            )
            try:
                answer = ask(BASE, TOKEN, "/v1/whatif", question | {"edits": edits, "capacity": gpus})
            except NeedsToken as exc:
                st.warning(f"Sign in with a token in the sidebar to ask this ({md(exc)}).")
                answer = None
            except ApiUnavailable as exc:
                st.error(md(exc))
                answer = None
        if answer is not None:
            show_whatif(answer)

with tab_health:
    if tab_health.open:
        gpu_health = get("gpu_health")["gpu_health"]
        st.subheader("GPU health events")
        st.caption(
            "XID errors (the driver's error codes), throttling starts (heat, power cap, hardware slowdown), ECC "
            "and row-remap increases, each joined to the job that held the GPU. Events reach "
            f"{md(gpu_health['events_until'] or 'nothing yet')} (derived as minutes are folded)."
        )
        by_gpu, by_job = frame(gpu_health["by_gpu"], ("last_event",)), frame(gpu_health["by_job"], ("last_event",))
        if by_gpu.empty:
            st.success(f"No health event in the last {days} day(s).")
        else:
            kinds = [
                "xid",
                "ecc_dbe",
                "row_remap_uncorr",
                "row_remap_failure",
                "thermal_throttle",
                "power_throttle",
                "hw_slowdown",
                "ecc_sbe",
                "row_remap_corr",
            ]
            shown = {
                "node": "Node",
                "gpu_index": "GPU",
                "gpu_model": "Model",
                "last_xid": "Last XID",
                **{k: k.replace("_", " ").capitalize() for k in kinds},
                "jobs_hit": "Jobs hit",
                "last_event": "Last event",
            }
            st.markdown("**GPUs**, most recent first")
            show_named(by_gpu, shown, **{
                "Last XID": st.column_config.NumberColumn("Last XID", format="%d", help=f"{BLANK}: no XID error"),
                "Last event": when("Last event"),
            })
            if not by_job.empty:
                st.markdown("**Jobs that held a GPU when an event hit it**")
                jobs = by_job.assign(
                    xid_codes=by_job["xid_codes"].map(
                        lambda c: ", ".join(str(int(x)) for x in c) if isinstance(c, list) and c else ""
                    )
                )
                cols = {
                    "job_id": "Job",
                    "team": "Team",
                    "job_state": "State",
                    "events": "Events",
                    "xid_codes": "XID codes",
                    "thermal_throttle": "Thermal throttle",
                    "power_throttle": "Power throttle",
                    "gpus_affected": "GPUs",
                    "last_event": "Last event",
                }
                show_named(jobs, cols, **{
                    "Last event": when("Last event"),
                    "Job": st.column_config.TextColumn("Job", help=f"{BLANK}: no job"),
                })
            events = frame(gpu_health["events"], ("ts",))
            with st.expander(f"The {len(events)} newest events"):
                show_table(
                    events,
                    ["ts", "node", "gpu_index", "kind", "code", "meaning", "job_id", "team"],
                    ts=st.column_config.DatetimeColumn("at", format="YYYY-MM-DD HH:mm:ss"),
                    gpu_index=st.column_config.NumberColumn("GPU", format="%d"),
                    code=st.column_config.NumberColumn("code", format="%d"),
                    job_id=st.column_config.TextColumn("job", help=f"{BLANK}: no job held the GPU"),
                    team=st.column_config.TextColumn("team", help=f"{BLANK}: no job held the GPU"),
                )

with tab_nodes:
    if tab_nodes.open:
        got = get("fragments", "gpus", "coverage", "topology", "inventory")
        fragments, gpu_view = got["fragments"], got["gpus"]
        coverage = frame(got["coverage"])
        st.subheader("Fragmentation: idle GPU the typical job cannot use")
        if not fragments["enough_data"]:
            st.info(f"Not enough data to measure fragmentation: {md(fragments['reason'])}.")
        else:
            f1, f2, f3 = st.columns(3)
            f1.metric(
                "Fragmented GPUs",
                f"{fragments['fragmented_gpus']:.1f} of {fragments['idle_gpus']:.1f} idle",
                help="FGD (Weng et al., ATC '23): idle GPU that the job shapes covering 95% of this window's jobs "
                "could not use (too little left on a GPU, too few free GPUs on the node)",
            )
            f2.metric("Share of idle GPU fragmented", f"{fragments['fragmented_share_of_idle']:.0%}")
            f3.metric(
                "Stranded capacity cost",
                f"${fragments['stranded_usd_per_day']:,.0f} per day",
                help="fragmented GPUs x their model's rate x 24 h",
            )
            per_node = frame(fragments["nodes"])
            shown = {
                "node": "Node",
                "gpu_model": "Model",
                "gpus": "GPUs",
                "idle_gpus": "Idle GPUs",
                "fragmented_gpus": "Fragmented GPUs",
                "fragmented_share": "Fragmented share of idle",
                "stranded_usd_per_day": "Stranded $/day",
            }
            show_named(per_node, shown, **{
                "Idle GPUs": st.column_config.NumberColumn(format="%.2f"),
                "Fragmented GPUs": st.column_config.NumberColumn(format="%.2f"),
                "Fragmented share of idle": st.column_config.ProgressColumn(
                    min_value=0.0, max_value=1.0, format="percent"
                ),
                "Stranded $/day": st.column_config.NumberColumn(format="$%.2f"),
            })
            history = frame(fragments["history"], ("ts",))
            if not history.empty:
                st.line_chart(
                    history.set_index("ts")[["idle_gpus", "fragmented_gpus"]].rename(
                        columns={"idle_gpus": "idle GPUs", "fragmented_gpus": "fragmented GPUs"}
                    ),
                    y_label="GPUs",
                )
        show_topology(got["topology"])
        show_held(got["inventory"])
        st.subheader("GPUs")
        inventory = frame(gpu_view["holders"])
        if inventory.empty:
            st.info("No GPU has reported in the last two hours.")
        else:
            inventory["team"] = inventory["team"].map(lambda t: owner_label(t) if isinstance(t, str) else "free")
            st.caption(f"Every GPU and who holds it at {md(str(gpu_view['at'])[:16])} UTC.")
            show_table(
                inventory,
                job_id=st.column_config.TextColumn("held by", help=f"{BLANK}: free, no job holds it"),
                gpu_uuid="GPU",
                fraction=st.column_config.NumberColumn("share held", format="%.2f", help="1: the whole GPU"),
                dra_claim=st.column_config.TextColumn("DRA claim", help=f"{BLANK}: held without a DRA claim"),
            )
        points = frame(gpu_view["series"], ("bucket",))
        if not points.empty:
            labels = {
                "util_pct": "utilisation (%)",
                "mem_used_mib": "memory used (MiB)",
                "power_w": "power (W)",
                "temp_c": "hottest temperature (°C)",
                "sm_active": "SM active (0..1; blank: not reported)",
                "tensor_active": "tensor pipes active (0..1; blank: not reported)",
            }
            shown = st.selectbox("Heatmap of", list(labels), format_func=labels.get)
            step = CALLS["gpus"][1]["bucket_minutes"]
            cells = heatmap(points, shown, step)
            if not cells.empty:
                st.caption(f"One cell per GPU and {step}-minute bucket; blank: no sample in that bucket.")
                st.vega_lite_chart(cells, heatmap_spec(shown, labels[shown]), width="stretch")
        if not coverage.empty:
            missing = coverage[coverage["sm_active"] == 0]["node"].tolist()
            if missing:
                st.info(
                    f"SM activity, SM occupancy, tensor and DRAM activity are DCGM profiling fields, not collected "
                    f"on {', '.join(map(md, missing))}: dcgm-exporter's default counters leave them out. Enable "
                    "them with its dcp-metrics-included.csv (DCGM_FI_PROF_*); until then, utilisation is "
                    "DCGM_FI_DEV_GPU_UTIL only."
                )
            st.subheader("Telemetry each node sends (share of the last 15 minutes' samples)")
            st.dataframe(
                coverage,
                hide_index=True,
                placeholder=BLANK,
                width="stretch",
                column_config={
                    "samples": st.column_config.NumberColumn("samples", format="%d"),
                    **{
                        c: st.column_config.ProgressColumn(
                            c.replace("_", " "), min_value=0.0, max_value=1.0, format="percent"
                        )
                        for c in coverage.columns
                        if c not in ("node", "samples")
                    },
                },
            )
        st.subheader("Agents pushing to this server")
        if nodes.empty:
            st.info("No agent has pushed a batch yet (this server may collect by itself).")
        else:
            show_table(
                nodes,
                last_seen=st.column_config.DatetimeColumn("last batch", format="YYYY-MM-DD HH:mm:ss"),
                stale=st.column_config.CheckboxColumn("stale", help="no batch for 3 intervals"),
            )
