"""The weekly report of an ISO week, as the Monday job, `gpuledger report` and `GET /v1/reports/{week}` all make it:
the week's figures (analytics/report.py) with the advice as of its end, or as of now for the week in progress."""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

from gpuledger.analytics.config import Config
from gpuledger.analytics.report import ReportFiles, write_weekly_report
from gpuledger.analytics.store import Store, StoreError
from gpuledger.analytics.windows import iso_week, utc_now
from gpuledger.policies.alternatives import annotate
from gpuledger.policies.quota import evaluate_quotas
from gpuledger.policies.recommender import Evaluation, evaluate

log = logging.getLogger(__name__)


def weekly_report(store: Store, config: Config, out_dir: str | Path, week: str | None = None) -> ReportFiles:
    """The report of an ISO week (default the last complete one); refuses a week with no samples."""
    start, end, label = iso_week(week)
    if store.sample_count(start, end) == 0:
        raise StoreError(f"no samples in week {label} ({start:%Y-%m-%d} to {end:%Y-%m-%d}): nothing to report")
    with store.remembering():  # the advice and the report ask some questions twice: answered once
        if end <= utc_now():  # a week that is over: quota advice as of its end; placement advice would be stale
            policy_start = end - timedelta(days=config.quota.window_days)
            evaluation = Evaluation(end, policy_start, evaluate_quotas(store, config, end))
            files = write_weekly_report(store, config, out_dir, start, end, label, _advice(evaluation))
        else:  # the week in progress: the advice as of now (its end is in the future, when no GPU has reported),
            # worked out beside the week's figures: each read holds one core, and the two share few questions
            with ThreadPoolExecutor(1, thread_name_prefix="report-advice") as pool:
                pending = pool.submit(evaluate, store, config, utc_now())
                files = write_weekly_report(store, config, out_dir, start, end, label,
                                            lambda: _advice(pending.result()))
    log.info("weekly report %s written to %s", label, files.html)
    return files


def _advice(evaluation: Evaluation) -> list[dict]:
    """What a report shows of an evaluation: its proposals, grouped where they are alternatives
    (policies/alternatives.py), and its insufficient-data notes."""
    return annotate([r.to_dict() for r in evaluation.proposals() + evaluation.insufficient()])


__all__ = ["weekly_report"]
