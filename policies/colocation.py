"""Co-locate advice: a running multi-GPU job spread over nodes, whose measured cross-node traffic would go over
NVLink if its GPUs sat inside one NVLink island, with the gain that move is expected to bring.

Why not every spread job: a job that talks little across nodes loses little there, and a job spread over the nodes
of one multi-node NVLink clique (GB200 NVL72) already talks over NVLink. So the advice rests on what the job was
measured to do over the last hour:

- cross-node traffic: its PCIe bytes per GPU-second (under GPUDirect RDMA a GPU reaches its NIC over PCIe; host
  copies ride there too, so this bounds the network part from above) at or over `[placement]
  colocate_min_gbytes_s_per_gpu`, read on at least `[efficiency] min_coverage` of its GPU-seconds;
- its topology (analytics/topology.py): the islands and cliques its GPUs are in now;
- the target: an island of one node of its model that holds all of it (its own GPUs there plus free ones), the one
  keeping most of its GPUs where they are, then leaving the fewest spare; a node without a topology reading is
  taken as its model's board says (collector/topology.py inferred_islands), and the advice says so.

The expected gain: moved onto NVLink, the same bytes take `traffic / nvlink` of the time instead of
`traffic / network` (`[placement] network_gbytes_s_per_gpu`; NVLink from the catalogue's datasheet figure). The
difference is the share of the job's time that could be saved, capped by the share its SMs were measured to wait
(1 - SM active), since communication overlapped with compute costs nothing: an upper bound, stated as such. Times
the job's GPUs it is GPU-hours per day, and at the model's rate $ per week.

A spread job whose traffic was not read (no PCIe counter) gets no advice with a number: it is listed as
`insufficient_data` with the reason, never given a gain of zero or a guessed one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.fragmentation import holders, job_traffic
from gpuledger.analytics.records import number_or_none
from gpuledger.analytics.store import Store
from gpuledger.analytics.topology import topology_gpus
from gpuledger.collector.gpu_catalog import MODELS
from gpuledger.collector.topology import inferred_islands
from gpuledger.policies.consolidation import layout
from gpuledger.policies.quota import HOURS_PER_WEEK
from gpuledger.policies.recommendation import INSUFFICIENT_DATA, Recommendation

TRAFFIC_WINDOW = timedelta(hours=1)  # what the job does now, not what it did in an earlier phase
ASSUMES = ("the cross-node bytes are the job's PCIe bytes (an upper bound: host copies ride there too); moved "
           "inside one NVLink island they go at the model's NVLink rate; communication not overlapped with compute "
           "(the saving is capped by the share of time the SMs were measured to wait): an upper bound")


@dataclass(frozen=True)
class Target:
    """Where a spread job fits whole: a node's NVLink island."""
    node: str
    island: int
    own_gpus: int  # of the job's GPUs already in that island
    spare: int  # GPUs of the island left free once the job is there
    basis: str  # the island's: measured, inferred (a source inferred it) or model (no topology read for the node)
    note: str | None  # the rule when inferred from the model here


Islands = dict[str, tuple[dict[str, int], str, str | None]]  # per node: (GPU -> island, basis, note)


def _islands(places: pd.DataFrame, held: pd.DataFrame, model: dict[str, str]) -> Islands:
    """Per node holding GPUs: (GPU -> island, basis, note). Nodes with no topology reading: their model's board
    rule, so every node of `held` is there."""
    out: Islands = {}
    for node, rows in places.groupby("node"):
        out[str(node)] = ({str(g): int(i) for g, i in zip(rows["gpu_uuid"], rows["island"]) if pd.notna(i)},
                          str(rows["basis"].iloc[0]), None)
    for node, gpus in held.groupby("node")["gpu_uuid"]:
        if node in out:
            continue
        rule, note = inferred_islands(model[node], None)
        uuids = sorted(set(gpus))
        out[node] = ({g: 0 if rule == "node" else k for k, g in enumerate(uuids)}, "model", note)
    return out


def _target(job: str, gpus: int, gpu_model: str, free: dict[str, set[str]], model: dict[str, str],
            jobs: dict[str, dict[str, set[str]]], islands: Islands) -> Target | None:
    """The island of a node of `gpu_model` that holds all `gpus`: most of the job's GPUs already there, then the
    fewest left spare, then the lowest node and island."""
    best = None
    for node in sorted(n for n in free if model[n] == gpu_model):
        island_of, basis, note = islands[node]
        mine = jobs.get(node, {}).get(job, set())
        by_island: dict[int, tuple[int, int]] = {}
        for gpu in free[node] | mine:
            if gpu in island_of:
                room, own = by_island.get(island_of[gpu], (0, 0))
                by_island[island_of[gpu]] = (room + 1, own + (gpu in mine))
        for island, (room, own) in by_island.items():
            if room < gpus:
                continue
            key = (-own, room - gpus, node, island)
            if best is None or key < best[0]:
                best = (key, Target(node, island, own, room - gpus, basis, note))
    return best[1] if best else None


def expected_gain(traffic: float, sm_active: float | None, gpus: int, nvlink: float, network: float,
                  rate: float | None) -> dict[str, float | None]:
    """The share of the job's time the move could save and what that is worth (see the module's docstring)."""
    over_network = min(traffic / network, 1.0)
    over_nvlink = min(traffic / nvlink, 1.0)
    saved = max(over_network - over_nvlink, 0.0)
    waits = None if sm_active is None else max(1.0 - sm_active, 0.0)
    if waits is not None:
        saved = min(saved, waits)
    per_day = gpus * 24.0 * saved
    return {"time_share_over_network": over_network, "time_share_over_nvlink": over_nvlink,
            "sm_waiting_share": waits, "time_share_saved": saved, "gpu_hours_per_day": per_day,
            "effect_usd_per_week": per_day / 24.0 * HOURS_PER_WEEK * rate if rate is not None else None}


def colocate_advice(store: Store, config: Config, at: datetime, latest: datetime) -> list[Recommendation]:
    """Running jobs spread over nodes whose measured cross-node traffic one NVLink island would carry, with the
    expected gain; spread jobs whose traffic is unread as insufficient_data."""
    held = holders(store, latest + timedelta(microseconds=1))
    if held.empty:
        return []
    running = held[held["allocated"] & held["job_id"].notna()]
    spread = running.groupby("job_id")["node"].nunique()
    spread = spread[spread > 1]
    if spread.empty:
        return []
    free, model, jobs = layout(held)
    places = topology_gpus(store, latest, rack_label=config.topology.rack_label)
    islands = _islands(places, held, model)
    clique_of = {str(g): c for g, c in zip(places["gpu_uuid"], places["clique_id"]) if pd.notna(c)}
    traffic = job_traffic(store, at - TRAFFIC_WINDOW, at).set_index("job_id")
    settings, out = config.placement, []
    rows_of = dict(iter(running[running["job_id"].isin(spread.index)].groupby("job_id")))  # one pass, not one a job
    for job in spread.index:
        mine = rows_of[job]
        gpus, gpu_model = int(mine["gpu_uuid"].nunique()), str(mine["gpu_model"].iloc[0])
        nvlink = getattr(MODELS.get(gpu_model), "nvlink_gbytes_s", None)
        cliques = {clique_of.get(str(g)) for g in mine["gpu_uuid"]}
        if not nvlink or (len(cliques) == 1 and None not in cliques):
            continue  # no NVLink to move to, or one multi-node NVLink clique: it already talks over NVLink
        per_node = mine.groupby("node")["gpu_uuid"].nunique().to_dict()
        shape = {node: sorted({islands[node][0].get(str(g)) for g in rows["gpu_uuid"]} - {None})
                 for node, rows in mine.groupby("node")}
        spans = f"{job} runs {gpus} GPUs over {len(per_node)} nodes ({', '.join(sorted(per_node))})"
        row = traffic.loc[job] if job in traffic.index else None
        measured = number_or_none(row["pcie_gbytes_s_per_gpu"]) if row is not None else None
        coverage = number_or_none(row["traffic_coverage"]) if row is not None else None
        team = str(mine["team"].iloc[0])
        evidence = {"gpus_per_node": per_node, "islands_per_node": shape, "at": latest,
                    "traffic_window_minutes": TRAFFIC_WINDOW.total_seconds() / 60, "traffic_coverage": coverage}
        if measured is None or coverage is None or coverage < config.efficiency.min_coverage:
            read = "no PCIe reading" if not coverage else f"PCIe read on {coverage:.0%} of its GPU-seconds"
            out.append(Recommendation(
                kind="colocate", team=team, gpu_model=gpu_model, job_id=str(job), action={}, status=INSUFFICIENT_DATA,
                evidence=evidence,
                reason=(f"{spans}, but its cross-node traffic is unknown ({read} in the last hour, "
                        f"{config.efficiency.min_coverage:.0%} needed): no gain can be stated")))
            continue
        if measured < settings.colocate_min_gbytes_s_per_gpu:
            continue  # it talks little across nodes: nothing to gain worth a move
        target = _target(str(job), gpus, gpu_model, free, model, jobs, islands)
        if target is None:
            continue  # no island of its model holds it whole now
        sm = number_or_none(row["sm_active"])
        sm = sm if sm is not None and (number_or_none(row["profiling_coverage"]) or 0) >= \
            config.efficiency.min_coverage else None
        gain = expected_gain(measured, sm, gpus, float(nvlink), settings.network_gbytes_s_per_gpu,
                             config.rates.get(gpu_model))
        if gain["time_share_saved"] <= 0:
            continue
        nvl = number_or_none(row["nvlink_gbytes_s_per_gpu"])
        evidence.update({
            "cross_node_gbytes_s_per_gpu": measured, "nvlink_gbytes_s_per_gpu": nvl, "sm_active": sm,
            "network_gbytes_s_per_gpu": settings.network_gbytes_s_per_gpu, "nvlink_gbytes_s": float(nvlink),
            "target_basis": target.basis, "target_spare_gpus": target.spare, "target_own_gpus": target.own_gpus,
            "free_gpus_on_target": len(free[target.node]),
            **({"target_note": target.note} if target.note else {}), **gain, "assumes": ASSUMES})
        usd = gain["effect_usd_per_week"]
        out.append(Recommendation(
            kind="colocate", team=team, gpu_model=gpu_model, job_id=str(job),
            action={"node": target.node, "gpus": gpus, "island": target.island},
            evidence=evidence,
            reason=(f"{spans} and sends {measured:.1f} GB/s per GPU across them; inside NVLink island "
                    f"{target.island} of {target.node} that traffic would take "
                    f"{gain['time_share_over_nvlink']:.1%} of the time instead of "
                    f"{gain['time_share_over_network']:.0%} over the {settings.network_gbytes_s_per_gpu:g} GB/s "
                    f"network: up to {gain['time_share_saved']:.0%} of its time saved, "
                    f"{gain['gpu_hours_per_day']:.1f} GPU-hours a day"
                    + (f" (${usd:,.0f}/week)" if usd is not None and math.isfinite(usd) else ""))))
    return out
