"""Budgets set through the API, and the alerts the server raised: each alert once while its condition holds.

An alert is keyed by its condition (`budget forecast:nlp:2026-12:1.0`, `idle job:j-17`): it is inserted when its
condition starts and none with that key is open, and marked resolved when the condition ends, both inside one
transaction that reads the open ones, so two checks racing cannot raise it twice. Where each message went is
kept on the alert (`deliveries`: per phase and channel, sent or failed and after how many tries).
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pandas as pd

from gpuledger.analytics.store.access import Audit, audited_write

if TYPE_CHECKING:
    from gpuledger.analytics.store.database import Store

DDL = [
    # a budget set through the API, over the config's; the newest row of a team is in force (history kept)
    """CREATE TABLE IF NOT EXISTS budgets (
    team VARCHAR NOT NULL, usd DOUBLE NOT NULL, set_by VARCHAR NOT NULL, set_at TIMESTAMPTZ NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS alerts (
    id VARCHAR NOT NULL, key VARCHAR NOT NULL, kind VARCHAR NOT NULL, team VARCHAR NOT NULL, subject VARCHAR NOT NULL,
    detail JSON, fired_at TIMESTAMPTZ NOT NULL, resolved_at TIMESTAMPTZ, deliveries JSON)""",
]


def set_budget(store: "Store", team: str, usd: float, by: str, at: datetime, audit: Audit | None) -> None:
    with audited_write(store, audit) as tx:
        tx.cursor.execute("INSERT INTO budgets VALUES (?, ?, ?, ?)", [team, usd, by, at])
        tx.record(team=team, usd=usd)


def stored_budgets(store: "Store") -> pd.DataFrame:
    """The budget in force per team set through the API: team, usd, set_by, set_at."""
    return store.query("SELECT team, arg_max(usd, set_at) AS usd, arg_max(set_by, set_at) AS set_by, "
                       "max(set_at) AS set_at FROM budgets GROUP BY team ORDER BY team")


def open_alerts(store: "Store") -> pd.DataFrame:
    return store.query("SELECT * FROM alerts WHERE resolved_at IS NULL ORDER BY fired_at")


def alerts(store: "Store", limit: int = 200) -> pd.DataFrame:
    return store.query("SELECT * FROM alerts ORDER BY fired_at DESC LIMIT $n", {"n": limit})


def raise_and_resolve(store: "Store", holding: list[dict[str, Any]], at: datetime
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Insert an alert for each condition in `holding` (key, kind, team, subject, detail) that has none open, and
    resolve the open alerts whose condition is not in it; (raised, resolved), each as stored."""
    keys = {c["key"] for c in holding}
    raised: list[dict[str, Any]] = []
    with store.transaction() as cur:
        open_now = cur.execute("SELECT * FROM alerts WHERE resolved_at IS NULL").df()
        known = set(open_now["key"])
        for condition in holding:
            if condition["key"] in known:
                continue
            row = {**condition, "id": uuid.uuid4().hex[:12], "fired_at": at, "resolved_at": None, "deliveries": {}}
            cur.execute("INSERT INTO alerts VALUES ($id, $key, $kind, $team, $subject, $detail, $fired_at, NULL, "
                        "'{}')", {"id": row["id"], "key": row["key"], "kind": row["kind"], "team": row["team"],
                                  "subject": row["subject"], "fired_at": at,
                                  "detail": json.dumps(condition.get("detail") or {}, default=str)})
            raised.append(row)
            known.add(condition["key"])
        ended = open_now[~open_now["key"].isin(keys)]
        if not ended.empty:
            cur.execute("UPDATE alerts SET resolved_at = $at WHERE resolved_at IS NULL AND id IN (SELECT unnest($ids))",
                        {"at": at, "ids": list(ended["id"])})
    resolved = [{**r, "detail": json.loads(r["detail"] or "{}"), "resolved_at": at}
                for r in ended.to_dict(orient="records")]
    return raised, resolved


def record_delivery(store: "Store", alert_id: str, phase: str, channel: str, outcome: str, tries: int) -> None:
    """Note on the alert where its `phase` (fired, resolved) message went over `channel` and how."""
    patch = json.dumps({f"{phase} {channel}": {"outcome": outcome, "tries": tries}})
    with store.transaction() as cur:
        cur.execute("UPDATE alerts SET deliveries = json_merge_patch(coalesce(deliveries, '{}'), ?) WHERE id = ?",
                    [patch, alert_id])
