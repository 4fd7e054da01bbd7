"""What inference services achieve and what a result costs: tokens and requests per second, latency quantiles against
the service's SLO, queue depth, KV-cache use, and cost per million tokens and per thousand requests.

Why: inference is budgeted per token, and a service is judged by its latency, not by GPU_UTIL. The servers say both
on their own /metrics pages (collector/apps reads vLLM, Triton, TGI, SGLang into one vocabulary, FIGURES); the GPU
telemetry says what their pods' GPUs cost. Joining the two by pod gives cost per result.

How the numbers are made, so anyone can check them:
- counters are cumulative per series and reset when a server restarts: an increase is the difference between two
  reads, or the new value itself where it fell (a reset), as Prometheus' increase() counts it, without its
  extrapolation to the window's edges: only what was read between the first and last read in the window counts;
- latency quantiles are interpolated linearly inside the bucket that holds the rank, from the buckets' increases
  summed over every series of the service (as histogram_quantile does); a rank in the +Inf bucket is the highest
  finite bound; a histogram cut before +Inf is totalled by its count where it has one, else it gives no quantile;
- cost is the GPU cost at the rate card of the service's pods (jobs `namespace/pod`) over the same window; a service
  with no GPU samples for its pods has no cost, and says so, never $0.
"""
from __future__ import annotations

import math
from datetime import datetime, timezone

import pandas as pd

from gpuledger.analytics.config import Slo
from gpuledger.analytics.cost import PRICED
from gpuledger.analytics.store import Store
from gpuledger.collector.apps.figures import FIGURES
from gpuledger.collector.samples import UNATTRIBUTED

QUANTILES = (0.5, 0.95, 0.99)
LATENCIES = tuple(name for name, f in FIGURES.items() if f.type == "histogram")
COUNTERS = tuple(name for name, f in FIGURES.items() if f.type == "counter")
GAUGES = ("requests_running", "requests_waiting", "kv_cache_usage")
SLO_FIGURES = {"ttft_p95_s": ("ttft_seconds", 0.95), "tpot_p95_s": ("tpot_seconds", 0.95),
               "e2e_p95_s": ("e2e_seconds", 0.95), "e2e_p99_s": ("e2e_seconds", 0.99)}
SLO_STATUSES = ("met", "missed", "unknown")
NO_GPU_SAMPLES = "no GPU samples for its pods in the window: its cost is unknown"
KEY = ["kind", "service", "team"]

# the rows of [start, end), each billed to its pod's team as the pod's job record says (a team label, a namespace
# mapping: the team its GPU samples are billed to), the page's namespace's team only where no record says
APP_ROWS = """(SELECT a.* REPLACE (coalesce(j.team, a.team, $unattributed) AS team)
    FROM app_samples a LEFT JOIN (SELECT job_id, any_value(team) AS team FROM jobs GROUP BY job_id) j
         ON j.job_id = a.job_id
    WHERE a.ts >= $start AND a.ts < $end)"""

# the increase of every counter part of every series in [start, end), reset-aware (see the module's docstring)
_INCREASES = f"""
    WITH s AS (
        SELECT kind, service, team, namespace, pod, job_id, figure, part, le, ts,
               value, lag(value) OVER (PARTITION BY target, kind, service, instance, namespace, pod, figure, part, le
                                       ORDER BY ts) AS prev
        FROM {APP_ROWS}
        WHERE ($team IS NULL OR team = $team) AND figure IN (SELECT unnest($counted))
    )
    SELECT kind, service, team, figure, part, le,
           sum(CASE WHEN value >= prev THEN value - prev ELSE value END) AS increase
    FROM s WHERE prev IS NOT NULL AND isfinite(value)
    GROUP BY ALL"""


def service_table(store: Store, start: datetime, end: datetime, slos: dict[str, Slo] | None = None,
                  team: str | None = None) -> pd.DataFrame:
    """One row per service (server kind, model served, team): pods, the seconds read, requests, failures and tokens
    with their rates, latency p50/p95/p99 and means, queue and KV-cache gauges, GPU cost of its pods, cost per
    million tokens and per thousand requests, and the SLO's status. A figure the service does not report is null."""
    params = {"start": start, "end": end, "team": team, "unattributed": UNATTRIBUTED}
    base = store.query(f"""
        SELECT kind, service, team, count(DISTINCT pod) AS pods,
               list(DISTINCT coalesce(job_id, namespace || '/' || pod)) FILTER (WHERE pod IS NOT NULL) AS jobs,
               min(ts) AS first_ts, max(ts) AS last_ts,
               {", ".join(f"avg(value) FILTER (WHERE figure = '{g}') AS {g}" for g in GAUGES)},
               max(value) FILTER (WHERE figure = 'kv_cache_usage') AS kv_cache_usage_max
        FROM {APP_ROWS}
        WHERE $team IS NULL OR team = $team
        GROUP BY ALL ORDER BY kind, service, team""", params)
    if base.empty:
        return base
    spans = store.query(f"""
        SELECT kind, service, team, target, epoch(min(ts)) AS lo, epoch(max(ts)) AS hi FROM {APP_ROWS}
        WHERE $team IS NULL OR team = $team GROUP BY ALL""", params)
    base = base.merge(_read_seconds(spans), on=KEY, how="left")
    inc = store.query(_INCREASES, params | {"counted": [*COUNTERS, *LATENCIES]})
    counters = inc[inc["part"] == "value"].pivot_table(index=KEY, columns="figure", values="increase",
                                                       aggfunc="sum")
    out = base.merge(counters.reset_index(), on=KEY, how="left") if len(counters) else base
    for name in COUNTERS:
        if name not in out:
            out[name] = float("nan")
    span = out["seconds"].where(out["seconds"] > 0)
    out["requests_per_s"] = out["requests"] / span
    out["prompt_tokens_per_s"] = out["prompt_tokens"] / span
    out["generation_tokens_per_s"] = out["generation_tokens"] / span
    out["train_samples_per_s"] = out["train_samples"] / span
    latency = _latencies(inc)
    out = out.merge(latency, on=KEY, how="left") if len(latency) else out
    for figure in LATENCIES:
        for column in (*(_q(figure, q) for q in QUANTILES), f"{figure}_mean"):
            if column not in out:
                out[column] = float("nan")
    out = _with_cost(store, start, end, out)
    out = _with_slo(out, slos or {})
    return out.drop(columns=["jobs"])


def _read_seconds(spans: pd.DataFrame) -> pd.DataFrame:
    """Per service: the seconds some target of it was read (the union of each target's first-to-last read), what
    its rates are over: two pods that ran at different times are not averaged over the gap between them."""
    rows = []
    for key, group in spans.groupby(KEY):
        total, end = 0.0, None
        for lo, hi in sorted(zip(group["lo"], group["hi"])):
            if end is None or lo > end:
                total += hi - lo
                end = hi
            elif hi > end:
                total += hi - end
                end = hi
        rows.append(dict(zip(KEY, key), seconds=total))
    return pd.DataFrame(rows, columns=[*KEY, "seconds"])


def histogram_quantile(q: float, buckets: list[tuple[float, float]], total: float | None = None) -> float | None:
    """The q-quantile of cumulative `buckets` [(le, count)], interpolated linearly inside the bucket holding the rank
    (from 0 for the first bucket when its bound is positive). `total`: the observations' count where the +Inf bucket
    is missing. None where nothing was observed, or the rank lies past a histogram cut before +Inf."""
    buckets = sorted(buckets)
    if buckets and math.isinf(buckets[-1][0]):
        total = buckets[-1][1]
    if total is None or total <= 0 or not buckets:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower  # the highest finite bound
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = (bound if not math.isinf(bound) else lower), count
    return None  # past the last finite bucket of a page cut before +Inf


def _q(figure: str, q: float) -> str:
    return f"{figure.removesuffix('_seconds')}_p{round(q * 100)}_s"


def _latencies(inc: pd.DataFrame) -> pd.DataFrame:
    """Per service: p50/p95/p99 and the mean of every latency figure, from the bucket, sum and count increases."""
    rows: dict[tuple, dict] = {}
    for (kind, service, team, figure), group in inc[inc["figure"].isin(LATENCIES)].groupby(KEY + ["figure"]):
        row = rows.setdefault((kind, service, team), {"kind": kind, "service": service, "team": team})
        buckets = group[group["part"] == "bucket"].groupby("le")["increase"].sum()
        # cumulative buckets summed over series stay cumulative; a series missing a bound would break monotonicity
        pairs = [(float(le), float(v)) for le, v in buckets.cummax().items()]
        count = group.loc[group["part"] == "count", "increase"].sum() if (group["part"] == "count").any() else None
        total = group.loc[group["part"] == "sum", "increase"].sum() if (group["part"] == "sum").any() else None
        for q in QUANTILES:
            row[_q(figure, q)] = histogram_quantile(q, pairs, count)
        row[f"{figure}_mean"] = total / count if total is not None and count else None
    return pd.DataFrame(list(rows.values()))


def _with_cost(store: Store, start: datetime, end: datetime, services: pd.DataFrame) -> pd.DataFrame:
    """The GPU cost of each service's pods in the window, and cost per result; null with a note where none."""
    # DuckDB lists arrive as arrays; a service without pods as NULL (None, NaN or pandas' NA)
    listed = [[str(j) for j in jobs] if hasattr(jobs, "__iter__") and not isinstance(jobs, str) else []
              for jobs in services["jobs"]]
    wanted = sorted({j for jobs in listed for j in jobs})
    costs = store.query_usage(f"""
        SELECT job_id, sum(cost_usd) AS cost_usd, sum(gpu_hours) AS gpu_hours, arg_max(gpu_model, gpu_s) AS gpu_model
        FROM {PRICED} WHERE allocated AND job_id IN (SELECT unnest($jobs)) GROUP BY job_id""",
                              {"start": start, "end": end, "jobs": wanted}).set_index("job_id")
    out = services.copy()
    found = [[j for j in jobs if j in costs.index] for jobs in listed]
    out["cost_usd"] = [float(costs.loc[f, "cost_usd"].sum()) if f else None for f in found]
    out["gpu_hours"] = [float(costs.loc[f, "gpu_hours"].sum()) if f else None for f in found]
    out["gpu_model"] = [str(costs.loc[f, "gpu_model"].iloc[0]) if f else None for f in found]
    out["cost_note"] = [None if f else NO_GPU_SAMPLES for f in found]
    tokens = out["prompt_tokens"].fillna(0) + out["generation_tokens"].fillna(0)
    cost = pd.to_numeric(out["cost_usd"], errors="coerce")
    out["cost_per_million_tokens"] = cost / (tokens.where(tokens > 0) / 1e6)
    out["cost_per_million_generated_tokens"] = cost / (out["generation_tokens"].where(out["generation_tokens"] > 0)
                                                       / 1e6)
    out["cost_per_million_prompt_tokens"] = cost / (out["prompt_tokens"].where(out["prompt_tokens"] > 0) / 1e6)
    out["cost_per_thousand_requests"] = cost / (out["requests"].where(out["requests"] > 0) / 1e3)
    return out


def _with_slo(services: pd.DataFrame, slos: dict[str, Slo]) -> pd.DataFrame:
    """Each service's SLO (by service name first, else by team), its bounds and status: `missed` where a measured
    quantile is over its bound, `met` where every bound has a measured quantile under it, `unknown` otherwise."""
    out = services.copy()
    statuses, objectives, breaches = [], [], []
    for row in out.itertuples(index=False):
        slo = slos.get(row.service) or slos.get(row.team)
        if slo is None:
            statuses.append(None), objectives.append(None), breaches.append([])
            continue
        bounds = {k: v for k, v in vars(slo).items() if v is not None}
        measured = {k: getattr(row, _q(*SLO_FIGURES[k])) for k in bounds}
        missed = [k for k, v in measured.items() if v is not None and not pd.isna(v) and v > bounds[k]]
        known = all(v is not None and not pd.isna(v) for v in measured.values())
        statuses.append("missed" if missed else "met" if known and bounds else "unknown")
        objectives.append(bounds)
        breaches.append(missed)
    out["slo"] = objectives
    out["slo_status"] = statuses
    out["slo_missed"] = breaches
    return out


def unknown_slo_names(store: Store, slos: dict[str, Slo]) -> list[str]:
    """SLO names that match no service or team ever read: said to the admin, never silently ignored."""
    seen = store.query(f"SELECT DISTINCT service, team FROM {APP_ROWS}",
                       {"unattributed": UNATTRIBUTED, "start": datetime.min.replace(tzinfo=timezone.utc),
                        "end": datetime.max.replace(tzinfo=timezone.utc)})
    known = set(seen["service"]) | set(seen["team"])
    return sorted(name for name in slos if name not in known)


def team_inference(services: pd.DataFrame) -> pd.DataFrame:
    """Per team: tokens, requests and cost of its services, and cost per million tokens over the services that
    have a cost (the others are counted as `services_without_cost`)."""
    if services.empty:
        return pd.DataFrame(columns=["team", "services", "requests", "tokens", "cost_usd", "cost_per_million_tokens",
                                     "services_without_cost"])
    df = services.assign(tokens=services["prompt_tokens"].fillna(0) + services["generation_tokens"].fillna(0),
                         costed=services["cost_usd"].notna())
    rows = []
    for team, g in df.groupby("team"):
        priced = g[g["costed"]]
        tokens = float(priced["tokens"].sum())
        cost = float(priced["cost_usd"].sum()) if len(priced) else None
        rows.append({"team": team, "services": len(g), "requests": float(g["requests"].fillna(0).sum()),
                     "tokens": float(g["tokens"].sum()), "cost_usd": cost,
                     "cost_per_million_tokens": cost / (tokens / 1e6) if cost is not None and tokens > 0 else None,
                     "services_without_cost": int((~g["costed"]).sum())})
    return pd.DataFrame(rows)


def service_jobs(store: Store, kind: str, service: str, team: str, start: datetime, end: datetime) -> list[str]:
    """The jobs (pods) that served one service in [start, end): the jobs its GPU cost and placement advice are of."""
    found = store.query(f"""
        SELECT DISTINCT coalesce(job_id, namespace || '/' || pod) AS job_id FROM {APP_ROWS}
        WHERE kind = $kind AND service = $service AND team = $team AND pod IS NOT NULL""",
                        {"start": start, "end": end, "kind": kind, "service": service, "team": team,
                         "unattributed": UNATTRIBUTED})
    return sorted(str(j) for j in found["job_id"])
