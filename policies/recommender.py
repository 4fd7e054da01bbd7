"""The recommender: evaluate the policy at an instant, keep what was advised and decided, and stay stable.

`evaluate` is read-only: quota advice per team and GPU model (policies/quota.py) and placement advice for
running jobs (policies/placement.py), from the policy window before the instant, whatever window a caller
views. `refresh` stores what is new in the `recommendations` table and is how advice stays stable: a new
recommendation for the same kind, team, GPU model and job is stored only when it differs from the last one by
the configured step and the last is older than the cool-down; advice that is no longer needed is marked
superseded. `decide` records a person's decision (accept, reject, applied). The stored table is the audit
trail: every recommendation with its evidence, and who decided what, when, and why.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import pandas as pd

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.analytics.store.access import Audit, audited_write
from gpuledger.analytics.windows import as_utc, utc_now
from gpuledger.collector.errors import ConflictError, InputError
from gpuledger.policies.placement import placement_advice
from gpuledger.policies.quota import QuotaAdvice, evaluate_quotas
from gpuledger.policies.whatif.effects import simulate_effects
from gpuledger.policies.recommendation import (
    ACCEPTED,
    APPLIED,
    DECISIONS,
    HELD_BACK,
    INSUFFICIENT_DATA,
    OPEN,
    PREVIEW,
    PROPOSED,
    REJECTED,
    SUPERSEDED,
    Recommendation,
    stored,
)

REFRESHED_AT = "recommendations_refreshed_at"  # meta key: when the stored set was last re-evaluated
NEXT_STATUSES = {PROPOSED: {ACCEPTED, REJECTED, APPLIED}, ACCEPTED: {APPLIED, REJECTED}}


class DecisionError(ConflictError):
    """A decision that cannot be recorded: the recommendation's status cannot move to the one decided."""


class UnknownRecommendation(DecisionError):
    """No stored recommendation has that id."""
    http_status = 404


def quota_recommendation(advice: QuotaAdvice, status: str = PREVIEW) -> Recommendation:
    action = {"guarantee_gpus": advice.guarantee, "limit_gpus": advice.limit,
              "current_guarantee_gpus": advice.current} if advice.status != INSUFFICIENT_DATA else {}
    return Recommendation(kind="quota", team=advice.team, gpu_model=advice.gpu_model, action=action,
                          evidence=advice.evidence, reason=advice.reason,
                          status=advice.status if advice.status in (INSUFFICIENT_DATA, HELD_BACK) else status)


@dataclass
class Evaluation:
    at: datetime
    start: datetime
    quota: list[QuotaAdvice] = field(default_factory=list)
    placement: list[Recommendation] = field(default_factory=list)

    def proposals(self) -> list[Recommendation]:
        """What the policy would change now: quota changes and placement advice."""
        return ([quota_recommendation(a) for a in self.quota if a.status == "change"]
                + [r for r in self.placement if r.status != INSUFFICIENT_DATA])

    def insufficient(self) -> list[Recommendation]:
        """What is not advised, with the reason: quota advice without enough data, or held back because its
        simulated effect harms other teams; placement advice whose evidence was not measured (colocate without
        a traffic reading)."""
        return ([quota_recommendation(a) for a in self.quota if a.status in (INSUFFICIENT_DATA, HELD_BACK)]
                + [r for r in self.placement if r.status == INSUFFICIENT_DATA])

    def holds(self) -> set[tuple]:
        """Keys whose quota needs no change now, or whose change is held back (an open one is superseded)."""
        return {("quota", a.team, a.gpu_model, None) for a in self.quota if a.status in ("hold", HELD_BACK)}


def evaluate(store: Store, config: Config, at: datetime | None = None) -> Evaluation:
    """The policy at instant `at` (default now), from the policy window before it; stores nothing."""
    at = as_utc(at) if at else utc_now()
    with store.remembering():  # quota and placement advice ask some questions more than once: answered once
        quota = simulate_effects(store, config, at, evaluate_quotas(store, config, at))
        return Evaluation(at, at - timedelta(days=config.quota.window_days), quota,
                          placement_advice(store, config, at))


def _latest_by_key(store: Store) -> dict[tuple, Recommendation]:
    latest: dict[tuple, Recommendation] = {}
    for rec in stored(store):  # newest first
        latest.setdefault(rec.key, rec)
    return latest


def _differs(new: Recommendation, last: Recommendation, config: Config) -> bool:
    """Whether a new recommendation is a real change from the last one for its key."""
    if new.kind != "quota":
        return new.action != last.action
    was = last.action.get("guarantee_gpus") or 0.0
    step = max(config.quota.min_change_gpus, config.quota.min_change_fraction * was)
    return abs((new.action.get("guarantee_gpus") or 0.0) - was) >= step \
        or new.action.get("limit_gpus") != last.action.get("limit_gpus")


def refresh(store: Store, config: Config, now: datetime | None = None,
            evaluation: Evaluation | None = None) -> list[Recommendation]:
    """Re-evaluate at `now` and store what is new; returns the open recommendations (proposed, accepted)."""
    now = as_utc(now) if now else utc_now()
    evaluation = evaluation or evaluate(store, config, now)
    latest = _latest_by_key(store)
    cooldown = timedelta(hours=config.quota.cooldown_hours)
    new, superseded = [], []
    proposals = evaluation.proposals()
    for rec in proposals:
        last = latest.get(rec.key)
        if last is not None:
            if not _differs(rec, last, config) and last.status in OPEN + (APPLIED, REJECTED):
                continue  # the same advice stands (or was already decided)
            if last.created is not None and now - last.created < cooldown:
                continue  # too soon after the last one: a scheduler must not flap
            if last.status in OPEN:
                superseded.append(last.id)
        new.append(replace(rec, status=PROPOSED, created=now, id=""))  # a stored one's id includes its time
    live = {r.key for r in proposals}
    for key, last in latest.items():
        if last.status not in OPEN or key in live or last.id in superseded:
            continue
        if last.kind != "quota" or key in evaluation.holds():
            superseded.append(last.id)  # the condition is gone (job ended, demand now matches the guarantee)
    if superseded:
        store.set_recommendation_status(superseded, SUPERSEDED, by="gpuledger", at=now,
                                        note="superseded: newer evidence at " + now.isoformat())
    if new:
        store.add_recommendations(pd.DataFrame([r.to_row() for r in new]))
    store.set_meta(REFRESHED_AT, now.isoformat())
    return stored(store, statuses=OPEN)


def decide(store: Store, rec_id: str, decision: str, by: str, note: str | None = None,
           now: datetime | None = None, audit: Audit | None = None,
           shown: Callable[[], Iterable[Recommendation]] = list) -> Recommendation:
    """Record a decision on a stored recommendation: accept, reject, or applied (the scheduler now runs it).
    With `audit`, the decision and its audit entry commit in one transaction, so neither is stored without the
    other whatever fails afterwards. `shown`: what the last evaluation listed without storing (held back, not
    enough data), asked only for an id that is not stored, so a decision on one of those says why it cannot be
    taken rather than that the id is unknown."""
    if decision not in DECISIONS:
        raise InputError(f"decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
    if not by.strip():
        raise InputError("a decision needs who takes it: --by NAME (the audit log and the advice's history show it)")
    found = stored(store, ids=[rec_id])
    if not found:
        listed = next((r for r in shown() if r.id == rec_id), None)
        if listed is not None:
            raise DecisionError(f"recommendation {rec_id} is {listed.status}, shown and never stored, so it cannot "
                                f"be decided: {listed.reason}")
        raise UnknownRecommendation(f"no recommendation {rec_id!r}: `gpuledger recommend` (or GET "
                                    "/v1/recommendations) lists the ids that can be decided")
    rec, status = found[0], DECISIONS[decision]
    if status not in NEXT_STATUSES.get(rec.status, set()):
        raise DecisionError(f"recommendation {rec_id} is {rec.status}; it cannot become {status}")
    with audited_write(store, audit) as tx:
        store.set_recommendation_status([rec_id], status, by=by, at=as_utc(now) if now else utc_now(), note=note,
                                        cur=tx.cursor)
        tx.record(recommendation=rec_id, decision=decision, by=by, note=note, status=status)
    return stored(store, ids=[rec_id])[0]


class RecommendationService:
    """What the API serves: the open recommendations, re-evaluated at most every `refresh_minutes`, and previews."""

    def __init__(self, store: Store, config: Config) -> None:
        self.store = store
        self.config = config
        self._lock = threading.Lock()
        self._evaluation: Evaluation | None = None  # the last refresh's, for its insufficient-data notes

    def due(self, now: datetime) -> bool:
        last = self.store.meta(REFRESHED_AT)
        every = timedelta(minutes=self.config.quota.refresh_minutes)
        return last is None or now - datetime.fromisoformat(last) >= every

    def current(self) -> tuple[Evaluation, list[Recommendation]]:
        """The open recommendations and the insufficient-data notes as of the last refresh (made now if due).
        While another thread refreshes (the server's background refresh, every minute), the last refresh's
        advice is answered at once rather than after its seconds of work."""
        last = self._evaluation
        if last is not None and self._lock.locked():
            return last, stored(self.store, statuses=OPEN) + last.insufficient()
        with self._lock:
            now = utc_now()
            if self._evaluation is None or self.due(now):
                self._evaluation = evaluate(self.store, self.config, now)
                open_recs = refresh(self.store, self.config, now, self._evaluation)
            else:
                open_recs = stored(self.store, statuses=OPEN)
            return self._evaluation, open_recs + self._evaluation.insufficient()

    def listed(self) -> list[Recommendation]:
        """What the last refresh showed without storing (held back, not enough data); none before a refresh."""
        return self._evaluation.insufficient() if self._evaluation is not None else []

    def preview(self, at: datetime) -> tuple[Evaluation, list[Recommendation]]:
        """What the policy says at `at`, not stored (to look back, or at a window with no data)."""
        evaluation = evaluate(self.store, self.config, at)
        return evaluation, evaluation.proposals() + evaluation.insufficient()
