"""A recommendation: what to change, for whom, why (the evidence), and what became of it.

Kinds: `quota` (a team's guarantee and limit for one GPU model), `reclaim` (GPUs a job holds idle),
`resize` (a running job whose memory fits a MIG slice or a smaller card), `consolidate` (jobs to move so a waiting
gang job fits), `colocate` (a job spread over nodes whose measured cross-node traffic one NVLink island would
carry), `separate` (a latency-sensitive job sharing a GPU with other work), `efficiency` (a running job bound by its
input pipeline, communication or memory bandwidth, or leaving its tensor cores idle). Status: `proposed` when
made, then `accepted`, `rejected` or `applied` by a decision, or `superseded` by a newer one for the
same team, model and job; `insufficient_data` is never stored (it carries no number, only the reason: quota advice
without enough data, colocate advice whose traffic was not read);
`held_back` is quota advice whose simulated effect harms other teams beyond the configured bound (not stored
either: it carries its numbers and the reason); `preview` is an evaluation at a chosen instant, not stored.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

from gpuledger.analytics.records import json_safe
from gpuledger.analytics.store import Store
from gpuledger.analytics.team_scope import redact_for_team

# Each closed set once: the API's models, its query parameters, the CLI's choices and the docs derive from these.
# A new kind of advice is one entry in KINDS (and the code that makes it).
KINDS = ("quota", "reclaim", "resize", "consolidate", "colocate", "separate", "efficiency")
PROPOSED, ACCEPTED, REJECTED, APPLIED, SUPERSEDED = "proposed", "accepted", "rejected", "applied", "superseded"
INSUFFICIENT_DATA, PREVIEW = "insufficient_data", "preview"
# quota advice whose simulated effect (policies/whatif) harms other teams beyond [whatif]'s bound: shown with the
# reason and its numbers, never stored or exported
HELD_BACK = "held_back"
STORED_STATUSES = (PROPOSED, ACCEPTED, REJECTED, APPLIED, SUPERSEDED)  # what the table holds
STATUSES = STORED_STATUSES + (INSUFFICIENT_DATA, HELD_BACK, PREVIEW)  # what an answer may say
OPEN = (PROPOSED, ACCEPTED)  # what a scheduler should consider now
DECISIONS = {"accept": ACCEPTED, "reject": REJECTED, "applied": APPLIED}


@dataclass
class Recommendation:
    kind: str
    team: str
    action: dict[str, Any]
    evidence: dict[str, Any]
    reason: str
    gpu_model: str | None = None
    job_id: str | None = None
    status: str = PREVIEW
    created: datetime | None = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    note: str | None = None
    id: str = field(default="")

    def __post_init__(self) -> None:
        if not self.id:
            key = [self.kind, self.team, self.gpu_model, self.job_id, self.action,
                   self.created.isoformat() if self.created else None]
            self.id = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]

    @property
    def key(self) -> tuple[str, str, str | None, str | None]:
        """What a newer recommendation replaces: the same kind, team, GPU model and job."""
        return self.kind, self.team, self.gpu_model, self.job_id

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))

    def to_row(self) -> dict[str, Any]:
        """The row stored in the `recommendations` table."""
        row = asdict(self)
        row["action"] = json.dumps(json_safe(self.action))
        row["evidence"] = json.dumps(json_safe(self.evidence))
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Recommendation":
        values = {k: (None if _missing(v) else v) for k, v in row.items()}
        values["action"] = json.loads(values["action"])
        values["evidence"] = json.loads(values["evidence"])
        for column in ("created", "decided_at"):
            if values.get(column) is not None:
                values[column] = values[column].to_pydatetime() if hasattr(values[column], "to_pydatetime") \
                    else values[column]
        return cls(**values)


def known_evidence(evidence: dict[str, Any]) -> dict[str, Any]:
    """The evidence without the figures that are missing (a reading the GPU does not report, a projection without
    a rate): no advice shows or rests on a missing value."""
    return {k: v for k, v in evidence.items() if v is not None}


def for_team(rec: Recommendation, team: str) -> Recommendation:
    """`rec` as `team` may read it: other teams' jobs and users named "another team's job" / "another team's
    user" in its action, evidence and reason (analytics/team_scope.py). Same id, status and decision."""
    shown = redact_for_team(rec.to_dict(), team)
    return replace(rec, team=shown["team"], job_id=shown["job_id"], action=shown["action"],
                   evidence=shown["evidence"], reason=shown["reason"])


def stored(store: Store, statuses: tuple[str, ...] | None = None, team: str | None = None,
           ids: list[str] | None = None, limit: int | None = None) -> list[Recommendation]:
    """Stored recommendations, newest first, optionally narrowed by status, team or id."""
    frame = store.recommendations(statuses=statuses, team=team, ids=ids, limit=limit)
    return [Recommendation.from_row(row) for row in frame.to_dict(orient="records")]


def _missing(value: Any) -> bool:
    try:
        return value is None or value != value  # NaN / NaT
    except (TypeError, ValueError):
        return False
