"""What inference services achieve and what a result costs: tokens and requests per second, latency quantiles against
the service's SLO, queue depth, KV-cache use, and cost per million tokens and per thousand requests.

Why: inference is budgeted per token, and a service is judged by its latency, not by GPU_UTIL. The servers say both
on their own /metrics pages (collector/apps reads vLLM, Triton, TGI, SGLang into one vocabulary, FIGURES); the GPU
telemetry says what their pods' GPUs cost. Joining the two by pod gives cost per result.

How the numbers are made, so anyone can check them:
- counters are cumulative per series and reset when a server restarts: an increase is the difference between two
  reads, or the new value itself where it fell (a reset), as Prometheus' increase() counts it, without its
  extrapolation to the window's edges: only what was read between the first and last read in the window counts.
  The store counts each read's step once, at ingest, and folds them per series and hour (app_hour), so a window
  reads its whole hours from the fold and only its partial hours from the rows;
- latency quantiles are interpolated linearly inside the bucket that holds the rank, from the buckets' increases
  summed over every series of the service (as histogram_quantile does); a rank in the +Inf bucket is the highest
  finite bound; a histogram cut before +Inf is totalled by its count where it has one, else it gives no quantile;
- cost is the GPU cost at the rate card of the service's pods (jobs `namespace/pod`) over the same window; a service
  with no GPU samples for its pods has no cost, and says so, never $0.
"""
from __future__ import annotations

import math
from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.config import Slo
from gpuledger.analytics.cost import PRICED
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.database import floor_hour
from gpuledger.analytics.windows import as_utc
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

# per series (app_series) read in [start, end): its first and last read, the sum, count and top of its finite
# values (gauges' means), and the sum of its increases whose read before is in the window too (the store counts
# each row's increase at ingest, reset-aware: see the module's docstring); labelled with its service, target, pod
# and figure, and billed to its pod's team as the pod's job record says (a team label, a namespace mapping: the
# team its GPU samples are billed to), the page's namespace's team only where no record says
_JOB_TEAMS = "(SELECT job_id, any_value(team) AS team FROM jobs GROUP BY job_id)"
_SERIES = f"""
    WITH per AS MATERIALIZED (
        SELECT series_id, min(lo) AS lo, max(hi) AS hi, sum(total) AS total, sum(n) AS n, max(top) AS top,
               CASE WHEN sum(counted) > 0 THEN sum(increase) END AS increase
        FROM (
            -- the window's whole hours [$h0, $h1), folded at ingest; a first read whose read before is outside
            -- the window does not count
            SELECT series_id, lo, hi, total, n, top,
                   increase - CASE WHEN first_prev_ts < $start THEN coalesce(first_increase, 0) ELSE 0 END AS increase,
                   counted - CASE WHEN first_prev_ts < $start AND first_increase IS NOT NULL THEN 1 ELSE 0 END
                       AS counted
            FROM app_hour WHERE hour >= $h0 AND hour < $h1
            UNION ALL
            -- its partial hours, from the rows as read
            SELECT series_id, ts, ts, CASE WHEN isfinite(value) THEN value END, CASE WHEN isfinite(value) THEN 1
                   ELSE 0 END, CASE WHEN isfinite(value) THEN value END,
                   CASE WHEN prev_ts >= $start THEN increase END, CASE WHEN prev_ts >= $start AND increase IS NOT NULL
                   THEN 1 ELSE 0 END
            FROM app_samples WHERE ts >= $start AND ts < $end AND NOT (ts >= $h0 AND ts < $h1))
        GROUP BY series_id),
    series AS MATERIALIZED (
        SELECT per.*, s.kind, s.service, coalesce(j.team, s.team, $unattributed) AS team, s.target, s.pod,
               coalesce(s.job_id, s.namespace || '/' || s.pod) AS job, s.figure, s.part, s.le
        FROM per JOIN app_series s USING (series_id) LEFT JOIN {_JOB_TEAMS} j ON j.job_id = s.job_id)"""

# what each target of each service read (when, its pod and job, its gauges' sums), from its series that are not
# histogram buckets (a page with a bucket has its count or another figure); and the increase of every counted
# figure part, per service
_READS_AND_INCREASES = f"""{_SERIES}
    SELECT 'read' AS what, kind, service, team, target, pod, job, epoch(min(lo)) AS lo, epoch(max(hi)) AS hi,
           {", ".join(f"sum(total) FILTER (WHERE figure = '{g}') AS {g}_sum, "
                      f"sum(n) FILTER (WHERE figure = '{g}') AS {g}_n" for g in GAUGES)},
           max(top) FILTER (WHERE figure = 'kv_cache_usage') AS kv_cache_usage_max
    FROM series WHERE ($team IS NULL OR team = $team) AND part <> 'bucket' GROUP BY ALL
    UNION ALL BY NAME
    SELECT 'increase' AS what, kind, service, team, figure, part, le, sum(increase) AS increase
    FROM series WHERE ($team IS NULL OR team = $team) AND figure IN (SELECT unnest($counted)) GROUP BY ALL"""


def service_table(store: Store, start: datetime, end: datetime, slos: dict[str, Slo] | None = None,
                  team: str | None = None) -> pd.DataFrame:
    """One row per service (server kind, model served, team): pods, the seconds read, requests, failures and tokens
    with their rates, latency p50/p95/p99 and means, queue and KV-cache gauges, GPU cost of its pods, cost per
    million tokens and per thousand requests, the SLO's status, and its jobs (the pods that served it). A figure
    the service does not report is null. Answered once per window inside Store.remembering()."""
    key = ("service_table", start, end, team, repr(sorted((slos or {}).items())))
    return store.remembered(key, lambda: _service_table(store, start, end, slos or {}, team))


def _service_table(store: Store, start: datetime, end: datetime, slos: dict[str, Slo],
                   team: str | None) -> pd.DataFrame:
    h0, h1 = _whole_hours(start, end)
    params = {"start": start, "end": end, "h0": h0, "h1": h1, "team": team, "unattributed": UNATTRIBUTED}
    both = store.query(_READS_AND_INCREASES, params | {"counted": [*COUNTERS, *LATENCIES]})
    reads = both[both["what"] == "read"]
    if reads.empty:
        return pd.DataFrame(columns=[*KEY, "pods", "jobs", "seconds"])
    base = _services(reads)
    inc = both[(both["what"] == "increase") & both["increase"].notna()]
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
    return _with_slo(out, slos)


def _whole_hours(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """The UTC clock hours inside [start, end), as [h0, h1): what app_hour answers (none: h0 == h1)."""
    start = as_utc(start)
    h0 = floor_hour(start)
    if h0 < start:
        h0 += timedelta(hours=1)
    h1 = floor_hour(as_utc(end))
    return (h0, h1) if h1 > h0 else (h0, h0)


def _services(reads: pd.DataFrame) -> pd.DataFrame:
    """Per service, from its targets' reads: pods, jobs, first and last read, the seconds read and the mean of
    each gauge over every read of it. Plain Python over the few thousand rows: a pandas group per service cost
    more than the query that read them."""
    found: dict[tuple, dict] = {}
    for r in reads.to_dict("records"):
        s = found.setdefault((r["kind"], r["service"], r["team"]),
                             {"pods": set(), "jobs": set(), "spans": {}, "kv_max": None,
                              **{f"{g}_{k}": 0.0 for g in GAUGES for k in ("sum", "n")}})
        if _known(r["pod"]):
            s["pods"].add(r["pod"])
        if _known(r["job"]):
            s["jobs"].add(str(r["job"]))
        lo, hi = s["spans"].get(r["target"], (r["lo"], r["hi"]))
        s["spans"][r["target"]] = (min(lo, r["lo"]), max(hi, r["hi"]))
        if _known(r["kv_cache_usage_max"]):
            s["kv_max"] = max(s["kv_max"] if s["kv_max"] is not None else -math.inf, r["kv_cache_usage_max"])
        for g in GAUGES:
            for k in ("sum", "n"):
                s[f"{g}_{k}"] += r[f"{g}_{k}"] if _known(r[f"{g}_{k}"]) else 0.0
    rows = []
    for key in sorted(found):
        s = found[key]
        spans = list(s["spans"].values())
        rows.append({**dict(zip(KEY, key)), "pods": len(s["pods"]), "jobs": sorted(s["jobs"]),
                     "first_ts": pd.Timestamp(min(lo for lo, _ in spans), unit="s", tz="UTC"),
                     "last_ts": pd.Timestamp(max(hi for _, hi in spans), unit="s", tz="UTC"),
                     "seconds": _read_seconds(spans),
                     "kv_cache_usage_max": s["kv_max"] if s["kv_max"] is not None else float("nan"),
                     **{g: s[f"{g}_sum"] / s[f"{g}_n"] if s[f"{g}_n"] else float("nan") for g in GAUGES}})
    return pd.DataFrame(rows)


def _known(value: object) -> bool:
    """A value a query gave, not its NULL (None, NaN or pandas' NA)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and value is not pd.NA


def _read_seconds(spans: list[tuple[float, float]]) -> float:
    """The seconds some target of a service was read (the union of each target's first-to-last read), what its
    rates are over: two pods that ran at different times are not averaged over the gap between them."""
    total, end = 0.0, None
    for lo, hi in sorted(spans):
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


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
    parts: dict[tuple, dict] = {}
    for r in inc[inc["figure"].isin(LATENCIES)].to_dict("records"):
        p = parts.setdefault((r["kind"], r["service"], r["team"], r["figure"]), {"buckets": {}})
        if r["part"] == "bucket":
            p["buckets"][float(r["le"])] = p["buckets"].get(float(r["le"]), 0.0) + r["increase"]
        elif r["part"] in ("count", "sum"):
            p[r["part"]] = p.get(r["part"], 0.0) + r["increase"]
    rows: dict[tuple, dict] = {}
    for (kind, service, team, figure), p in sorted(parts.items()):
        row = rows.setdefault((kind, service, team), {"kind": kind, "service": service, "team": team})
        # cumulative buckets summed over series stay cumulative; a series missing a bound would break monotonicity
        pairs, top = [], -math.inf
        for le in sorted(p["buckets"]):
            top = max(top, p["buckets"][le])
            pairs.append((le, top))
        count, total = p.get("count"), p.get("sum")
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
                              {"start": start, "end": end, "jobs": wanted})
    priced = {r["job_id"]: r for r in costs.to_dict("records")}
    out = services.copy()
    found = [[priced[j] for j in jobs if j in priced] for jobs in listed]
    out["cost_usd"] = [float(sum(c["cost_usd"] for c in f)) if f else None for f in found]
    out["gpu_hours"] = [float(sum(c["gpu_hours"] for c in f)) if f else None for f in found]
    # pods of one service on different cards: each named, not the first one's
    out["gpu_model"] = [", ".join(sorted({str(c["gpu_model"]) for c in f})) if f else None for f in found]
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
    if not slos:
        return []
    seen = store.query(f"""
        SELECT DISTINCT a.service, coalesce(j.team, a.team, $unattributed) AS team
        FROM (SELECT DISTINCT service, team, job_id FROM app_series) a
        LEFT JOIN {_JOB_TEAMS} j ON j.job_id = a.job_id""",
                       {"unattributed": UNATTRIBUTED})
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

