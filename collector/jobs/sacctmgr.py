"""Slurm's association limits from `sacctmgr show assoc`: what Slurm runs as each account's GPU limit and share,
so a what-if replays a Slurm site under the limits in force rather than the config's (policies/whatif/reported.py).

Read: `sacctmgr -nP show assoc format=Account,User,ParentName,Fairshare,GrpTRES` (the order the Slurm emitter's
`current` takes, policies/emitters/slurm.py), or any field order under sacctmgr's own header (`Account|User|Par
Name|Share|GrpTRES`, printed without -n). Facts from sacctmgr's documentation: an association with no user is the
account's own; `Fairshare` is an integer of raw shares or `parent` (the account shares its parent's); `GrpTRES` is a
comma list of `type=count`, a GPU one `gres/gpu=N` (any GPU type) or `gres/gpu:<type>=N` (the type gres.conf names),
a hard cap on the GPUs the account's running jobs hold at once; no GrpTRES is no limit, never zero.

Each account association gives rows of the `queue_metrics` table (collector/jobs/queues.py) under scheduler
`slurm`: queue = the account, cohort = its parent, `limit_gpus` per GPU type (flavor = the type, none for
`gres/gpu`), `fairshare_shares` (detail `parent` where it shares its parent's). User associations are skipped
(`user_association`): limits per user are not quotas of a team.
"""
from __future__ import annotations

import re
from collections import Counter
from datetime import datetime
from typing import Iterator

from gpuledger.collector.jobs.queues import QueueBatch, queue_frame

SOURCE = "slurm"
FIELDS = ("Account", "User", "ParentName", "Fairshare", "GrpTRES")
# sacctmgr's header names for the format fields (it prints "Par Name" and "Share"), to gpuledger's field names
HEADER_NAMES = {"account": "Account", "user": "User", "par name": "ParentName", "parentname": "ParentName",
                "share": "Fairshare", "fairshare": "Fairshare", "grptres": "GrpTRES"}
GPU_TRES = re.compile(r"^gres/gpu(?::(?P<type>[^=,:]+))?$")


def _rows(text: str) -> Iterator[tuple[int, str, dict[str, str] | None]]:
    """(line number, line, its fields by name) of every non-blank line that is not a header; None where the line
    has fewer fields than the format (no row). A header line sets the field order of the lines below it."""
    fields: list[str] = list(FIELDS)
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split("|")]
        named = [HEADER_NAMES.get(c.lower()) for c in cells]
        if "Account" in named and "GrpTRES" in named:  # sacctmgr's header: the fields in its order
            fields = [n or f"other{i}" for i, n in enumerate(named)]
            continue
        yield number, line, dict(zip(fields, cells)) if len(cells) >= len(fields) else None


def parse_sacctmgr(text: str, at: datetime) -> QueueBatch:
    """The account associations of `sacctmgr -P show assoc` output (with or without its header), at `at`."""
    skipped: Counter = Counter()
    records: list[dict] = []
    for _, _, row in _rows(text):
        if row is None or not row.get("Account"):
            skipped["not_a_row"] += 1
            continue
        if row.get("User"):
            skipped["user_association"] += 1
            continue
        records.extend(_account_rows(row, skipped))
    return QueueBatch(queue_frame(records, at, SOURCE, skipped), skipped)


def _account_rows(row: dict[str, str], skipped: Counter) -> list[dict]:
    """One account's figures: its share and a GPU limit per type its GrpTRES names."""
    base = {"scheduler": SOURCE, "queue": row["Account"], "cohort": row.get("ParentName") or None, "flavor": None}
    out = []
    share = row.get("Fairshare", "")
    if share.lower() == "parent":
        out.append({**base, "figure": "fairshare_shares", "detail": "parent", "value": None})
    elif share:
        try:
            out.append({**base, "figure": "fairshare_shares", "detail": None, "value": float(share)})
        except ValueError:
            skipped["bad_value"] += 1
    for item in filter(None, row.get("GrpTRES", "").split(",")):
        name, _, count = item.partition("=")
        match = GPU_TRES.match(name.strip())
        if not match:
            continue  # cpu, mem, a license: not a GPU limit
        try:
            value = float(count)
        except ValueError:
            skipped["bad_value"] += 1
            continue
        out.append({**base, "flavor": match.group("type"), "figure": "limit_gpus", "detail": None, "value": value})
    return out


def associations(text: str) -> dict[str, dict]:
    """Account associations as the Slurm emitter compares them: account -> parent, fairshare (as written) and the
    whole GrpTRES (every TRES, as written). Lines that are no row are skipped; a row short of fields raises."""
    accounts: dict[str, dict] = {}
    for number, line, row in _rows(text):
        if row is None:
            raise ValueError(f"line {number}: expected {','.join(FIELDS)} separated by '|', got {line!r}")
        if row.get("User"):
            continue
        tres = dict(item.split("=", 1) for item in row.get("GrpTRES", "").split(",") if "=" in item)
        accounts[row["Account"]] = {"parent": row.get("ParentName") or None, "fairshare": row.get("Fairshare", ""),
                                    "grp_tres": tres}
    return accounts


__all__ = ["parse_sacctmgr", "associations", "FIELDS", "SOURCE"]
