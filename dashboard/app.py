"""gpuledger admin dashboard: utilisation, cost and waste per team, fairshare, recommendations.

Run with `gpuledger dashboard --api URL` (or `gpuledger demo`, which starts it for you).
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from gpuledger.collector.samples import IDLE_CAPACITY, owner_label
from gpuledger.dashboard.client import ApiUnavailable, api_base, frame, get_json

FAIRSHARE_TITLES = {
    "slurm_classic": "Slurm classic, F = 2^(-U/S): 0.5 = used exactly its share, lower = over-served",
    "slurm_fair_tree": "Slurm Fair Tree: mean rank-based FairShare of the team's users, 1 = first in line",
    "kai_time_based": "KAI time-based: the team's part of over-quota GPUs, P = max(0, W + k(W - U))",
}
st.set_page_config(page_title="gpuledger", page_icon="📊", layout="wide")
BASE = api_base()


@st.cache_data(ttl=30, show_spinner="Loading from the gpuledger API…")
def fetch(base: str, path: str, **params):
    return get_json(base, path, **params)


st.title("gpuledger — GPU usage, cost and fairness")
days = st.sidebar.slider("Window (days)", min_value=1, max_value=14, value=7)
bucket = st.sidebar.selectbox("Utilisation bucket (minutes)", [15, 60, 240], index=1)
st.sidebar.caption(f"API: {BASE}")
if st.sidebar.button("Refresh"):
    st.cache_data.clear()

try:
    health = fetch(BASE, "/healthz")
    util = frame(fetch(BASE, "/v1/cluster/utilization", days=days, bucket_minutes=bucket), ("bucket",))
    costs = fetch(BASE, "/v1/costs", days=days)
    waste = fetch(BASE, "/v1/waste", days=days, limit=100)
    fairness = fetch(BASE, "/v1/fairshare", days=days)
    fair = frame(fairness["history"], ("hour",))
    advice = fetch(BASE, "/v1/recommendations")
    recs = [r for r in advice["recommendations"] if r["status"] != "insufficient_data"]
    no_data = [r for r in advice["recommendations"] if r["status"] == "insufficient_data"]
    decided = fetch(BASE, "/v1/recommendations/history", limit=200)
    nodes = frame(fetch(BASE, "/v1/nodes"), ("last_seen",))
    gpu_health = fetch(BASE, "/v1/health", days=days, limit=200)
    coverage = frame(fetch(BASE, "/v1/nodes/telemetry"))
    fragments = fetch(BASE, "/v1/fragmentation", days=days)
except ApiUnavailable as exc:
    st.error(str(exc))
    st.stop()

if health["samples"] == 0:
    st.warning("The store holds no samples yet. Start a collector (`gpuledger serve`) or run `gpuledger demo`.")
    st.stop()

if not nodes.empty and nodes["stale"].any():
    stale = nodes[nodes["stale"]]
    st.warning(f"{len(stale)} stale node(s), no batch for 3 intervals: " + ", ".join(stale["node"].tolist()))

cost_df = frame(costs["teams"])
idle_line = cost_df[cost_df["team"] == IDLE_CAPACITY]
cost_df["team"] = cost_df["team"].map(owner_label)
col1, col2, col3, col4 = st.columns(4)
col1.metric("Total cost", f"${costs['total_usd']:,.0f}", help=f"last {days} day(s), rate card prices")
col2.metric("Idle capacity cost", f"${float(idle_line['cost_usd'].sum()):,.0f}")
mean_alloc = float(util["allocated_gpus"].mean() / util["total_gpus"].mean()) if not util.empty else 0.0
mean_used = float(util["used_gpus"].mean() / util["total_gpus"].mean()) if not util.empty else 0.0
col3.metric("GPUs allocated", f"{mean_alloc:.0%}")
col4.metric("GPUs busy", f"{mean_used:.0%}")
st.caption(f"Latest sample {health['latest_sample']} · {health['samples']:,} samples in store")

tab_util, tab_cost, tab_fair, tab_recs, tab_health, tab_nodes = st.tabs(
    ["Utilization", "Cost & waste", "Fairshare", "Recommendations", "GPU health", "Nodes"])

with tab_util:
    st.subheader("Cluster utilization over time")
    if util.empty:
        st.info("No samples in this window.")
    else:
        st.line_chart(util.set_index("bucket")[["total_gpus", "allocated_gpus", "used_gpus"]],
                      y_label="GPUs (average concurrent)")

with tab_cost:
    st.subheader("Cost per team")
    st.bar_chart(cost_df.set_index("team")[["cost_usd"]], y_label="USD")
    st.dataframe(cost_df, hide_index=True, width="stretch")
    st.subheader("Waste per team")
    waste_df = frame(waste["by_team"])
    st.dataframe(waste_df, hide_index=True, width="stretch")
    st.subheader("Longest idle allocations")
    st.dataframe(frame(waste["idle_runs"]), hide_index=True, width="stretch")
    st.subheader("Memory-oversized jobs")
    oversized = frame(waste["oversized_jobs"])
    if not oversized.empty:
        oversized["fits"] = oversized["fits"].map(lambda f: f["target"] if isinstance(f, dict) else None)
    st.dataframe(oversized, hide_index=True, width="stretch")

with tab_fair:
    st.subheader(f"Fairshare factor per team ({FAIRSHARE_TITLES.get(fairness['algorithm'], fairness['algorithm'])})")
    if fair.empty:
        st.info("No team with a share has usage in this window.")
    else:
        wide = fair.pivot_table(index="hour", columns="team", values="fairshare")
        st.line_chart(wide, y_label="fairshare factor")
        shown = [c for c in ("team", "norm_share", "norm_usage", "level_fs", "weight", "usage", "fairshare",
                             "over_served") if c in fair and fair[c].notna().any()]
        latest = fair.sort_values("hour").groupby("team").tail(1)[shown]
        st.dataframe(latest, hide_index=True, width="stretch")

with tab_recs:
    st.subheader("Recommendations")
    window = advice["policy_window"]
    st.caption(f"From the policy window {window['start'][:16]} to {window['end'][:16]} UTC, whatever window the "
               "sidebar shows. A quota is per team and GPU model: the guarantee is promised (reclaimed from others "
               "when the team asks), the limit is the most it may hold, borrowing idle GPUs. Decide with "
               "`gpuledger decide ID accept|reject|applied --by NAME` or POST /v1/recommendations/ID/decision.")
    if not recs:
        st.success("Nothing to change: quotas match demand and no GPU is held idle.")
    else:
        table = pd.DataFrame([{"id": r["id"], "status": r["status"], "kind": r["kind"], "team": r["team"],
                               "GPU model": r.get("gpu_model"), "job": r.get("job_id"), "reason": r["reason"]}
                              for r in recs])
        st.dataframe(table, hide_index=True, width="stretch")
        for r in recs[:20]:
            with st.expander(f"{r['kind']}: {r['reason']}"):
                st.json({"action": r["action"], "evidence": r["evidence"]})
    if no_data:
        st.warning(f"{len(no_data)} team and GPU model pair(s) get no quota advice for lack of data: "
                   + no_data[0]["reason"] + ("; ..." if len(no_data) > 1 else ""))
    st.subheader("Decision history")
    if not decided:
        st.info("No recommendation has been stored yet.")
    else:
        st.dataframe(pd.DataFrame([{"created": r["created"], "status": r["status"], "kind": r["kind"],
                                    "team": r["team"], "GPU model": r.get("gpu_model"), "decided by": r["decided_by"],
                                    "decided at": r["decided_at"], "note": r["note"], "id": r["id"]}
                                   for r in decided]), hide_index=True, width="stretch")

with tab_health:
    st.subheader("GPU health events")
    st.caption("XID errors (the driver's error codes), throttling starts (heat, power cap, hardware slowdown), ECC "
               "and row-remap increases, each joined to the job that held the GPU. Events reach "
               f"{gpu_health['events_until'] or 'nothing yet'} (derived as minutes are folded).")
    by_gpu, by_job = frame(gpu_health["by_gpu"], ("last_event",)), frame(gpu_health["by_job"], ("last_event",))
    if by_gpu.empty:
        st.success(f"No health event in the last {days} day(s).")
    else:
        kinds = ["xid", "ecc_dbe", "row_remap_uncorr", "row_remap_failure", "thermal_throttle", "power_throttle",
                 "hw_slowdown", "ecc_sbe", "row_remap_corr"]
        shown = {"node": "Node", "gpu_index": "GPU", "gpu_model": "Model", "last_xid": "Last XID",
                 **{k: k.replace("_", " ").capitalize() for k in kinds}, "jobs_hit": "Jobs hit",
                 "last_event": "Last event"}
        st.markdown("**GPUs**, most recent first")
        st.dataframe(by_gpu[list(shown)].rename(columns=shown), hide_index=True, width="stretch")
        if not by_job.empty:
            st.markdown("**Jobs that held a GPU when an event hit it**")
            jobs = by_job.assign(xid_codes=by_job["xid_codes"].map(
                lambda c: ", ".join(str(int(x)) for x in c) if isinstance(c, list) and c else ""))
            cols = {"job_id": "Job", "team": "Team", "job_state": "State", "events": "Events",
                    "xid_codes": "XID codes", "thermal_throttle": "Thermal throttle",
                    "power_throttle": "Power throttle", "gpus_affected": "GPUs", "last_event": "Last event"}
            st.dataframe(jobs[list(cols)].rename(columns=cols), hide_index=True, width="stretch")
        events = frame(gpu_health["events"], ("ts",))
        with st.expander(f"The {len(events)} newest events"):
            st.dataframe(events[["ts", "node", "gpu_index", "kind", "code", "meaning", "job_id", "team"]],
                         hide_index=True, width="stretch")

with tab_nodes:
    st.subheader("Fragmentation: idle GPU the typical job cannot use")
    if not fragments["enough_data"]:
        st.info(f"Not enough data to measure fragmentation: {fragments['reason']}.")
    else:
        f1, f2, f3 = st.columns(3)
        f1.metric("Fragmented GPUs", f"{fragments['fragmented_gpus']:.1f} of {fragments['idle_gpus']:.1f} idle",
                  help="FGD (Weng et al., ATC '23): idle GPU that the job shapes covering 95% of this window's jobs "
                       "could not use (too little left on a GPU, too few free GPUs on the node)")
        f2.metric("Share of idle GPU fragmented", f"{fragments['fragmented_share_of_idle']:.0%}")
        f3.metric("Stranded capacity cost", f"${fragments['stranded_usd_per_day']:,.0f} per day",
                  help="fragmented GPUs x their model's rate x 24 h")
        per_node = frame(fragments["nodes"])
        shown = {"node": "Node", "gpu_model": "Model", "gpus": "GPUs", "idle_gpus": "Idle GPUs",
                 "fragmented_gpus": "Fragmented GPUs", "fragmented_share": "Fragmented share of idle",
                 "stranded_usd_per_day": "Stranded $/day"}
        st.dataframe(per_node[list(shown)].rename(columns=shown), hide_index=True, width="stretch",
                     column_config={"Idle GPUs": st.column_config.NumberColumn(format="%.2f"),
                                    "Fragmented GPUs": st.column_config.NumberColumn(format="%.2f"),
                                    "Fragmented share of idle": st.column_config.ProgressColumn(
                                        min_value=0.0, max_value=1.0, format="percent"),
                                    "Stranded $/day": st.column_config.NumberColumn(format="$%.2f")})
        history = frame(fragments["history"], ("ts",))
        if not history.empty:
            st.line_chart(history.set_index("ts")[["idle_gpus", "fragmented_gpus"]], y_label="GPUs")
    if not coverage.empty:
        missing = coverage[coverage["sm_active"] == 0]["node"].tolist()
        if missing:
            st.info(f"SM activity, SM occupancy, tensor and DRAM activity are DCGM profiling fields, not collected "
                    f"on {', '.join(missing)}: dcgm-exporter's default counters leave them out. Enable them with "
                    "its dcp-metrics-included.csv (DCGM_FI_PROF_*); until then, utilisation is DCGM_FI_DEV_GPU_UTIL "
                    "only.")
        st.subheader("Telemetry each node sends (share of the last 15 minutes' samples)")
        st.dataframe(coverage, hide_index=True, width="stretch",
                     column_config={c: st.column_config.ProgressColumn(c, min_value=0.0, max_value=1.0, format="%.0f")
                                    for c in coverage.columns if c not in ("node", "samples")})
    st.subheader("Agents pushing to this server")
    if nodes.empty:
        st.info("No agent has pushed a batch yet (this server may collect by itself).")
    else:
        st.dataframe(nodes, hide_index=True, width="stretch")
