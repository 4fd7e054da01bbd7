"""Slurm: a `sacctmgr -i` script (and the same as JSON records) for accounts, shares and GPU limits.

An account per department and per team (`parent=` its department): `fairshare=` the team's share (an integer,
at least 1) and `GrpTRES=gres/gpu:<type>=N` its limit per GPU type, a hard cap on the GPUs its jobs hold at
once, written for every type the team has an entry for (a limit of all the type's GPUs caps nothing, but
written it replaces a lower GrpTRES in force: a plan must never leave a team capped below what it gives). Slurm has
no guarantee: fairshare and priority decide who gets idle GPUs first. GPU types are named as the site names
them (`gres.conf Type=`): the type sacct's AllocTRES recorded for the model's jobs (`gres/gpu:a100=4`), else
`[slurm_gres]`, else the model in lower case (`h100`, `a100-80gb`); models of one type share its limit.
AccountingStorageTRES must list each `gres/gpu:<type>`. Setting one TRES leaves a limit's other TRES (cpu, mem)
as they are.

With `current`, the output of `sacctmgr -nP show assoc format=Account,User,ParentName,Fairshare,GrpTRES`,
only accounts that are missing or whose share or GPU limits differ are in the script.

Names come from telemetry and the config, which an attacker may write: every value put into the script (account,
parent, each `key=value` argument, the whole GrpTRES list) is one `shlex.quote`d word, so a name such as
`h100$(touch pwned)` reaches sacctmgr as literal text and the shell runs nothing of it.
"""
from __future__ import annotations

import shlex
from typing import Any

from gpuledger.collector.errors import InputError
from gpuledger.collector.jobs.sacctmgr import associations
from gpuledger.policies.emitters.base import Emitted, comment, plan_header
from gpuledger.policies.quota_plan import QuotaPlan, TeamPlan, gres_type

CURRENT_FORMAT = "Account,User,ParentName,Fairshare,GrpTRES"


def gres_of(plan: QuotaPlan, model: str) -> str:
    """The GPU type Slurm names the model's GPUs by: the plan's (quota_plan.py `applicable_plan`), else the model's."""
    return plan.gres[model][0] if model in plan.gres else gres_type(model)


def fairshare(share: float) -> int:
    return max(1, round(share))


def parse_current(text: str) -> dict[str, dict[str, Any]]:
    """Account associations (rows with no user) from `sacctmgr -nP show assoc format=<CURRENT_FORMAT>`, or any
    order under sacctmgr's header (collector/jobs/sacctmgr.py reads both)."""
    try:
        return associations(text)
    except ValueError as exc:
        raise InputError(f"current associations, {exc}") from exc


# sacctmgr splits a value on "," (a list of names) and reads "=" as the next key: a name holding one would act on
# other accounts or TRES even as one quoted shell word, so such a name is refused rather than written.
SACCTMGR_SYNTAX = (",", "=")


def _sacctmgr_name(name: str, what: str) -> str:
    """`name`, if sacctmgr reads it as one name; else an InputError (the name is shown escaped)."""
    if not name or any(c in name for c in SACCTMGR_SYNTAX):
        raise InputError(f"the Slurm plan cannot name {what} {ascii(name)[:80]}: sacctmgr would read "
                         f"{' or '.join(SACCTMGR_SYNTAX)} in it as syntax")
    return name


def _records(plan: QuotaPlan) -> list[dict[str, Any]]:
    for team in plan.teams:
        _sacctmgr_name(team.team, "the account")
        if team.parent:
            _sacctmgr_name(team.parent, "the department")
        for model in team.models():
            _sacctmgr_name(gres_of(plan, model), "the GPU type")
    records = []
    for department, teams in sorted(plan.departments().items()):
        records.append({"account": department, "parent": None, "fairshare": fairshare(sum(t.share for t in teams)),
                        "grp_tres": {}})
    for team in plan.teams:
        records.append({"account": team.team, "parent": team.parent, "fairshare": fairshare(team.share),
                        "grp_tres": _gpu_limits(team, plan)})
    return records


def _gpu_limits(team: TeamPlan, plan: QuotaPlan) -> dict[str, int]:
    """The team's GrpTRES per GPU type: its limits of the type's models summed."""
    limits: dict[str, float] = {}
    for model in team.models():
        kind = f"gres/gpu:{gres_of(plan, model)}"
        limits[kind] = limits.get(kind, 0.0) + plan.limit_of(team, model)
    return {kind: int(limit) for kind, limit in limits.items()}


def _header(plan: QuotaPlan, records: list[dict[str, Any]]) -> list[str]:
    """The Slurm plan's own header lines: which GPU types, and where GrpTRES is set and where not."""
    capped = [f"{r['account']} {','.join(f'{k}={v}' for k, v in sorted(r['grp_tres'].items()))}"
              for r in records if r["grp_tres"]]
    lines = ["fairshare = the team's share. GrpTRES = a team's GPU limit per GPU type (a limit of all the type's GPUs",
             "caps nothing; it is written so that a lower GrpTRES in force is replaced)."]
    lines.append("GrpTRES set: " + "; ".join(capped) if capped else "GrpTRES set: none (no team has a GPU entry).")
    models = sorted(set(plan.capacity) | {m for t in plan.teams for m in t.models()})
    lines.append("GPU types (gres.conf Type=; AccountingStorageTRES must list each gres/gpu:<type>):")
    for model in models:
        basis = plan.gres[model][1] if model in plan.gres else "the model's name: the plan names no type"
        lines.append(f"  - {model}: {gres_of(plan, model)} ({basis})")
    return lines


def _arg(key: str, value: object) -> str:
    """One `key=value` argument of sacctmgr as a single shell word, whatever the value holds."""
    return shlex.quote(f"{key}={value}")


def _line(record: dict[str, Any]) -> list[str]:
    """The sacctmgr commands for one record; every interpolated value is quoted (names are data, never code)."""
    lines = []
    if record["action"] == "add":
        parent = f" {_arg('parent', record['parent'])}" if record["parent"] else ""
        lines.append(f"sacctmgr -i add account {_arg('name', record['account'])}{parent} "
                     f"{_arg('fairshare', record['fairshare'])}")
    settings = [_arg("fairshare", record["fairshare"])] if record["action"] == "modify" else []
    if record["grp_tres"]:
        settings.append(_arg("GrpTRES", ",".join(f"{k}={v}" for k, v in sorted(record["grp_tres"].items()))))
    if settings:
        lines.append(f"sacctmgr -i modify account {_arg('name', record['account'])} set {' '.join(settings)}")
    return lines


class SlurmEmitter:
    target = "slurm"

    def emit(self, plan: QuotaPlan, current: str | None = None) -> Emitted:
        existing = parse_current(current) if current is not None else None
        out = []
        records = _records(plan)
        for record in records:
            if existing is None:
                out.append({**record, "action": "add"})
                continue
            now = existing.get(record["account"])
            if now is None:
                out.append({**record, "action": "add"})
                continue
            changed = {k: v for k, v in record["grp_tres"].items() if now["grp_tres"].get(k) != str(v)}
            if changed or now["fairshare"] != str(record["fairshare"]):
                out.append({**record, "grp_tres": changed, "action": "modify"})
        notes = _header(plan, records)
        if existing is None:
            notes.append("'add' creates an account that is missing; for one that exists sacctmgr adds nothing.")
        header = comment(plan_header(plan, self.target, notes))
        lines = []
        for record in out:
            lines += _line(record)
        text = "#!/bin/sh\n" + header + "".join(line + "\n" for line in lines)
        return Emitted(out, text, "text/x-shellscript", header)

