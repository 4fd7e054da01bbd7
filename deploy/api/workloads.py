"""Workloads: queue waits, outcomes and what waits now, from the schedulers' job records (collector/jobs)."""
from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter

from fastapi import Query

from gpuledger.analytics.queues import admission_waits
from gpuledger.analytics.records import json_safe, records
from gpuledger.analytics.windows import utc_now
from gpuledger.analytics.workload_classes import class_usage
from gpuledger.analytics.workloads import outcomes, scheduler_coverage, waiting_now, workload_summary
from gpuledger.deploy.api.access import ReadCaller
from gpuledger.deploy.api.deps import CaughtUp, ConfigDep, Days, End, StoreDep, window
from gpuledger.deploy.api.models import ExportStatus, SchedulerCoverage, SchedulerQueues, Workloads
from gpuledger.policies.exporting import DEFAULT_STATUS, STATUSES
from gpuledger.policies.quota_plan import build_plan, site_gres
from gpuledger.policies.scheduler_state import compare_with_scheduler

router = APIRouter(tags=["workloads"], dependencies=[CaughtUp])  # deps.caught_up


@router.get("/v1/workloads", response_model=Workloads)
def workloads(caller: ReadCaller, store: StoreDep, days: float = Days, end: datetime | None = End) -> dict:
    """Per team and GPU model: queue waits (p50, p95, longest) of the jobs that started in the window, jobs and
    GPU-hours by outcome (GPU-hours lost to failed and preempted work on a line of their own), restarts, and the
    jobs waiting now with the scheduler's reason. Empty where no scheduler's job records were loaded
    (`gpuledger import sacct`): no wait is ever assumed to be zero."""
    start, stop, span = window(days, end)
    at = min(stop, utc_now())
    return {"window": span, "at": json_safe(at),
            "by_team": caller.visible(records(workload_summary(store, start, stop, at)), shared=False),
            "by_class": caller.visible(records(workload_summary(store, start, stop, at,
                                                                by=("team", "workload_class"))), shared=False),
            "class_usage": caller.visible(records(class_usage(store, start, stop)), shared=False),
            "outcomes": caller.visible(records(outcomes(store, start, stop, at)), shared=False),
            "waiting_now": caller.visible(records(waiting_now(store, at)), shared=False)}


@router.get("/v1/workloads/queues", response_model=SchedulerQueues)
def scheduler_queue_state(caller: ReadCaller, store: StoreDep, config: ConfigDep, days: float = Days,
                          end: datetime | None = End,
                          status: ExportStatus = Query(DEFAULT_STATUS, description="the plan compared: accepted (advice "
                                                       "an admin accepted) or open (proposed too)")) -> dict:
    """The queues Kueue and KAI run, as their metrics say (read through `serve --jobs-from prometheus` or `gpuledger
    import kueue|kai`), and Slurm's account limits (`gpuledger import sacctmgr`): the quota in force beside
    gpuledger's plan (Slurm: the GrpTRES GPU limit beside the plan's limit), what each queue holds and has waiting, and
    Kueue's admission waits over the window. Empty where no scheduler's metrics were read. A team token sees its
    own team's queues and no admission waits (those are per queue, not per team)."""
    start, stop, span = window(days, end)
    at = min(stop, utc_now())
    plan = build_plan(store, config, STATUSES[status], at=at)
    plan.gres = site_gres(store, config, plan, at)  # Slurm's GPU types as the site's sacct names them
    return {"window": span, "at": json_safe(at),
            "queues": caller.visible(records(compare_with_scheduler(store, plan, at)), shared=False),
            "admission_waits": records(admission_waits(store, start, stop)) if caller.team is None else []}


@router.get("/v1/workloads/coverage", response_model=SchedulerCoverage)
def coverage(caller: ReadCaller, store: StoreDep, days: float = Days, end: datetime | None = End) -> dict:
    """Where the schedulers' job records and the GPU telemetry disagree in the window: jobs said to run with no
    recent sample, jobs that ran and ended with none, telemetry of jobs no scheduler knows. Counted and named per
    source; nothing is resolved by a guess. A team token sees its own team's jobs only."""
    start, stop, _ = window(days, end)
    return json_safe(scheduler_coverage(store, start, stop, min(stop, utc_now()), team=caller.team))
