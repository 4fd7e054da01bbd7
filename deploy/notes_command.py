"""`gpuledger notes`: a note per job owner (and team) for the jobs that wasted GPUs, with what to change, printed,
written as files (`--out`) or mailed to each owner (`--send`, opt-in through `[report.email] owner_address`).

Why a command of its own: the notes are for the users, not the admins or the team leads the weekly report serves,
and a site chooses when to send them (a cron after the week, or never). With a server holding the file the notes
come from GET /v1/users/notes, so a team token gets its own team's notes and nothing else; offline they come from
the file, through the API's own model, so both paths print the same.
"""
from __future__ import annotations

import argparse
import html
import logging
import re
import sys
from datetime import datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Callable

from gpuledger.analytics.config import Config, EmailConfig
from gpuledger.analytics.owner_notes import note_text, owner_notes
from gpuledger.analytics.records import json_safe, rounded
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import InputError
from gpuledger.collector.identifiers import is_identifier
from gpuledger.deploy.cli_options import add_admin_access, instant, positive

log = logging.getLogger(__name__)
ADDRESS = re.compile(r"[^@\s]+@[^@\s]+")


def add_parser(sub: Any) -> None:
    notes = sub.add_parser("notes", help="a note per job owner for the jobs that wasted GPUs (jobstats-style)",
                           description="Each owner's jobs that wasted GPUs in the window (idle, oversized, starved), "
                                       "with the evidence, the dollars where known and what to change; one note per "
                                       "owner and team, never naming another team's job.")
    add_admin_access(notes, "a reader, admin or team")
    notes.add_argument("--days", type=positive, default=7.0, help="the window's length in days (default 7)")
    notes.add_argument("--end", type=instant, metavar="ISO-8601", help="the window's end (default: now)")
    notes.add_argument("--team", help="only this team's owners (a team token: its own)")
    notes.add_argument("--user", help="only this owner's note")
    notes.add_argument("--out", type=Path, metavar="DIR", help="write each note to DIR/<team>/<user>.md and .html")
    notes.add_argument("--send", action="store_true",
                       help="mail each note to its owner at [report.email] owner_address (\"{user}@example.org\"); "
                            "without that key nothing is sent")


def _answer(args: argparse.Namespace, config: Config, open_existing: Callable, server: Callable) -> dict:
    """The notes as GET /v1/users/notes answers them, from the server or from the file."""
    end = args.end or utc_now()
    if args.server:
        params = {"days": args.days, "end": end.isoformat(), **({"team": args.team} if args.team else {}),
                  **({"user": args.user} if args.user else {})}
        return server(args).call("GET", "/v1/users/notes", params=params, timeout=600)
    from gpuledger.deploy.api.users import OwnerNotes
    start = end - timedelta(days=args.days)
    with open_existing(args, config) as store:
        found = owner_notes(store, start, end, config, args.team, args.user)
    return rounded(OwnerNotes.model_validate(json_safe({"start": start, "end": end, **found}))
                   .model_dump(mode="json"))


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _write(out: Path, note: dict, text: str) -> Path:
    """DIR/<team>/<user>.md and .html; team and user are names from telemetry, so only valid identifiers become
    path parts (no `..`, no `/`)."""
    if not (is_identifier("team", note["team"]) and is_identifier("user", note["user"])) or \
            note["user"] in (".", "..") or note["team"] in (".", ".."):
        raise InputError(f"cannot write a note for {ascii(note['user'])} of {ascii(note['team'])}: not a file name")
    folder = out / note["team"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{note['user']}.md"
    path.write_text(text, encoding="utf-8")
    (folder / f"{note['user']}.html").write_text(
        f"<!doctype html><meta charset='utf-8'><pre>{html.escape(text)}</pre>\n", encoding="utf-8")
    return path


def _messages(email: EmailConfig, answer: dict) -> list[EmailMessage]:
    """One message per note to its owner's address; an owner whose address cannot be made is logged, not mailed."""
    out = []
    start, end = _when(answer["start"]), _when(answer["end"])
    for note in answer["notes"]:
        address = email.owner_address.replace("{user}", note["user"])  # type: ignore[union-attr]
        if not ADDRESS.fullmatch(address) or not is_identifier("user", note["user"]):
            log.warning("no note mailed to %s of %s: %s is not an address", ascii(note["user"]), note["team"],
                        ascii(address))
            continue
        msg = EmailMessage()
        msg["From"], msg["To"] = email.sender, address
        msg["Subject"] = f"Your GPU jobs in {note['team']}: ${note['wasted_usd']:,.2f} wasted"
        msg.set_content(note_text(note, start, end))
        out.append(msg)
    return out


def cmd_notes(args: argparse.Namespace, config: Config, open_existing: Callable, server: Callable) -> int:
    answer = _answer(args, config, open_existing, server)
    start, end = _when(answer["start"]), _when(answer["end"])
    for note in answer["notes"]:
        text = note_text(note, start, end)
        if args.out:
            print(f"{note['team']}/{note['user']}: {len(note['jobs'])} job(s), ${note['wasted_usd']:,.2f} wasted -> "
                  f"{_write(args.out, note, text)}")
        else:
            print(text)
    print(f"{len(answer['notes'])} note(s); {answer['jobs_without_owner']} wasteful job(s) name no owner",
          file=sys.stderr)
    if args.send:
        if config.email is None or config.email.owner_address is None:
            raise InputError("--send needs [report.email] with owner_address (like \"{user}@example.org\") in "
                             "--config: notes go to owners only where the site says how to reach them")
        from gpuledger.deploy.mail import send_mail
        sent = send_mail(config.email, _messages(config.email, answer))
        print(f"mailed {sent} note(s)", file=sys.stderr)
    return 0
