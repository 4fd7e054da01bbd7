"""Which node each GPU is in: a node bills only its registered GPUs, and only an admin moves one.

Why: the node of a pushed row is the agent's token's, but its GPU UUID is the agent's word. Before this, a GPU went
to the first node that sent it once its home had been silent ten minutes (an agent upgrade, a reboot, a server
outage), and the real node's rows were then refused and deleted from its spool: one node could squat another's
GPUs and the real data was lost. Now:

- A node registers its GPUs from its own reports on first sight: the GPUs it sends within `register_window_s` of
  its first accepted row (the hardware it booted with), at most `max_gpus` of them, with the model it reports.
  After that the node's inventory is closed.
- A GPU registered to one node is never taken by another, however long its node is silent, across restarts (the
  inventory is a table, not memory). A GPU a node did not register is not billed either.
- Such rows are not dropped: they are held (`held_samples`, with the reason) and answered as `held` so the agent
  need not keep them, counted in `gpuledger_ingest_rows_held_total{reason}` and listed by GET /v1/nodes/inventory.
  An admin who moves the GPU (POST /v1/nodes/{node}/gpus, audited) releases the node's held rows into the samples,
  held to the same rules as any push (analytics/store/gpu_time.py).
- A registered GPU keeps its model: a row naming another known model is refused (`model_mismatch`); a model the
  catalogue did not know at registration ("unknown") is replaced by the first known one reported.

A store written before the inventory existed is registered from its samples once (`registered_by = 'history'`),
so an upgrade holds nobody's data.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from gpuledger.analytics.store.schema import _DUCK_TYPES  # the one map of Arrow to DuckDB types
from gpuledger.collector.gpu_catalog import UNKNOWN_MODEL
from gpuledger.collector.samples import SAMPLE_SCHEMA

log = logging.getLogger(__name__)

ON_OTHER_NODE = "gpu_on_other_node"  # registered to another node
NOT_REGISTERED = "gpu_not_in_inventory"  # new on a node whose inventory is closed, or past its GPU cap
BEFORE_REGISTRATION = "before_registration"  # dated over BACKDATE_GRACE before its GPU's registered `since`
# how far before its registered start a GPU's rows still bill: a batch sent out of order, or an agent's clock set
# back an hour, is honest; a made-up GPU registered now billing the month before is not
BACKDATE_GRACE = timedelta(hours=2)
HELD_REASONS = (ON_OTHER_NODE, NOT_REGISTERED, BEFORE_REGISTRATION)
MODEL_MISMATCH = "model_mismatch"
REGISTER_WINDOW_S = 900.0  # a node's first quarter hour registers the GPUs it reports
SEEDED_KEY = "gpu_inventory_seeded"
HISTORY_DAYS = 31  # how far back an upgraded store's samples register GPUs
HELD_EXTRA = {"held_reason": "VARCHAR", "held_at": "TIMESTAMPTZ"}

DDL = [
    # no keys: a GPU moved by an admin is a delete and an insert (DuckDB updates an indexed row the same way)
    """CREATE TABLE IF NOT EXISTS gpu_inventory (
    gpu_uuid VARCHAR NOT NULL, node VARCHAR NOT NULL, gpu_model VARCHAR, registered_at TIMESTAMPTZ NOT NULL,
    registered_by VARCHAR NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS node_inventory (node VARCHAR NOT NULL, first_seen TIMESTAMPTZ NOT NULL)""",
    # the first instant the GPU bills from on its node: the oldest row it was registered with (a GPU registered
    # now cannot bill the month before it: a made-up GPU registered in a node's first minutes then back-dated)
    "ALTER TABLE gpu_inventory ADD COLUMN IF NOT EXISTS since TIMESTAMPTZ",
    # a node whose agent posted its own hardware (POST /v1/topology: NVML's or dcgm-exporter's list of its GPUs)
    # registers exactly those: a row naming another GPU is held even in the node's first minutes
    "ALTER TABLE node_inventory ADD COLUMN IF NOT EXISTS hardware_reported BOOLEAN",
]


def held_ddl(existing: set[str]) -> list[str]:
    """The held rows' table: every sample column and why it is held; columns a newer sample schema adds are
    added to an older table (run after the samples' own migrations)."""
    columns = [(f.name, _DUCK_TYPES[f.type]) for f in SAMPLE_SCHEMA] + list(HELD_EXTRA.items())
    if not existing:
        body = ",\n    ".join(f'"{name}" {kind}' for name, kind in columns)
        return [f"CREATE TABLE IF NOT EXISTS held_samples (\n    {body}\n)"]
    return [f'ALTER TABLE held_samples ADD COLUMN "{name}" {kind}' for name, kind in columns if name not in existing]


def seed(cur: Any) -> None:
    """Once per store written before the inventory (Store's migrations): its GPUs, each to the node that sent it
    last, and its nodes, each seen since its first sample (so their inventories are closed)."""
    since = datetime.now(timezone.utc) - timedelta(days=HISTORY_DAYS)
    cur.execute("""INSERT INTO gpu_inventory BY NAME
                   SELECT gpu_uuid, arg_max(node, ts) AS node, arg_max(gpu_model, ts) AS gpu_model,
                          min(ts) AS registered_at, 'history' AS registered_by, min(ts) AS since FROM samples
                   WHERE ts >= $since AND gpu_uuid IS NOT NULL AND node IS NOT NULL
                     AND gpu_uuid NOT IN (SELECT gpu_uuid FROM gpu_inventory)
                   GROUP BY gpu_uuid""", {"since": since})
    cur.execute("""INSERT INTO node_inventory (node, first_seen)
                   SELECT node, min(ts) FROM samples WHERE ts >= $since AND node IS NOT NULL
                     AND node NOT IN (SELECT node FROM node_inventory) GROUP BY node""", {"since": since})


@dataclass(frozen=True)
class Registered:
    node: str
    model: str | None
    since: datetime | None = None  # null: a row of any age (within retention) may bill it


@dataclass
class Verdict:
    """What the inventory says of a group's rows: per row the reason it is held (null: billed), per row whether
    its model contradicts the registered one, and the registrations and model updates to commit with it."""
    held: pa.Array | None
    mismatched: pa.Array | None
    registrations: list[tuple[str, str, str | None, datetime | None]]  # (gpu, node, model, since)
    opened: list[str]  # nodes seen for the first time
    models: list[tuple[str, str]]  # (gpu, model): an unknown model made known


class GpuInventory:
    """The writer thread's copy of the inventory (loaded at start, changed only inside commits)."""

    def __init__(self, register_window_s: float = REGISTER_WINDOW_S, max_gpus: int = 64) -> None:
        self.window = timedelta(seconds=register_window_s)
        self.max_gpus = max_gpus
        self.gpus: dict[str, Registered] = {}
        self.nodes: dict[str, datetime] = {}  # node -> first seen
        self.reported: set[str] = set()  # nodes whose GPUs are their hardware report's: no more by first sight
        self.counts: dict[str, int] = {}  # node -> GPUs registered

    def load(self, cur: Any) -> None:
        """Read the inventory (the store registered an older store's GPUs from its samples when it opened it)."""
        self.gpus = {gpu: Registered(node, model, since) for gpu, node, model, since in cur.execute(
            "SELECT gpu_uuid, node, gpu_model, since FROM gpu_inventory").fetchall()}
        self.nodes = dict(cur.execute("SELECT node, min(first_seen) FROM node_inventory GROUP BY node").fetchall())
        self.reported = {n for (n,) in cur.execute(
            "SELECT DISTINCT node FROM node_inventory WHERE hardware_reported").fetchall()}
        self.counts = {}
        for reg in self.gpus.values():
            self.counts[reg.node] = self.counts.get(reg.node, 0) + 1

    def judge(self, rows: pa.Table, pairs: pa.Table, now: datetime) -> Verdict:
        """Each (GPU, node) of the rows (`pairs`, first sender first) against the inventory."""
        held: dict[tuple[str, str], str] = {}
        registrations: list[tuple[str, str, str | None]] = []
        opened: list[str] = []
        counts = dict(self.counts)
        claimed: dict[str, str] = {}
        distinct = rows.select(["gpu_uuid", "node", "gpu_model"]).group_by(
            ["gpu_uuid", "node", "gpu_model"], use_threads=False).aggregate([])  # (GPU, node, model) once
        triples = list(zip(*(distinct[c].to_pylist() for c in ("gpu_uuid", "node", "gpu_model"))))
        models = self._models(triples)
        oldest = rows.select(["gpu_uuid", "node", "ts"]).group_by(["gpu_uuid", "node"], use_threads=False).aggregate(
            [("ts", "min")])
        first_ts = {(g, n): t for g, n, t in zip(*(oldest[c].to_pylist() for c in ("gpu_uuid", "node", "ts_min")))}
        early: list[tuple[str, str, datetime]] = []
        for gpu, node in zip(pairs["gpu_uuid"].to_pylist(), pairs["node"].to_pylist()):
            reg = self.gpus.get(gpu)
            owner = reg.node if reg is not None else claimed.get(gpu)
            if owner is not None:
                if owner != node:
                    held[(gpu, node)] = ON_OTHER_NODE
                elif reg is not None and reg.since is not None and first_ts[(gpu, node)] < reg.since - BACKDATE_GRACE:
                    early.append((gpu, node, reg.since - BACKDATE_GRACE))
                continue
            first = self.nodes.get(node)
            if first is None:  # a node's first report opens its inventory
                if node not in opened:
                    opened.append(node)
                first = now
            if node in self.reported or now - first > self.window or counts.get(node, 0) >= self.max_gpus:
                held[(gpu, node)] = NOT_REGISTERED
                continue
            claimed[gpu] = node
            counts[node] = counts.get(node, 0) + 1
            registrations.append((gpu, node, models.get((gpu, node)), first_ts[(gpu, node)]))
        mismatched, updates = self._mismatched(rows, models, triples)
        return Verdict(self._mask(rows, held, early), mismatched, registrations, opened, updates)

    @staticmethod
    def _models(triples: list[tuple[str, str, str | None]]) -> dict[tuple[str, str], str | None]:
        """The first known model each (GPU, node) reports in the rows (else "unknown")."""
        found: dict[tuple[str, str], str | None] = {}
        for gpu, node, model in triples:
            if found.get((gpu, node)) in (None, UNKNOWN_MODEL):
                found[(gpu, node)] = model
        return found

    def _mismatched(self, rows: pa.Table, models: dict[tuple[str, str], str | None],
                    triples: list[tuple[str, str, str | None]]) -> tuple[pa.Array | None, list[tuple[str, str]]]:
        """Rows whose known model contradicts their GPU's known registered model; unknown models made known."""
        bad: list[tuple[str, str]] = []
        updates: list[tuple[str, str]] = []
        for (gpu, node), model in models.items():
            reg = self.gpus.get(gpu)
            if reg is None or reg.node != node or model in (None, UNKNOWN_MODEL):
                continue
            if reg.model in (None, UNKNOWN_MODEL):
                updates.append((gpu, model))
        known = dict(updates)
        for gpu, node, model in triples:
            reg = self.gpus.get(gpu)
            said = known.get(gpu, reg.model if reg is not None else None)
            if reg is None or reg.node != node or model in (None, UNKNOWN_MODEL) or said in (None, UNKNOWN_MODEL):
                continue
            if model != said:
                bad.append((gpu, model))
        if not bad:
            return None, updates
        mask = None
        for gpu, model in bad:
            one = pc.and_(pc.equal(rows["gpu_uuid"], gpu), pc.equal(rows["gpu_model"], model))
            mask = one if mask is None else pc.or_(mask, one)
        return pc.fill_null(mask, False), updates

    @staticmethod
    def _mask(rows: pa.Table, held: dict[tuple[str, str], str],
              early: list[tuple[str, str, datetime]]) -> pa.Array | None:
        """Per row, the reason it is held, or null; None when no row is (the usual case). `early`: registered GPUs
        some of whose rows are dated before their `since`."""
        if not held and not early:
            return None
        reason = pa.nulls(rows.num_rows, pa.string())
        for (gpu, node), why in held.items():
            one = pc.fill_null(pc.and_(pc.equal(rows["gpu_uuid"], gpu), pc.equal(rows["node"], node)), False)
            reason = pc.if_else(one, pa.scalar(why), reason)
        ts_type = rows.schema.field("ts").type
        for gpu, node, since in early:
            one = pc.and_(pc.and_(pc.equal(rows["gpu_uuid"], gpu), pc.equal(rows["node"], node)),
                          pc.less(rows["ts"], pa.scalar(since, ts_type)))
            reason = pc.if_else(pc.fill_null(one, False), pa.scalar(BEFORE_REGISTRATION), reason)
        return reason

    def commit(self, cur: Any, verdict: Verdict, now: datetime, held_rows: pa.Table | None) -> None:
        """Inside the group's transaction: its registrations, first sightings, model updates and held rows."""
        if verdict.opened:
            cur.executemany("INSERT INTO node_inventory (node, first_seen) VALUES (?, ?)",
                            [[n, now] for n in verdict.opened])
        if verdict.registrations:
            cur.executemany("INSERT INTO gpu_inventory (gpu_uuid, node, gpu_model, registered_at, registered_by, "
                            "since) VALUES (?, ?, ?, ?, 'first-sight', ?)",
                            [[gpu, node, model, now, since] for gpu, node, model, since in verdict.registrations])
        for gpu, model in verdict.models:
            cur.execute("UPDATE gpu_inventory SET gpu_model = ? WHERE gpu_uuid = ?", [model, gpu])
        if held_rows is not None and held_rows.num_rows:
            cur.register("incoming_held", held_rows)
            cur.execute("INSERT INTO held_samples BY NAME SELECT * FROM incoming_held")
            cur.unregister("incoming_held")

    def committed(self, verdict: Verdict, now: datetime) -> None:
        """After the commit: the writer's copy follows the table."""
        for node in verdict.opened:
            self.nodes.setdefault(node, now)
        for gpu, node, model, since in verdict.registrations:
            self.gpus[gpu] = Registered(node, model, since)
            self.counts[node] = self.counts.get(node, 0) + 1
        for gpu, model in verdict.models:
            self.gpus[gpu] = replace(self.gpus[gpu], model=model)

    # --- an admin's moves --------------------------------------------------------------------------------------
    def assign(self, cur: Any, gpu: str, node: str, actor: str, now: datetime,
               model: str | None = None) -> tuple[str | None, Registered]:
        """Register `gpu` to `node` (inside a transaction): (the node it was registered to before, if any, and what
        is registered now). Its model: the one given, else the registered one (a move keeps it), else the first
        known one the node's held rows report. It bills from the oldest row of it that node has held, else from
        where it billed before on that node, else from now."""
        before = self.gpus.get(gpu)
        if model is None and before is not None:
            model = before.model
        if model in (None, UNKNOWN_MODEL):
            found = cur.execute("""SELECT gpu_model FROM held_samples WHERE gpu_uuid = ? AND node = ?
                                   ORDER BY gpu_model = ?, ts LIMIT 1""", [gpu, node, UNKNOWN_MODEL]).fetchone()
            model = found[0] if found else model
        oldest = cur.execute("SELECT min(ts) FROM held_samples WHERE gpu_uuid = ? AND node = ?", [gpu, node]).fetchone()
        since = oldest[0] if oldest and oldest[0] is not None else (
            before.since if before is not None and before.node == node else now)
        cur.execute("DELETE FROM gpu_inventory WHERE gpu_uuid = ?", [gpu])
        cur.execute("INSERT INTO gpu_inventory (gpu_uuid, node, gpu_model, registered_at, registered_by, since) "
                    "VALUES (?, ?, ?, ?, ?, ?)", [gpu, node, model, now, f"admin:{actor}", since])
        if node not in self.nodes:
            cur.execute("INSERT INTO node_inventory (node, first_seen) VALUES (?, ?)", [node, now])
        return (before.node if before is not None else None), Registered(node, model, since)

    def assigned(self, gpu: str, now_registered: Registered, now: datetime) -> None:
        before = self.gpus.get(gpu)
        if before is not None:
            self.counts[before.node] = max(0, self.counts.get(before.node, 1) - 1)
        self.gpus[gpu] = now_registered
        self.counts[now_registered.node] = self.counts.get(now_registered.node, 0) + 1
        self.nodes.setdefault(now_registered.node, now)

    def register_hardware(self, cur: Any, node: str, gpus: list[tuple[str, str | None]], now: datetime
                          ) -> dict[str, list[str]]:
        """Inside a transaction: the GPUs (UUID, model) a node's agent read from its own hardware, registered to it
        where no node has them, while the node's registration is open (its first `window`, or already reported:
        a GPU added to a node that reports its hardware is registered with its next report); from then on the node
        bills only registered GPUs. GPUs registered to another node stay there (an admin moves them). What
        happened, by outcome."""
        done: dict[str, list[str]] = {"registered": [], "already": [], "elsewhere": [], "closed": []}
        first = self.nodes.get(node)
        open_now = first is None or node in self.reported or now - first <= self.window
        for gpu, model in gpus:
            reg = self.gpus.get(gpu)
            if reg is not None:
                done["already" if reg.node == node else "elsewhere"].append(gpu)
            elif not open_now or self.counts.get(node, 0) + len(done["registered"]) >= self.max_gpus:
                done["closed"].append(gpu)
            else:
                done["registered"].append(gpu)
                cur.execute("INSERT INTO gpu_inventory (gpu_uuid, node, gpu_model, registered_at, registered_by, "
                            "since) VALUES (?, ?, ?, ?, 'hardware-report', ?)", [gpu, node, model, now, now])
        if first is None:
            cur.execute("INSERT INTO node_inventory (node, first_seen, hardware_reported) VALUES (?, ?, true)",
                        [node, now])
        else:
            cur.execute("UPDATE node_inventory SET hardware_reported = true WHERE node = ?", [node])
        return done

    def hardware_registered(self, node: str, gpus: list[tuple[str, str | None]], done: dict[str, list[str]],
                            now: datetime) -> None:
        """After the commit: the writer's copy follows the table."""
        models = dict(gpus)
        for gpu in done["registered"]:
            self.gpus[gpu] = Registered(node, models.get(gpu), now)
            self.counts[node] = self.counts.get(node, 0) + 1
        self.nodes.setdefault(node, now)
        self.reported.add(node)

    def known_node(self, cur: Any, node: str) -> bool:
        """Whether `node` has ever pushed (or registered a GPU): an admin moves GPUs only to a node that exists."""
        return node in self.nodes or bool(cur.execute("SELECT count(*) FROM nodes WHERE node = ?", [node]).fetchone()[0])


def inventory_rows(store: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every registered GPU, and the held rows per node, GPU and reason (count, first and last instant, and the
    node the GPU is registered to) for GET /v1/nodes/inventory."""
    if store.read_only and not store.scalar("SELECT count(*) FROM information_schema.tables "
                                            "WHERE table_name = 'gpu_inventory'"):
        empty = pd.DataFrame()
        return empty, empty  # a read-only view of a store no server of this version opened yet: nothing registered
    gpus = store.query("""SELECT node, gpu_uuid, gpu_model, registered_at, registered_by FROM gpu_inventory
                          ORDER BY node, gpu_uuid""")
    held = store.query("""SELECT h.node, h.gpu_uuid, h.held_reason AS reason, count(*) AS rows,
                                 min(h.ts) AS first_ts, max(h.ts) AS last_ts,
                                 sum(h.interval_s * h.gpu_fraction) FILTER (WHERE isfinite(h.interval_s * h.gpu_fraction)) / 3600
                                     AS gpu_hours,
                                 any_value(i.node) AS registered_to
                          FROM held_samples h LEFT JOIN gpu_inventory i USING (gpu_uuid)
                          GROUP BY h.node, h.gpu_uuid, h.held_reason ORDER BY h.node, h.gpu_uuid""")
    return gpus, held


def reported(store: Any, gpu: str) -> bool:
    """Whether any node has reported `gpu` (registered, or held): an admin registers only GPUs that exist."""
    return bool(store.scalar("SELECT (SELECT count(*) FROM gpu_inventory WHERE gpu_uuid = $g) "
                             "+ (SELECT count(*) FROM held_samples WHERE gpu_uuid = $g)", {"g": gpu}))


HELD_ALERT_HOURS = 24.0  # a node's held rows alert while it sent some within this long


def held_conditions(store: Any, now: datetime) -> list[dict[str, Any]]:
    """One alert condition per node and reason that had rows held in the last HELD_ALERT_HOURS: a node claiming
    another's GPUs, or reporting GPUs its inventory does not have (key, subject, detail; kind and team are the
    alert loop's)."""
    found = store.query("""SELECT h.node, h.held_reason AS reason, count(DISTINCT h.gpu_uuid) AS gpus,
                                  count(*) AS rows, min(h.held_at) AS since,
                                  string_agg(DISTINCT i.node, ', ') AS owners
                           FROM held_samples h LEFT JOIN gpu_inventory i USING (gpu_uuid)
                           WHERE h.held_at >= $since GROUP BY ALL ORDER BY h.node, reason""",
                        {"since": now - timedelta(hours=HELD_ALERT_HOURS)})
    out = []
    for row in found.to_dict("records"):
        whose = f"registered to {row['owners']}" if row["reason"] == ON_OTHER_NODE else "not in its inventory"
        out.append({"key": f"gpu held:{row['node']}:{row['reason']}",
                    "subject": f"node {row['node']} sent {row['gpus']} GPU(s) {whose}: {row['rows']} row(s) held, "
                               "not billed (GET /v1/nodes/inventory; an admin moves a GPU that really moved)",
                    "detail": {"node": row["node"], "reason": row["reason"], "gpus": int(row["gpus"]),
                               "rows": int(row["rows"]), "since": str(row["since"]), "registered_to": row["owners"]}})
    return out
