"""GPU cost allocations in the shape of OpenCost's `/allocation` API, so tools built on that API can read gpuledger.

The query follows OpenCost's: `window` (durations such as 30m, 24h, 7d, 2w; today, yesterday, week, month,
lastweek, lastmonth; or a pair of RFC 3339 instants or Unix seconds), `aggregate` (cluster, node, namespace, pod,
controller, team, user, job, label:team, and claim: a Kubernetes DRA ResourceClaim), `step` (one set per step; default: the whole window), `accumulate`
(one set), `includeIdle` (the `__idle__` allocation), `shareIdle` and `idleByNode` (idle cost shared to who
allocated the same card, per cluster or per node: analytics/cost_split.py). Each allocation carries OpenCost's
field names and units (hours, minutes, USD, RFC 3339 times); the CPU, RAM, storage, network and load-balancer
fields are 0, since gpuledger prices GPUs only, and gpuledger's own figures are under `gpuAllocation`.
Allocated GPU-hours with no team are `__unallocated__`, as OpenCost names what no aggregate value claims.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pandas as pd

from gpuledger.analytics.cost import PRICED
from gpuledger.analytics.cost_split import IDLE_SHARE, USAGE, share_idle
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.dra_claims import JOB_CLAIM
from gpuledger.analytics.windows import EARLIEST, LATEST, as_utc, utc_now
from gpuledger.collector.errors import InputError
from gpuledger.collector.samples import IDLE_CAPACITY

UNALLOCATED = "__unallocated__"  # OpenCost's name for what has no value of the aggregated property
AGGREGATES = ("cluster", "node", "namespace", "pod", "controller", "team", "user", "job", "label:team", "claim")
CLUSTER = "cluster-one"  # OpenCost's default cluster id
MAX_SETS = 500  # sets in one answer: 500 steps of an hour is three weeks
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(m|h|d|w)$")
UNITS = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1), "w": timedelta(weeks=1)}
# what each aggregate reads of a rollup row (and of its job's record)
KEYS = {"cluster": f"'{CLUSTER}'", "node": "u.node", "namespace": "j.namespace", "pod": "j.pod",
        "controller": "j.name", "team": "u.team", "label:team": "u.team", "user": 'u."user"', "job": "u.job_id",
        "claim": "c.dra_claim"}  # a Kubernetes DRA ResourceClaim (namespace/name) the job's GPUs came through
ZERO_FIELDS = ("cpuCores", "cpuCoreRequestAverage", "cpuCoreUsageAverage", "cpuCoreHours", "cpuCost",
               "cpuCostAdjustment", "cpuEfficiency", "networkTransferBytes", "networkReceiveBytes", "networkCost",
               "networkCostAdjustment", "loadBalancerCost", "loadBalancerCostAdjustment", "pvBytes", "pvByteHours",
               "pvCost", "pvCostAdjustment", "ramBytes", "ramByteRequestAverage", "ramByteUsageAverage",
               "ramByteHours", "ramCost", "ramCostAdjustment", "ramEfficiency", "externalCost")


def duration(text: str, what: str = "duration") -> timedelta:
    match = _DURATION.match(text or "")
    if not match or float(match.group(1)) <= 0:
        raise InputError(f"{what} must be a positive duration such as 30m, 24h, 7d or 2w"
                         + (" (or today, yesterday, week, month, lastweek, lastmonth, or start,end)"
                            if what == "window" else "") + f", got {text!r}")
    return float(match.group(1)) * UNITS[match.group(2)]


def _instant(text: str) -> datetime:
    text = text.strip()
    try:
        value = (datetime.fromtimestamp(float(text), timezone.utc) if re.fullmatch(r"\d+(\.\d+)?", text)
                 else as_utc(datetime.fromisoformat(text.replace("Z", "+00:00"))))
    except (ValueError, OverflowError, OSError) as exc:
        raise InputError(f"window bound {text!r} is neither RFC 3339 nor Unix seconds") from exc
    if not EARLIEST <= value <= LATEST:
        raise InputError(f"window bound {value.isoformat()} is outside {EARLIEST:%Y-%m-%d}..{LATEST:%Y-%m-%d}")
    return value


def parse_window(text: str, now: datetime | None = None) -> tuple[datetime, datetime]:
    """An OpenCost window as [start, end) in UTC."""
    now = as_utc(now) if now else utc_now()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    monday = midnight - timedelta(days=midnight.weekday())
    first = midnight.replace(day=1)
    named = {"today": (midnight, now), "yesterday": (midnight - timedelta(days=1), midnight),
             "week": (monday, now), "lastweek": (monday - timedelta(weeks=1), monday), "month": (first, now),
             "lastmonth": ((first - timedelta(days=1)).replace(day=1), first)}
    text = (text or "").strip()
    if text in named:
        return named[text]
    if "," in text:
        start, end = (_instant(part) for part in text.split(",", 1))
    else:
        span = duration(text, "window")
        if span > timedelta(days=366):
            raise InputError(f"window {text} is over 366 days")
        start, end = now - span, now
    if end <= start:
        raise InputError(f"window {text!r} ends before it starts")
    return start, end


CLAIMED = f" LEFT JOIN {JOB_CLAIM} c ON c.job_id = u.job_id"


def _lines(store: Store, start: datetime, end: datetime, key: str) -> pd.DataFrame:
    """Per aggregate value (`name`), node, GPU model and rate in [start, end): GPU-hours, used GPU-hours, cost."""
    sql = f"""
        SELECT CASE WHEN NOT u.allocated THEN $idle ELSE coalesce({KEYS[key]}, $unallocated) END AS team,
               u.node, u.gpu_model, u.rate_from, u.rate_variant, any_value(u.usd_per_gpu_hour) AS usd_per_gpu_hour,
               sum(u.gpu_hours) AS gpu_hours, sum(u.used_gpu_hours) AS used_gpu_hours,
               sum(u.util_gpu_s) / 3600.0 AS measured_gpu_hours, sum(u.cost_usd) AS cost
        FROM {PRICED} u LEFT JOIN jobs j ON j.job_id = u.job_id{CLAIMED if key == "claim" else ""}
        GROUP BY ALL"""
    return store.query_usage(sql, {"start": start, "end": end, "idle": IDLE_CAPACITY, "unallocated": UNALLOCATED})


def _allocation(name: str, rows: pd.DataFrame, start: datetime, end: datetime, key: str) -> dict[str, Any]:
    hours = (end - start).total_seconds() / 3600.0
    gpu_hours = float(rows["gpu_hours"].sum())
    measured = float(rows["measured_gpu_hours"].sum())
    cost = float(rows["cost"].sum())
    used = float(rows["used_gpu_hours"].sum()) if measured > 0 else None
    stamps = {"start": start.strftime("%Y-%m-%dT%H:%M:%SZ"), "end": end.strftime("%Y-%m-%dT%H:%M:%SZ")}
    properties: dict[str, Any] = {"cluster": CLUSTER}
    if name not in (IDLE_CAPACITY, UNALLOCATED) and key not in ("cluster",):
        if key in ("label:team", "team"):
            properties["labels"] = {"team": name}
        else:
            properties[{"job": "pod"}.get(key, key)] = name
    return {
        "name": name, "properties": properties, "window": stamps, **stamps,
        "minutes": hours * 60.0, **{field: 0.0 for field in ZERO_FIELDS},
        "gpuCount": gpu_hours / hours if hours > 0 else 0.0, "gpuHours": gpu_hours, "gpuCost": cost,
        "gpuCostAdjustment": 0.0, "sharedCost": 0.0, "totalCost": cost,
        # GPU efficiency (busy over allocated GPU-hours that were measured): null where none was (never 0)
        "totalEfficiency": used / measured if used is not None else None,
        "gpuAllocation": {"gpuRequestAverage": gpu_hours / hours if hours > 0 else 0.0,
                          "gpuUsageAverage": used / hours if used is not None and hours > 0 else None,
                          "utilCoverage": measured / gpu_hours if gpu_hours > 0 else None},
        "rawAllocationOnly": None,
    }


def allocation_sets(store: Store, window: str, aggregate: str = "namespace", step: str | None = None,
                    accumulate: bool = False, include_idle: bool = False, share_idle_cost: bool = False,
                    idle_by_node: bool = False, now: datetime | None = None) -> list[dict[str, dict[str, Any]]]:
    """OpenCost's `data`: one set per step (or one, accumulated) of name -> allocation."""
    if aggregate not in AGGREGATES:
        raise InputError(f"aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r} (gpuledger keeps the "
                         "team label only)")
    start, end = parse_window(window, now)
    size = end - start if accumulate or not step else duration(step, "step")
    if (end - start) / size > MAX_SETS:
        raise InputError(f"a window of {end - start} in steps of {size} is over {MAX_SETS} sets: use a longer step")
    sets = []
    lo = start
    while lo < end:
        hi = min(lo + size, end)
        lines = _lines(store, lo, hi, aggregate)
        if share_idle_cost and not lines.empty:
            lines = share_idle(lines.assign(kind=USAGE), "node" if idle_by_node else "cluster")
            # as OpenCost shares idle: its cost goes to the recipients, its hours stay nobody's use
            lines.loc[lines["kind"] == IDLE_SHARE, "gpu_hours"] = 0.0
        if not include_idle:
            lines = lines[lines["team"] != IDLE_CAPACITY]
        sets.append({str(name): _allocation(str(name), rows, lo, hi, aggregate)
                     for name, rows in lines.groupby("team", sort=True)})
        lo = hi
    return sets
