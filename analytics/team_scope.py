"""What one team may read about other teams in advice written for it: that they exist, not who they are.

A placement recommendation for a team can name other teams' jobs (a consolidation moves them, a latency-sensitive
job shares a GPU with them). Shown to that team (its weekly page, a team token's API calls, the dashboard over
that token) those names would leak other teams' work ("shares a GPU with vision/secret-training-run"), so each
job or user of another team, or of no team the advice records, becomes `ANOTHER_TEAMS_JOB` / `ANOTHER_TEAMS_USER`
in the action, the evidence and the reason; other teams a what-if's simulated effect names become `ANOTHER_TEAM`
(their per-team figures are left out). The advice records whose job is whose in `evidence["job_teams"]`
(policies/consolidation.py; users likewise in `user_teams`); a name it does not record as the team's own counts
as another team's, so advice stored before that field existed is redacted too.

Recommendations are plain dicts here (`Recommendation.to_dict()`), so the report (analytics) and the API (deploy,
through `policies.recommendation.for_team`) share this one rule.
"""
from __future__ import annotations

import copy
import re
from typing import Any

ANOTHER_TEAM = "another team"
ANOTHER_TEAMS_JOB = "another team's job"
ANOTHER_TEAMS_USER = "another team's user"
JOB_TEAMS = "job_teams"  # evidence: job id -> its team, for every job a recommendation names
USER_TEAMS = "user_teams"  # evidence: user -> its team, for every user a recommendation names
# fields that hold job ids (a list of them, or one) and users, wherever they sit in action or evidence
JOB_FIELDS = ("job_id", "shares_gpu_with", "waiting_job")
USER_FIELDS = ("user", "users")
TEAM_FIELDS = ("team",)  # fields that hold a team's name (a what-if's most harmed team)
SIMULATED = "simulated_effect"  # evidence: a what-if's figures, per other team under "others" (policies/whatif)


def _mentioned(value: Any, fields: tuple[str, ...]) -> set[str]:
    """Every string held under one of `fields`, at any depth."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key in fields:
                found |= {item} if isinstance(item, str) else {i for i in item if isinstance(i, str)} \
                    if isinstance(item, list) else set()
            found |= _mentioned(item, fields)
    elif isinstance(value, list):
        for item in value:
            found |= _mentioned(item, fields)
    return found


def _replace(value: Any, names: dict[str, str]) -> Any:
    """`value` with every string that is one of `names` replaced, and `job_teams` keeping only the team's own."""
    if isinstance(value, dict):
        return {k: _replace(v, names) for k, v in value.items() if not (isinstance(k, str) and k in names)}
    if isinstance(value, list):
        return [_replace(v, names) for v in value]
    if isinstance(value, str):
        return names.get(value, value)
    return value


def _in_text(text: str, names: dict[str, str]) -> str:
    """`text` with each name replaced where it stands as a word of its own (longest names first, so a name
    that holds a shorter one is replaced whole)."""
    for name in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", lambda _m, n=names[name]: n, text)
    return text


def redact_for_team(rec: dict[str, Any], team: str) -> dict[str, Any]:
    """A copy of recommendation `rec` as `team` may read it: other teams' job ids and users replaced by "another
    team's job" / "another team's user" in action, evidence and reason. A recommendation for another team
    altogether (which a caller should not show) has its team's name replaced too."""
    out = copy.deepcopy(rec)
    evidence = out.get("evidence") or {}
    owners = evidence.get(JOB_TEAMS) or {}
    user_owners = evidence.get(USER_TEAMS) or {}
    own_job = out.get("job_id") if out.get("team") == team else None
    jobs = _mentioned(out.get("action") or {}, JOB_FIELDS) | _mentioned(evidence, JOB_FIELDS) | set(owners)
    users = _mentioned(out.get("action") or {}, USER_FIELDS) | _mentioned(evidence, USER_FIELDS) | set(user_owners)
    foreign = {j: ANOTHER_TEAMS_JOB for j in jobs if j != own_job and owners.get(j) != team}
    foreign |= {u: ANOTHER_TEAMS_USER for u in users if user_owners.get(u) != team}
    # other teams named by a simulated effect: that another team would wait longer is shown, not which one
    named = _mentioned(evidence, TEAM_FIELDS) | set(((evidence.get(SIMULATED) or {}).get("others")) or {})
    foreign |= {t: ANOTHER_TEAM for t in named if t != team}
    if out.get("team") != team and out.get("team"):
        foreign[out["team"]] = ANOTHER_TEAM
        if out.get("job_id"):
            foreign[out["job_id"]] = ANOTHER_TEAMS_JOB
    if not foreign:
        return out
    out["action"] = _replace(out.get("action") or {}, foreign)
    out["evidence"] = _replace(evidence, foreign)
    out["reason"] = _in_text(str(out.get("reason") or ""), foreign)
    for key in ("team", "job_id"):
        if isinstance(out.get(key), str):
            out[key] = foreign.get(out[key], out[key])
    return out
