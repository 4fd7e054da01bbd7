"""Slurm's `sacct --parsable2` (`-P`) output: one row per job allocation, step rows skipped. sacct's default
fixed-width table is read too where its cells are whole (`as_parsable`); a column it cut is refused by name.

Read by field name, never by position: the header line names the fields (`sacct -P -o ...`), or, for a dump taken
with `--noheader`, the caller names them in the order given to `-o` (`fields`). Only the fields a job needs are
read, and any of them may be missing: JobID (required), State, Submit, Eligible, Start, End, Account, User,
Partition, QOS, NodeList, AllocTRES (ReqTRES for a job that never started: pending, or cancelled while waiting), Restarts, Reason, ExitCode, JobName.

Facts from Slurm's documentation and source this relies on:
- A step's JobID is the job's with `.batch`, `.extern`, `.interactive` or `.<n>` after it; array tasks are
  `123_4`, heterogeneous components `123+0`: those are jobs of their own.
- State may carry words after it (`CANCELLED by 2101477`); the first word is the state.
- Times are printed in the local time of the host sacct ran on, without a zone (`2024-11-13T11:08:00`), and
  `Unknown` or `None` where there is none (a pending job's Start).
- AllocTRES holds the generic count (`gres/gpu=2`) and, on sites that type their GPUs, typed counts beside it
  (`gres/gpu:a100=2`, a MIG slice `gres/gpu:a100_3g.20gb=1`): the generic count is the job's GPUs, counted once;
  only without it are the typed counts summed. The GPU model comes from the type when there is exactly one; the
  types as written are kept too (`gres_type`), since a Slurm plan must name the GPUs as the site's gres.conf does.
- Slurm's account is the team, as sshare and sreport group usage by it.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from datetime import datetime, timezone, tzinfo
from typing import Iterable, Iterator, Sequence

from gpuledger.collector.errors import InputError
from gpuledger.collector.gpu_catalog import UNKNOWN_MODEL, models_with_profile, normalize_model
from gpuledger.collector.jobs.lifecycle import STATES, JobBatch, events_of, jobs_frame

SOURCE = "slurm"
JOB_PREFIX = "slurm:"  # the job ids NVML attribution gives Slurm jobs (collector/proc_attribution.py)
# sacct's state words -> gpuledger's (collector/jobs/lifecycle.py STATES)
STATE_WORDS = {
    "PENDING": "pending", "RUNNING": "running", "COMPLETED": "completed", "FAILED": "failed",
    "CANCELLED": "cancelled", "TIMEOUT": "timeout", "OUT_OF_MEMORY": "out_of_memory", "NODE_FAIL": "node_fail",
    "PREEMPTED": "preempted", "BOOT_FAIL": "boot_fail", "DEADLINE": "deadline", "REQUEUED": "requeued",
    "REQUEUE_FED": "requeued", "REQUEUE_HOLD": "pending", "SUSPENDED": "suspended", "RESIZING": "running",
    "COMPLETING": "running", "CONFIGURING": "running", "STAGE_OUT": "running", "SIGNALING": "running",
}
NO_TIME = {"", "Unknown", "None", "N/A"}
# a step: the job's id, a dot, and the step's name or number (cut by a fixed-width table: ends with '+')
_STEP = re.compile(r"^[^.]+\.(batch|extern|interactive|\d+|[^.]*\+)$", re.IGNORECASE)
_DASHES = re.compile(r"^\s*-+(\s+-+)*\s*$")  # the line under a fixed-width table's header
CUT = "+"  # sacct's mark on a cell cut to its column's width
_GPU_TRES = re.compile(r"^gres/gpu(?::(?P<type>[^=]+))?$", re.IGNORECASE)
_MIG_TYPE = re.compile(r"^(?P<card>[a-z0-9]+?)[_-](?P<profile>\d+g\.\d+gb)$", re.IGNORECASE)


def time_of(text: str | None, zone: tzinfo) -> datetime | None:
    """A Slurm time printed without a zone, read in `zone`, as UTC; None for Unknown, None, N/A or junk."""
    if text is None or text.strip() in NO_TIME:
        return None
    try:
        return datetime.fromisoformat(text.strip()).replace(tzinfo=zone).astimezone(timezone.utc)
    except ValueError:
        return None


def gpus_of(tres: str | None) -> tuple[int | None, str | None]:
    """(GPUs, model) from a TRES list; (None, None) where it names no GPU. A MIG type (`a100_3g.20gb`) gives the
    card's model; a type the catalogue does not know is kept as written."""
    if not tres:
        return None, None
    generic, typed = None, {}
    for item in tres.split(","):
        name, _, value = item.strip().partition("=")
        match = _GPU_TRES.match(name.strip())
        if not match:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if not math.isfinite(number):  # `inf` was a traceback; a count out of range is the record check's (bad_gpus)
            continue
        count = int(number)
        if match.group("type"):
            typed[match.group("type")] = typed.get(match.group("type"), 0) + count
        else:
            generic = count
    if generic is None and not typed:
        return None, None
    gpus = generic if generic is not None else sum(typed.values())
    return gpus, (model_of_type(next(iter(typed))) if len(typed) == 1 else None)


_TYPE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")  # a gres.conf Type= as a plan may write it back


def gpu_types_of(tres: str | None) -> str | None:
    """The GPU types a TRES list names (`gres/gpu:a100=2` -> `a100`), as written, sorted and comma-joined; None
    where it names none. A type with characters a gres.conf Type= never has is left out: it is written back into
    sacctmgr commands (policies/emitters/slurm.py)."""
    types = set()
    for item in (tres or "").split(","):
        match = _GPU_TRES.match(item.strip().partition("=")[0].strip())
        if match and match.group("type") and _TYPE_NAME.match(match.group("type")):
            types.add(match.group("type"))
    return ",".join(sorted(types)) or None


def model_of_type(gres_type: str) -> str:
    """The GPU model a Slurm GPU type names: the catalogue's, the card of a MIG type, else the type as written."""
    mig = _MIG_TYPE.match(gres_type)
    if mig:  # a MIG slice: the card whose name starts the type and that has the profile
        card = normalize_model(mig.group("card"))
        if card in models_with_profile(mig.group("profile").lower()) or card != mig.group("card"):
            return card
    model = normalize_model(gres_type)
    if model == UNKNOWN_MODEL or (re.search(r"\d+GB$", model) and not re.search(r"\d+g", gres_type, re.I)):
        return gres_type  # unknown, or a card sold in several memory sizes (a100): not guessed
    return model


# a pasted `sacct ... -o A,B,C` (or --format / --fields) names a headerless dump's fields; `%20` widths dropped
_COMMAND_FIELDS = re.compile(r"\bsacct\b.*?(?:\s-o\s*|--format[=\s]\s*|--fields[=\s]\s*)([A-Za-z][\w%,.]*)")


def _lines(text: str) -> Iterable[tuple[str, bool]]:
    """(line, is_comment) for every non-blank line, a fixed-width table's rows as `-P` rows."""
    for line in as_parsable(text.splitlines()):
        if line.strip():
            yield line.rstrip("\r\n"), line.lstrip().startswith("#")


def _fixed_header(header: str, dashes: str) -> tuple[list[str], list[tuple[int, int]]] | None:
    """A fixed-width table's field names and column spans, from its header and the dashes under it; None when the
    header names no JobID first (not a sacct table)."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", dashes)]
    names = [header[a:b].strip() for a, b in spans]
    return (names, spans) if names and names[0].lower() in ("jobid", "jobidraw") else None


def _read_cut(name: str, cell: str) -> str:
    """A cell sacct cut to its column's width, read where it still says what it said: a step's id (still a step),
    a state by the one state word it begins, a job name (a label); any other cut cell refuses the table."""
    kept = cell[:-len(CUT)]
    if name.lower() in ("jobid", "jobidraw") and "." in kept:
        return cell
    if name.lower() == "state":
        words = [w for w in STATE_WORDS if w.startswith(kept.upper())]
        if len(words) == 1:
            return words[0]
    if name.lower() == "jobname":
        return cell
    raise InputError(f"sacct's fixed-width table cuts its {name} column ({cell!r}): the value cannot be read. "
                     f"Run sacct with -P (--parsable2), or widen the column: --format {name}%60")


def as_parsable(lines: Iterable[str]) -> Iterator[str]:
    """sacct's output lines as `-P` lines: '|' rows pass unchanged; a fixed-width table (sacct without -P: a
    header, a line of dashes, rows cut to each column's width with '+') becomes a '|' header and rows, each cut cell
    read where it can be (`_read_cut`) and refused, naming its column, where it cannot."""
    names: list[str] | None = None
    spans: list[tuple[int, int]] = []
    held: str | None = None  # a line that may be a fixed-width header, until the next line says
    for raw in lines:
        line = raw.rstrip("\r\n")
        if names is not None and "|" not in line and line.strip() and not line.lstrip().startswith(("#", "$")):
            cells = []
            for k, ((a, b), name) in enumerate(zip(spans, names)):
                raw_cell = line[a:] if k == len(spans) - 1 else line[a:b]
                cell = raw_cell.strip()
                cut = cell.endswith(CUT) and len(raw_cell.rstrip()) >= b - a and not raw_cell.startswith(" ")
                cells.append(_read_cut(name, cell) if cut else cell)
            yield "|".join(cells)
            continue
        if held is not None:
            table = _fixed_header(held, line) if _DASHES.match(line) else None
            if table is not None:
                names, spans = table
                held = None
                yield "|".join(names)
                continue
            yield held
        held = line if "|" not in line and line.strip() and names is None else None
        if held is None:
            yield line
    if held is not None:
        yield held


def fields_in_command(line: str) -> list[str] | None:
    """The field list of a `sacct` command line pasted with its output, if the line holds one."""
    match = _COMMAND_FIELDS.search(line)
    return [re.sub(r"%\d+$", "", f) for f in match.group(1).split(",") if f] if match else None


CHUNK_LINES = 20_000  # rows parsed and stored at once by a streamed import: ~90 MB, whatever the file's size


def sacct_chunks(lines: Iterable[str], fields: Sequence[str] | None = None, zone: tzinfo = timezone.utc,
                 team_field: str = "Account", chunk_lines: int = CHUNK_LINES) -> Iterator[JobBatch]:
    """`parse_sacct` over `lines` (a file, standard input) a chunk at a time, so an import of a year of a big
    site's history (a million rows took 4.3 GB read whole) holds one chunk: the header or the pasted command line
    names the fields of every chunk after it."""
    names: list[str] | None = [f.strip() for f in fields] if fields else None
    chunk: list[str] = []
    for raw in as_parsable(lines):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        if line.lstrip().startswith("#") or "|" not in line:
            named = fields_in_command(line)
            if named and not fields:
                names = named
                continue
        elif line.split("|", 1)[0].strip().lower() in ("jobid", "jobidraw"):
            names = [v.strip() for v in line.split("|")]
            continue
        chunk.append(line)
        if len(chunk) >= chunk_lines:
            yield parse_sacct("\n".join(chunk), names, zone, team_field)
            chunk = []
    if chunk or names is None:
        yield parse_sacct("\n".join(chunk), names, zone, team_field)


def parse_sacct(text: str, fields: Sequence[str] | None = None, zone: tzinfo = timezone.utc,
                team_field: str = "Account") -> JobBatch:
    """Jobs and their events from `sacct -P` output. `fields`: the `-o` field list of a dump without a header
    (a header line, or a pasted `sacct ... -o FIELDS` command line, names them otherwise). `zone`: the time zone sacct printed its times in. `team_field`: which
    field names the team (Account by default; Partition or QOS on sites that charge by them).

    Lines that are not rows (a pasted shell prompt, prose) are skipped and counted as `not_a_row`; rows with the
    wrong number of fields as `malformed`; step rows as `step`; jobs with no GPU as `no_gpus`."""
    skipped: Counter = Counter()
    unknown: Counter = Counter()
    names: list[str] | None = [f.strip() for f in fields] if fields else None
    records = []
    for line, comment in _lines(text):
        if comment or "|" not in line:
            named = fields_in_command(line)
            if named and not fields:
                names = named
            elif not comment:
                skipped["not_a_row"] += 1
            continue
        values = line.split("|")
        if values[0].strip().lower() in ("jobid", "jobidraw"):  # the header
            names = [v.strip() for v in values]
            continue
        if names is None:
            raise InputError("the sacct output has no header line: give its fields in the order of sacct's -o "
                             "(e.g. --fields JobID,State,Submit,Start,End,Account,User,AllocTRES)")
        if len(values) == len(names) + 1 and values[-1] == "":  # --parsable (not 2) ends each row with '|'
            values = values[:-1]
        if len(values) != len(names):
            skipped["malformed"] += 1
            continue
        row = {name.lower(): value for name, value in zip(names, values)}
        if "jobid" not in row:
            raise InputError(f"the sacct fields {', '.join(names)} have no JobID")
        job = row["jobid"].strip()
        if not job or _STEP.match(job):
            skipped["step"] += 1
            continue
        word = (row.get("state") or "").strip().split(" ")[0].upper()
        state = STATE_WORDS.get(word)
        if state is None:
            state = word.lower() or None
            if state:
                unknown[word] += 1
        gpus, model = gpus_of(row.get("alloctres"))
        types = gpu_types_of(row.get("alloctres"))
        if gpus is None and time_of(row.get("start"), zone) is None:  # never started: what it asked for waited
            gpus, model = gpus_of(row.get("reqtres"))
            types = gpu_types_of(row.get("reqtres"))
        if not gpus:
            skipped["no_gpus"] += 1
            continue
        team = (row.get(team_field.lower()) or "").strip() or None
        restarts = (row.get("restarts") or "").strip()
        for field_name in ("submit", "eligible", "start", "end"):  # junk where a time belongs: unknown, and said
            raw = row.get(field_name)
            if raw is not None and raw.strip() not in NO_TIME and time_of(raw, zone) is None:
                skipped["bad_time"] += 1
        nodes = (row.get("nodelist") or "").strip()
        records.append({
            "job_id": JOB_PREFIX + job, "team": team, "user": (row.get("user") or "").strip() or None,
            "namespace": None, "pod": None,
            "node": None if nodes in ("", "None assigned", "(null)") else nodes,
            "gpu_model": model, "gpus": gpus,
            "submit_ts": time_of(row.get("submit"), zone), "start_ts": time_of(row.get("start"), zone),
            "end_ts": time_of(row.get("end"), zone), "state": state,
            "eligible_ts": time_of(row.get("eligible"), zone),
            "partition": (row.get("partition") or "").strip() or None, "qos": (row.get("qos") or "").strip() or None,
            "account": (row.get("account") or "").strip() or None,
            "exit_code": (row.get("exitcode") or "").strip() or None,
            "restarts": int(restarts) if restarts.isdigit() else None,
            "pending_reason": ((row.get("reason") or "").strip() or None) if state == "pending" else None,
            "name": (row.get("jobname") or "").strip() or None, "source": SOURCE, "gres_type": types,
        })
    if names is None:
        raise InputError("no sacct output found: expected sacct -P rows of fields separated by '|', with a header "
                         "line (JobID|...) or the fields given in the order of sacct's -o, or sacct's fixed-width "
                         "table with its header and the line of dashes under it")
    jobs = jobs_frame(records, skipped)
    return JobBatch(jobs, events_of(jobs), skipped, unknown)


assert set(STATE_WORDS.values()) <= set(STATES)
