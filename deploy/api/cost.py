"""Chargeback: cost per team at the rate card (in all and per day), waste (idle allocations, memory-oversized
jobs), and one row per job."""
from __future__ import annotations

from dataclasses import asdict
from datetime import datetime

import pandas as pd
from fastapi import APIRouter, Query

from gpuledger.analytics.cost import cost_by_team, daily_cost_by_team
from gpuledger.analytics.cost_split import cents_usd
from gpuledger.analytics.energy import complete_from, energy
from gpuledger.analytics.records import records
from gpuledger.analytics.store import Store
from gpuledger.analytics.waste import job_table, waste
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import CaughtUp, ConfigDep, Days, End, StoreDep, window
from gpuledger.deploy.api.models import Costs, DailyCost, Energy, JobRow, Rate, Waste

router = APIRouter(tags=["cost"], dependencies=[CaughtUp])  # deps.caught_up


@router.get("/v1/costs", response_model=Costs)
def costs(caller: ReadCaller, store: StoreDep, days: float = Days, end: datetime | None = End) -> dict:
    """Cost per team, plus the unattributed and idle-capacity lines, with the rates used."""
    start, stop, span = window(days, end)
    every = records(with_cents(cost_by_team(store, start, stop)))
    lines = caller.visible(every)
    # the total of the lines shown, so a team token's table adds up to its total too (its own line and the shared
    # unattributed and idle-capacity lines); the cluster's cost beside it, without the other teams' names. Each in
    # whole cents, summed as cents: the answer's amounts are rounded to the cent and still add up
    return {"window": span, "rates": rates_in(store, start, stop), "teams": lines,
            "total_usd": sum(round(line["cost_usd"] * 100) for line in lines) / 100,
            "cluster_total_usd": sum(round(line["cost_usd"] * 100) for line in every) / 100}


def with_cents(frame: pd.DataFrame) -> pd.DataFrame:
    """Bill lines whose `cost_usd` is whole cents adding up to the total rounded once (analytics/cost_split.py
    `in_cents`): the API answers amounts to the cent, and a table rounded line by line could miss its total."""
    return frame.assign(cost_usd=cents_usd(frame["cost_usd"]))


def rates_in(store: Store, start: datetime, stop: datetime) -> list[dict]:
    """The versions of the rate card in force at some instant of [start, stop), with their labels."""
    history = store.rate_history()
    return records(history[(history["effective_from"] < stop) & (history["until"].isna() | (history["until"] > start))])


@router.get("/v1/rates", response_model=list[Rate])
def rates(caller: ReadCaller, store: StoreDep) -> list[dict]:
    """Every version of every GPU model's rate, with its start, its end (the next version's start) and, where a
    cost model derived it, its arithmetic (`basis`)."""
    return records(store.rate_history())


@router.get("/v1/energy", response_model=Energy)
def energy_view(caller: ReadCaller, store: StoreDep, config: ConfigDep, days: float = Days,
                end: datetime | None = End,
                limit: int = Query(100, ge=1, le=5000, description="jobs, most energy first")) -> dict:
    """Energy per bill line and per job: GPU kWh from the samples' power readings (null without any), the share
    of GPU-hours read, and facility kWh at the on-premises cost model's PUE. From raw samples, kept
    [retention] raw_days: `complete_from` says from when the figures are whole."""
    start, stop, span = window(days, end)
    pue = config.pue()
    teams, jobs = energy(store, start, stop, pue=pue, limit=limit)
    return {"window": span, "complete_from": complete_from(store), "pue": pue,
            "teams": caller.visible(records(teams)), "jobs": caller.visible(records(jobs), shared=False)}


@router.get("/v1/waste", response_model=Waste)
def waste_view(caller: ReadCaller, store: StoreDep, config: ConfigDep, days: float = Days, end: datetime | None = End,
          limit: int = Query(50, ge=1, le=1000, description="rows of idle runs and oversized jobs")) -> dict:
    """Idle allocated GPU-hours per team, the longest idle stretches, and jobs that fit a smaller shape."""
    start, stop, span = window(days, end)
    found = waste(store, start, stop, config.waste)
    return {
        "window": span,
        "thresholds": asdict(config.waste),
        "by_team": caller.visible(records(found.by_team)),
        "idle_runs": caller.page(found.stretches, limit, shared=False),
        "oversized_jobs": caller.page(found.oversized, limit, shared=False),
    }


@router.get("/v1/costs/daily", response_model=list[DailyCost])
def daily_costs(caller: ReadCaller, store: StoreDep, days: float = Days, end: datetime | None = End) -> list[dict]:
    """Cost per UTC day and bill line: each team, the unattributed bucket and the idle capacity."""
    start, stop, _ = window(days, end)
    return caller.visible(records(with_cents(daily_cost_by_team(store, start, stop))))


@router.get("/v1/jobs", response_model=list[JobRow])
def jobs(caller: ReadCaller, store: StoreDep, config: ConfigDep, days: float = Days, end: datetime | None = End,
         team: str | None = Query(None, max_length=253, description="only this team's jobs"),
         q: str | None = Query(None, max_length=253, description="only jobs whose id or user contains this"),
         limit: int = Query(500, ge=1, le=10000, description="most rows, most costly first")) -> list[dict]:
    """One row per job of the window, like jobstats: GPUs, model, GPU-hours, cost, mean and p95 utilisation,
    peak memory of the card's, idle share and a waste flag."""
    start, stop, _ = window(days, end)
    team = caller.own(team, store)
    return records(job_table(store, start, stop, team, q, limit, config.waste.oversized_mem_fraction))
