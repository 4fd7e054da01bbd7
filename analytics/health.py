"""GPU health next to cost: XID errors, throttling, ECC and row remapping, per event, per job and per GPU.

Events are derived from the samples as minutes are folded (analytics/store/health.py), so they reach up to the
minute watermark, a couple of minutes behind the newest sample; every answer says how far they reach.
"""
from __future__ import annotations

from datetime import datetime

import pandas as pd

from gpuledger.analytics.store import Store
from gpuledger.analytics.store.database import NEG_INF
from gpuledger.collector.errors import InputError
from gpuledger.collector.gpu_health import KINDS, XID, xid_meaning
from gpuledger.collector.samples import UNATTRIBUTED


def _where(t: str = "") -> str:
    """The filter every query shares, on the columns of table alias `t` (e.g. "e.")."""
    return (f"{t}ts >= $start AND {t}ts < $end AND ($node IS NULL OR {t}node = $node) AND ($team IS NULL OR "
            f"coalesce({t}team, $unattributed) = $team) AND ($kind IS NULL OR {t}kind = $kind)")


def _params(start: datetime, end: datetime, node: str | None, team: str | None, kind: str | None) -> dict:
    if kind is not None and kind not in KINDS:
        raise InputError(f"unknown health event kind {kind!r}; one of {', '.join(KINDS)}")
    return {"start": start, "end": end, "node": node, "team": team, "kind": kind, "unattributed": UNATTRIBUTED}


def health_events(store: Store, start: datetime, end: datetime, node: str | None = None, team: str | None = None,
                  kind: str | None = None, limit: int = 1000) -> pd.DataFrame:
    """The newest `limit` events of [start, end), newest first, with what an XID code means."""
    frame = store.query(f"""
        SELECT ts, node, gpu_uuid, gpu_index, gpu_model, kind, code, increase, job_id, team, "user"
        FROM health_events WHERE {_where()} ORDER BY ts DESC, node, gpu_index, job_id LIMIT $limit""",
                        {**_params(start, end, node, team, kind), "limit": limit})
    frame["meaning"] = [xid_meaning(c) if k == XID else "" for k, c in zip(frame["kind"], frame["code"])]
    return frame


def health_by_job(store: Store, start: datetime, end: datetime, team: str | None = None,
                  node: str | None = None) -> pd.DataFrame:
    """Per job that held a GPU when an event hit it (on `node`, where given): events per kind, the XID codes, GPUs
    affected, and the job's final state as the scheduler recorded it (failed jobs next to the XIDs that may explain
    them)."""
    counts = ", ".join(f"count(*) FILTER (WHERE kind = '{k}') AS {k}" for k in KINDS)
    return store.query(f"""
        SELECT e.job_id, any_value(e.team) AS team, count(*) AS events, {counts},
               list(DISTINCT e.code ORDER BY e.code) FILTER (WHERE e.kind = '{XID}') AS xid_codes,
               count(DISTINCT e.gpu_uuid) AS gpus_affected, min(e.ts) AS first_event, max(e.ts) AS last_event,
               any_value(j.state) AS job_state
        FROM health_events e LEFT JOIN jobs j USING (job_id)
        WHERE {_where('e.')}
          AND e.job_id IS NOT NULL
        GROUP BY e.job_id ORDER BY events DESC, e.job_id""", _params(start, end, node, team, None))


def health_by_gpu(store: Store, start: datetime, end: datetime, node: str | None = None,
                  team: str | None = None) -> pd.DataFrame:
    """Per GPU with events in [start, end) (those while `team`'s jobs held it, where given): events per kind, the
    last XID, and the jobs hit."""
    counts = ", ".join(f"count(DISTINCT ts) FILTER (WHERE kind = '{k}') AS {k}" for k in KINDS)
    return store.query(f"""
        SELECT node, gpu_uuid, any_value(gpu_index) AS gpu_index, any_value(gpu_model) AS gpu_model, {counts},
               arg_max(code, ts) FILTER (WHERE kind = '{XID}') AS last_xid, count(DISTINCT job_id) AS jobs_hit,
               max(ts) AS last_event
        FROM health_events WHERE {_where()} GROUP BY node, gpu_uuid ORDER BY last_event DESC""",
                       _params(start, end, node, team, None))


def health_totals(store: Store) -> pd.DataFrame:
    """Events ever stored per node and kind (a counter for /metrics: health events are never dropped)."""
    return store.query("SELECT node, kind, count(DISTINCT (ts, gpu_uuid)) AS events FROM health_events GROUP BY ALL")


def events_until(store: Store) -> datetime | None:
    """How far events reach: the minute watermark (None before the first fold)."""
    mark = store.rollup_params()["mwm"]
    return None if mark == NEG_INF else mark
