"""The `gpuledger` command."""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import socket
import sys
import tomllib
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

from gpuledger.analytics.config import WHATIF_MODELS, Config, load_config
from gpuledger.analytics.focus_export import FORMATS as FOCUS_FORMATS
from gpuledger.analytics.records import json_safe
from gpuledger.analytics.store import Store, StoreError, lake
from gpuledger.analytics.store.lake import is_lake
from gpuledger.analytics.windows import utc_now
from gpuledger.collector.errors import GpuledgerError, InputError
from gpuledger.collector.apps.targets import APP_SOURCES
from gpuledger.collector.jobs import JOB_FORMATS, JOB_SOURCES, QUEUE_FORMATS
from gpuledger.collector.source import Source
from gpuledger.collector.traces import TRACE_NAMES
from gpuledger.deploy import config_command, import_parser, jobs_agent, node_admin, notes_command
from gpuledger.deploy.cli_options import DEFAULT_DB, DEMO_DB
from gpuledger.deploy.cli_options import add_admin_access as _add_admin_access
from gpuledger.deploy.cli_options import add_common as _add_common
from gpuledger.deploy.cli_options import duration as _duration
from gpuledger.deploy.cli_options import instant as _instant
from gpuledger.deploy.cli_options import positive as _positive
from gpuledger.deploy.lifecycle import wait_for_stop
from gpuledger.policies.emitters import TARGETS
from gpuledger.policies.exporting import DEFAULT_STATUS, FORMATS
from gpuledger.policies.exporting import STATUSES as EXPORT_STATUSES
from gpuledger.policies.placers import POLICIES
from gpuledger.policies.recommendation import DECISIONS

DEFAULT_REPORTS = Path("gpuledger-data/reports")


# commands that use a database that exists
READERS = ("report", "recommend", "decide", "emit", "compact", "audit", "backup", "whatif", "capacity", "statement",
           "export", "notes")
# commands that take the demo's file when only that one exists: the readers, and `token`, so that a token made
# beside the demo is made there (on a fresh install it makes the server's file, as before the first `serve`)
DEMO_USERS = (*READERS, "token")


def _database(args: argparse.Namespace) -> Path | str:
    if args.db is not None:
        return args.db
    if args.command in DEMO_USERS and not DEFAULT_DB.exists() and DEMO_DB.exists():
        return DEMO_DB
    return DEFAULT_DB


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from exc
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535 (0: any free port), got {port}")
    return port


def _add_period(p: argparse.ArgumentParser) -> None:
    """--period and --draft, as `statement` and `export` take them."""
    p.add_argument("--period", required=True, metavar="YYYY-MM|YYYY-Www",
                   help="the period: a month such as 2026-11 (or an ISO week such as 2026-W48 when [ledger] "
                        "period = week)")
    p.add_argument("--draft", action="store_true", help="an open period: its figures so far, marked as a draft")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuledger",
        description="GPU observability and chargeback: collect GPU telemetry into DuckDB, price it, find waste, "
                    "and recommend quotas and placements to schedulers.",
        epilog="Start with `gpuledger demo`: it simulates a cluster and opens the API and dashboard on localhost.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="simulated cluster -> DuckDB -> API + dashboard on localhost",
                          description="Backfill a simulated 48-GPU cluster, keep collecting live, and serve the "
                                      "API and dashboard on localhost until Ctrl-C.")
    _add_common(demo, DEMO_DB)
    demo.add_argument("--days", type=_positive, default=14.0, help="days of history to simulate (default 14)")
    demo.add_argument("--seed", type=int, default=7, help="simulator seed (default 7)")
    demo.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    demo.add_argument("--api-port", type=_port, default=8080, help="API port (default 8080; 0 = any free port)")
    demo.add_argument("--dashboard-port", type=_port, default=8501, help="dashboard port (default 8501)")
    demo.add_argument("--interval", type=_positive, default=15.0, help="live sampling interval, s (default 15)")
    demo.add_argument("--reports", type=Path, default=DEFAULT_REPORTS, help="weekly report folder")
    demo.add_argument("--no-dashboard", action="store_true", help="do not start the Streamlit dashboard")
    demo.add_argument("--duration", type=_positive, help="stop after this many seconds (default: run until Ctrl-C)")
    demo.add_argument("--trace", choices=TRACE_NAMES,
                      help="serve a public trace's history instead of the simulator (see `gpuledger import`)")
    demo.add_argument("--trace-data", type=Path, help="the trace's folder (default ../shared/traces/<trace>)")

    serve = sub.add_parser("serve", help="collect from a source and serve the API (one writer per DuckDB file)",
                           description="Collect from --source every --interval (or only receive agents' pushes), "
                                       "fold the samples into the ledger, refresh the advice, write the weekly report "
                                       "on Mondays, and serve the API on --host:--port until SIGTERM. One server "
                                       "writes a DuckDB file; more processes need a DuckLake catalog (--db ducklake:).")
    _add_common(serve)
    _add_source(serve, receive_only=True)
    serve.add_argument("--create", action="store_true",
                       help="make a new, empty database when --db does not exist yet (without it a mistyped path is "
                            "an error, not a new empty store; harmless once the database exists)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to serve the API on (default 127.0.0.1; 0.0.0.0 for every interface)")
    serve.add_argument("--port", type=_port, default=8080, help="the API's port (default 8080; 0 = any free port)")
    serve.add_argument("--reports", type=Path, default=DEFAULT_REPORTS, help="weekly report folder")
    serve.add_argument("--token", default=os.environ.get("GPULEDGER_TOKEN"),
                       help="bootstrap admin token, never stored (default $GPULEDGER_TOKEN): make real tokens with "
                            "it (`gpuledger token create --server URL`), then give agents agent:<node> tokens")
    serve.add_argument("--open-reads", action="store_true",
                       help="answer reads without a token (default: reads need an admin, reader or team token)")
    serve.add_argument("--trusted-proxy", action="append", metavar="CIDR",
                       help="a reverse proxy whose X-Forwarded-For the audit log believes (repeatable; default "
                            "$GPULEDGER_TRUSTED_PROXIES, comma-separated, else none: the connecting address is logged)")
    serve.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve HTTPS with this certificate (chain)")
    serve.add_argument("--tls-key", type=Path, metavar="PEM", help="the certificate's private key")
    serve.add_argument("--max-connections-per-client", type=int, default=64, metavar="N",
                       help="connections one client address may hold open (default 64; 0: no cap; 127.0.0.1 and ::1 "
                            "are not capped). Behind a remote proxy, raise it")
    serve.add_argument("--head-timeout", type=float, default=10.0, metavar="S",
                       help="close a connection whose request head is incomplete after S seconds (default 10)")
    serve.add_argument("--body-timeout", type=float, default=60.0, metavar="S",
                       help="close a connection whose request body is incomplete S seconds after its head "
                            "(default 60)")
    serve.add_argument("--node", help=NODE_HELP)
    serve.add_argument("--read-only", action="store_true",
                       help="an API replica of a DuckLake catalog another server writes: reads only, no source, no "
                            "pushes, no report job")

    agent = sub.add_parser("agent", help="per-node agent: sample, spool to disk, push batches to the server",
                           description="Samples this node every --interval, writes each batch to --spool before "
                                       "sending it to --server, and deletes it only once acknowledged. While the "
                                       "server is away the spool grows up to --spool-max-mb, then drops the "
                                       "oldest batches (counted in /metrics).")
    _add_source(agent)
    agent.add_argument("--config", type=Path, help="TOML config (attribution rules)")
    agent.add_argument("--server", required=True, help="central server URL, e.g. http://gpuledger:8080")
    agent.add_argument("--token", default=os.environ.get("GPULEDGER_TOKEN"),
                       help="the node's agent:<node> token (default $GPULEDGER_TOKEN)")
    agent.add_argument("--token-file", type=Path, metavar="FILE",
                       help="read the token from this file (a mounted Secret), instead of --token")
    agent.add_argument("--ca", type=Path, metavar="PEM",
                       help="verify an https:// server against this CA certificate (default: the system's CAs)")
    agent.add_argument("--node", default=os.environ.get("NODE_NAME") or socket.gethostname(),
                       help="node name (default $NODE_NAME, which a DaemonSet sets to the pod's node from the "
                            "downward API, else the hostname; in a pod the hostname is the pod's name)")
    agent.add_argument("--spool", type=Path, default=Path("/var/lib/gpuledger/spool"), help="spool directory")
    agent.add_argument("--spool-max-mb", type=_positive, default=256.0, help="spool bound in MiB (default 256)")
    agent.add_argument("--metrics-port", type=_port, default=9401,
                       help="port for the agent's own /metrics on 127.0.0.1 (default 9401; 0 = off)")
    agent.add_argument("--sim-replay-start", type=float,
                       help="simulator only: sample step k at this epoch + k*interval instead of the clock")
    agent.add_argument("--duration", type=_positive, help="stop after this many seconds (default: until SIGTERM)")

    collect = sub.add_parser("collect", help="read a source and append to the DuckDB file, then exit",
                             description="Read --source --count times, --interval apart, append the samples to --db "
                                         "and exit: for a cron job, or to try a source before serving it.")
    _add_common(collect)
    _add_source(collect)
    collect.add_argument("--count", type=int, default=1, help="number of reads (default 1)")
    collect.add_argument("--node", help=NODE_HELP)

    report = sub.add_parser("report", help="write the weekly cost report (HTML for admins, a page and CSV per team)",
                            description="The week's cost per team and GPU model, idle waste, queues and outcomes, "
                                        "inference cost per million tokens and the advice as of the week's end, as an "
                                        "HTML page for admins and a page and CSV file per team under --out/<week>; "
                                        "--pdf prints the admin page, --send mails it as [report.email] says.")
    _add_admin_access(report, "a reader's, a team's (its own page and CSV) or")
    report.add_argument("--week", nargs="?", const="last", default="last", metavar="YYYY-Www",
                        help="ISO week to report, e.g. 2026-W48, 'last' (the default: the last complete week) or "
                             "'current' (the week in progress, marked as such); a week with no samples is an error")
    report.add_argument("--out", type=Path, default=DEFAULT_REPORTS, help=f"output folder (default {DEFAULT_REPORTS})")
    report.add_argument("--pdf", action="store_true", help="also print the admin page to PDF (headless Chromium)")
    report.add_argument("--send", action="store_true",
                        help="mail it as [report.email] in --config says (admins: page, PDF, summary CSV; each team: "
                             "its page and CSV)")

    stmt = sub.add_parser(
        "statement", help="print and write a period's statement (CSV, HTML, --pdf): final once the period closed",
        description="Closes every period whose grace has passed ([ledger] period and grace_days), then prints the "
                    "statement of --period: per team, GPU model and rate card version, with the adjustments "
                    "booked into it, and writes it as CSV and HTML (and PDF) into --out. A closed period's "
                    "statement is the stored one and never changes; an open period's figures are a draft "
                    "(--draft).")
    _add_admin_access(stmt, "a reader's, a team's (its own lines) or an admin's")
    _add_period(stmt)
    stmt.add_argument("--team", help="only this team's lines and adjustments (the total is then the team's)")
    stmt.add_argument("--out", type=Path, default=DEFAULT_REPORTS, help=f"output folder (default {DEFAULT_REPORTS})")
    stmt.add_argument("--pdf", action="store_true", help="also print the page to PDF (headless Chromium)")

    export = sub.add_parser(
        "export", help="a period's statement in a format finance tools read (FOCUS 1.2, CSV or Parquet)",
        description="Closes every period whose grace has passed, then writes --period's statement as FOCUS rows "
                    "(FinOps Open Cost and Usage Specification 1.2, plus the 1.0 column names its validator "
                    "checks): one row per statement line and per adjustment, amounts in the statement's cents.")
    _add_admin_access(export, "a reader's, a team's (its own lines) or an admin's")
    export.add_argument("what", choices=["focus"], help="the format: focus")
    _add_period(export)
    export.add_argument("--out", type=Path, required=True, help="the file to write")
    export.add_argument("--format", choices=FOCUS_FORMATS, help="csv or parquet (default: from --out's suffix, "
                                                                "else csv)")

    rec = sub.add_parser("recommend", help="re-evaluate, store and print the open recommendations as JSON",
                         description="Evaluates the policy now over the policy window ([quota] window_days, default "
                                     "14), stores what is new (a change only after the cool-down and by at least "
                                     "the configured step) and prints the open recommendations, plus an "
                                     "insufficient_data note for each team and GPU model without enough samples.")
    _add_admin_access(rec, "a reader's or")
    rec.add_argument("--at", type=_instant, metavar="ISO-8601",
                     help="evaluate at this instant instead, storing nothing (status preview)")

    whatif = sub.add_parser(
        "whatif", help="replay the recorded jobs under the quotas in force and a proposal: waits per team",
        description="Replays the window's recorded jobs (arrival, GPUs and model asked, run time, team) through a "
                    "model of the scheduler (Kueue-, KAI- or Slurm-like) twice: under the quotas in force and under "
                    "the proposal (the open recommendations, then --proposal and --set edits; or only the edits with "
                    "--no-recommendations). Prints per team the queue wait p50/p95, completion time, GPU-hours "
                    "served and preemptions under both, the difference, and what was assumed. Example: "
                    "gpuledger whatif --set nlp:H100=12 --set vision:H100=6 --no-recommendations",
        epilog="A proposal file is JSON or TOML: {team: {GPU model: {guarantee: N, limit: N}}}.")
    _add_admin_access(whatif, "a reader's or")
    whatif.add_argument("--model", choices=list(WHATIF_MODELS),
                        help="the scheduler model (default: [whatif] model, kueue)")
    whatif.add_argument("--days", type=_positive, help="the window's length (default: [quota] window_days, 14)")
    whatif.add_argument("--end", type=_instant, metavar="ISO-8601", help="the window's end (default: now)")
    whatif.add_argument("--proposal", type=Path, metavar="FILE", help="quota edits as JSON or TOML (see below)")
    whatif.add_argument("--set", dest="edits", action="append", default=[], metavar="TEAM:MODEL=G[/L]",
                        help="a guarantee (and limit) for a team and GPU model, e.g. nlp:H100=12 or nlp:H100=12/16")
    whatif.add_argument("--no-recommendations", dest="recommendations", action="store_false",
                        help="start the proposal from the quotas in force, not the open recommendations")
    whatif.add_argument("--capacity", action="append", default=[], metavar="MODEL=N",
                        help="the proposal's GPUs of a model (H200=16 to buy, A100-80GB=0 to retire)")
    whatif.add_argument("--placers", metavar="P[,P...]",
                        help=f"instead: the placement what-if, the window's jobs through each placer "
                             f"({', '.join(POLICIES)}) on the GPUs present, from empty: fragmentation, stranded "
                             "GPU-hours and dollars, waits, gang jobs that would have started earlier "
                             "(POST /v1/whatif/placement)")
    whatif.add_argument("--json", action="store_true", help="print the whole answer (POST /v1/whatif's) as JSON")

    capacity = sub.add_parser(
        "capacity", help="the monthly capacity review: per GPU model, weeks until demand fills its GPUs",
        description="Per GPU model present: capacity (GPUs x 168 GPU-hours a week), the weekly demand of the last "
                    "--weeks whole weeks (busy GPU-hours: allocated at or over [waste] idle_util_pct utilisation; "
                    "plus queued GPU-hours: GPUs x the time jobs waited for the model, from the schedulers' job "
                    "records), the least-squares trend through the weeks with its standard error and 80% interval, "
                    "and the weeks until the trend's demand reaches capacity with the range that interval implies. "
                    "Only whole weeks are fitted (samples in 90% of their hours); fewer than 3 is insufficient_data "
                    "with the reason, never a guess. A model without utilisation readings is forecast on allocated "
                    "GPU-hours, and without job records the queue is unknown: each answer's basis says so. The same "
                    "answer as GET /v1/capacity/forecast and the dashboard's What-if page.",
        epilog="Example: gpuledger capacity --weeks 12 (the last 12 weeks to now); "
               "gpuledger capacity --end 2026-12-01T00:00Z --json")
    _add_admin_access(capacity, "a reader's or")
    capacity.add_argument("--weeks", type=int, default=8, metavar="N",
                          help="whole weeks of history to fit, 3 to 104 (default 8: the month under review and "
                               "the one before)")
    capacity.add_argument("--end", type=_instant, metavar="ISO-8601",
                          help="the window's end (default: now; floored to the whole hour)")
    capacity.add_argument("--json", action="store_true", help="print the whole answer (GET /v1/capacity/forecast's) "
                                                              "as JSON")

    dec = sub.add_parser("decide", help="record a decision on a stored recommendation (accept, reject, applied)",
                         description="Accept or reject a proposed recommendation, or mark it applied once the "
                                     "scheduler runs it (an applied quota becomes the guarantee in force). The "
                                     "decision, who made it and why are kept with the recommendation and in the "
                                     "audit log.")
    _add_admin_access(dec)
    dec.add_argument("id", help="the recommendation's id (see `gpuledger recommend` or /v1/recommendations)")
    dec.add_argument("decision", choices=list(DECISIONS),
                     help="applied: the scheduler now runs it; a quota's guarantee becomes the current one")
    dec.add_argument("--by", required=True, help="who decided")
    dec.add_argument("--note", help="why")

    emit = sub.add_parser("emit", help="write the quota plan as KAI, Kueue, Volcano or Slurm objects",
                          description="The teams' shares and guarantees and limits per GPU model in the target "
                                      "scheduler's objects: the quotas in force, with the accepted recommendations "
                                      "applied (--status open: proposed ones too). A header says when and from "
                                      "which advice it was made, or that it is the quotas in force unchanged, and "
                                      "every adjustment made so that it can be applied. A plan that would strand "
                                      "GPUs or could not start a job shape of the policy window is refused (exit "
                                      "2). With --current, only what changes, every field gpuledger does not own "
                                      "kept.")
    _add_admin_access(emit, "a reader's or")
    emit.add_argument("--target", required=True, choices=TARGETS, help="the scheduler to write for")
    emit.add_argument("--out", type=Path, help="folder to write <target>.yaml (slurm: slurm.sh and slurm.json) into; "
                                               "default: stdout")
    emit.add_argument("--current", type=Path, metavar="FILE",
                      help="the objects that exist now: a YAML dump (kubectl get ... -o yaml) for Kubernetes "
                           "targets, `sacctmgr -nP show assoc format=Account,User,ParentName,Fairshare,GrpTRES` "
                           "output for slurm")
    emit.add_argument("--status", choices=list(EXPORT_STATUSES), default=DEFAULT_STATUS,
                      help=f"which recommendations to apply: accepted only (default: {DEFAULT_STATUS}; nothing "
                           "unreviewed reaches a scheduler), or open (proposed and accepted, to review); the quotas "
                           "in force for the rest")
    emit.add_argument("--fill", action="store_true",
                      help="where accepted advice leaves GPUs under no guarantee (stranded: Kueue admits at most "
                           "the guarantees summed), share them out by the teams' shares instead of refusing")
    emit.add_argument("--format", choices=FORMATS, default="native",
                      help="native: YAML for Kubernetes, a shell script for slurm; json: the objects as JSON")

    compact = sub.add_parser(
        "compact", help="fold closed minutes into the rollups and drop what retention expired",
        description="Folds every closed minute into the minute and hour rollups, then drops raw samples older than "
                    "[retention] raw_days (default 30) and minute rollups older than minute_days (default 90); hour "
                    "rollups are kept forever. Nothing is dropped before it is folded, so GPU-hours and cost are the "
                    "same before and after. A running server does this once a day on its own.")
    _add_admin_access(compact)
    compact.add_argument("--rebuild", action="store_true",
                         help="first rebuild the rollups from the raw samples kept (after a change of "
                              "[waste] idle_util_pct, or to check them)")

    import_parser.add_parser(sub, _add_common, _positive)

    replay = sub.add_parser(
        "replay", help="replay a public cluster trace through a placement policy (allocation, fragmentation)",
        description="Places the trace's tasks one by one in a seeded random order, inflated with copies of its own "
                    "tasks to 130% of GPU capacity (no departures), as the FGD paper (Weng et al., ATC '23) "
                    "evaluates policies; prints GPU allocated and fragmented (FGD's measure) as shares of capacity at "
                    "10% steps of arrived load, and a last line `final allocation NN.NN% fragmentation@80% "
                    "NN.NN%`.")
    replay.add_argument("trace", choices=["openb"], help="openb: Alibaba's cluster-trace-gpu-v2023 (CC BY 4.0)")
    replay.add_argument("--data", type=Path, required=True,
                        help="the trace's csv folder, e.g. ../shared/traces/openb/csv")
    replay.add_argument("--policy", choices=POLICIES, default="fgd",
                        help="placement policy (default fgd)")
    replay.add_argument("--trace", dest="variant", default="default", metavar="POD_LIST",
                        help="which pod list: default, gpushare20..100, multigpu20..50, gpuspec05..33, cpu0..300 "
                             "(default: default, the real tasks)")
    replay.add_argument("--seed", type=int, default=42, help="arrival order, inflation copies, random choices (42)")
    replay.add_argument("--inflation", type=_positive, default=1.3,
                        help="inflate the tasks to this share of GPU capacity (default 1.3)")
    replay.add_argument("--json", action="store_true", help="print the whole result as JSON instead of a table")

    token = sub.add_parser("token", help="make, list and revoke API tokens (admin, reader, team:T, agent:NODE)",
                           description="On --db when no server holds the file; else through --server with an "
                                       "admin token. A new token is printed once, on stdout; the store keeps a hash.")
    _add_admin_access(token)
    token.add_argument("action", choices=["create", "list", "revoke"],
                       help="create a token (printed once), list them, or revoke one by id")
    token.add_argument("id", nargs="?", help="revoke: the token's id (see `gpuledger token list`)")
    token.add_argument("--role", help="create: admin, reader, team:<team> or agent:<node>; the team must be known "
                                      "(a share in the config's [teams], or GPU usage recorded), else refused")
    token.add_argument("--name", help="create: what the token is for (default: the role)")
    token.add_argument("--expires", type=_duration, metavar="DURATION",
                       help="create: it stops working after this long, e.g. 90d, 12h (default: never; `token list` "
                            "shows each token's expiry and last use for access reviews)")
    token.add_argument("--revoked", action="store_true", help="list: include revoked tokens")
    token.add_argument("--json", action="store_true", help="list: as JSON")

    audit = sub.add_parser("audit", help="print the audit log of writes and decisions, and check its hash chain",
                           description="Exit 1 when the chain is broken (a row edited or removed outside gpuledger).")
    _add_admin_access(audit)
    audit.add_argument("--since", type=_instant, metavar="ISO-8601", help="entries from this instant")
    audit.add_argument("--limit", type=int, default=200, help="most entries (default 200)")
    audit.add_argument("--json", action="store_true", help="as JSON")

    node_admin.add_parser(sub)
    jobs_agent.add_parser(sub)
    notes_command.add_parser(sub)
    config_command.add_parser(sub)

    back = sub.add_parser("backup", help="a consistent snapshot of the whole store into DIR, while serving",
                          description="From a running server (--server URL with an admin --token) or from --db when "
                                      "no server holds it. Writes gpuledger-<UTC time>.duckdb and its manifest (.json: "
                                      "schema version, rows per table, SHA-256), and checks the file against it.")
    _add_admin_access(back)
    back.add_argument("dir", type=Path, help="folder to write the backup into")

    rest = sub.add_parser("restore", help="check a backup against its manifest and put it in place as --db",
                          description="The server must be stopped. The manifest's signature is checked with the "
                                      "audit key beside --db (<db>.audit-key, or $GPULEDGER_AUDIT_KEY_FILE): on "
                                      "another machine, copy the key file of the site that took the backup. An "
                                      "existing database is replaced only with --force, and kept as "
                                      "<db>.before-restore-<time>.")
    _add_common(rest)
    rest.add_argument("backup", type=Path, help="a gpuledger-*.duckdb file written by `gpuledger backup`")
    rest.add_argument("--force", action="store_true", help="replace an existing --db")
    rest.add_argument("--check", action="store_true", help="only check the backup; change nothing")

    scrape = sub.add_parser(
        "scrape", help="read one /metrics page (URL, file or -) and show what gpuledger would store from it",
        description="Read one /metrics page and say what gpuledger makes of it, like `promtool check metrics`: "
                    "the exporters recognised by the families on the page (dcgm-exporter, kube-state-metrics, "
                    "Kueue, KAI, HAMi, vLLM, Triton, TGI, SGLang and its router, a training job's "
                    "gpuledger_train_* counters), the rows it would store per figure, and every line or series "
                    "it skipped, by reason, with examples. Nothing is stored. Exit status: 0 when something was "
                    "recognised, 1 when nothing was, 2 when the page could not be read.",
        epilog="Examples: `gpuledger scrape http://vllm:8000/metrics`, `curl -s http://node:9400/metrics | "
               "gpuledger scrape - --json`.")
    scrape.add_argument("source", metavar="URL|FILE",
                        help="an http:// or https:// URL, a file holding a page, or - for standard input")
    scrape.add_argument("--json", action="store_true",
                        help="print one JSON object: kind (list), rows, skipped (reason -> count), examples")
    scrape.add_argument("--timeout", type=_positive, default=10.0, metavar="S",
                        help="seconds to wait for a URL to answer (default 10); pages over 50 MB are refused")
    scrape.add_argument("--config", type=Path, help="a site config whose [apps] aliases and triton_ensembles apply "
                                                    "(check a name you taught it)")

    dash = sub.add_parser("dashboard", help="run the Streamlit dashboard against a running API",
                          description="Serve the Streamlit dashboard on --host:--port, reading everything from the "
                                      "API at --api (sign in with a token in its sidebar when reads need one).")
    dash.add_argument("--api", default="http://127.0.0.1:8080", help="API base URL (default http://127.0.0.1:8080)")
    dash.add_argument("--host", default="127.0.0.1", help="address to serve the dashboard on (default 127.0.0.1)")
    dash.add_argument("--port", type=_port, default=8501, help="the dashboard's port (default 8501)")
    return parser


NODE_HELP = ("the node a scraped dcgm-exporter runs on (default: the page's Hostname label when it names a node; "
             "rows of a page that names none go under 'unknown', with a warning)")


def _add_source(p: argparse.ArgumentParser, receive_only: bool = False) -> None:
    """`receive_only` (the server): also offer `--source none`, for a central server that only stores what agents
    push, and `--source prometheus`, which backfills and then follows (a server's job, not a one-off read's)."""
    p.add_argument("--source", choices=["nvml", "dcgm", "simulator"] + ["none", "prometheus"] * receive_only,
                   default="nvml",
                   help="where samples come from (default nvml: the GPUs of this node; dcgm: one dcgm-exporter page"
                        + ("; prometheus: dcgm-exporter's series in Prometheus, history then new samples; none: only "
                           "receive agents' pushes)" if receive_only else ")"))
    p.add_argument("--dcgm-url", default="http://127.0.0.1:9400/metrics", help="dcgm-exporter /metrics URL")
    p.add_argument("--hami-url", help="with dcgm: HAMi's vGPU monitor /metrics on the same node (the port its "
                                      "device plugin's monitor container serves), read with each page for what each pod "
                                      "sharing a GPU used: its own utilisation and memory, and its part when no request "
                                      "is known")
    p.add_argument("--interval", type=_positive, default=30.0,
                   help="seconds between reads (default 30" + ("; with prometheus: its scrape interval for the "
                                                                "exporters)" if receive_only else ")"))
    if receive_only:
        p.add_argument("--prometheus-url", default="http://127.0.0.1:9090",
                       help="Prometheus base URL (default http://127.0.0.1:9090)")
        p.add_argument("--since", type=_duration, default=timedelta(days=30),
                       help="with prometheus: how much history to backfill, e.g. 30d, 12h (default 30d; a restarted "
                            "server resumes after the newest sample it stored)")
        p.add_argument("--team-label", default="team",
                       help="with prometheus: the pod label naming a team, read from kube-state-metrics' "
                            "kube_pod_labels as label_<name> (default team)")
        p.add_argument("--jobs-from", choices=JOB_SOURCES, default="none",
                       help="where to read job lifecycle and scheduler queues continuously (default none; "
                            "prometheus: kube-state-metrics pods, Kueue and KAI queue metrics from --prometheus-url, "
                            "history from --since on the first read; slurm: squeue, sacct and sacctmgr run on this "
                            "host each --jobs-interval, sacct from --since back on the first read)")
        p.add_argument("--jobs-interval", type=_positive, default=60.0,
                       help="with --jobs-from: seconds between reads (default 60)")
        p.add_argument("--class-label", help="with --jobs-from prometheus: the pod label or annotation naming the "
                                             "workload class (training, fine_tuning, batch_inference, "
                                             "online_inference, interactive, agentic; default: from the priority "
                                             "class, the pod's owner and name)")
        p.add_argument("--apps-from", choices=APP_SOURCES, default="config",
                       help="where to read inference servers' own metrics (vLLM, Triton, TGI, SGLang) for cost per "
                            "million tokens and latency SLOs (default config: the [[apps.targets]] of --config, none "
                            "when it lists none; prometheus: their series in --prometheus-url, from --since back on "
                            "the first read, at most 6h; none: not read). Every [apps] interval_s (default 30)")


def _make_source(args: argparse.Namespace, config: Config) -> Source | None:
    if args.source == "prometheus":
        from gpuledger.collector.prometheus_source import PrometheusSource
        return PrometheusSource(args.prometheus_url, args.interval, since=args.since, attributor=config.attributor(),
                                team_label=args.team_label)
    if args.source == "dcgm":
        from gpuledger.collector.dcgm_source import DcgmExporterSource
        # the agent runs on the node it names; a central scrape takes the node from each page
        return DcgmExporterSource(args.dcgm_url, args.interval, config.attributor(), node=getattr(args, "node", None),
                                  hami_url=args.hami_url)
    if args.source == "nvml":
        from gpuledger.collector.nvml_source import NvmlSource
        return NvmlSource(interval_s=args.interval, attributor=config.attributor())
    if args.source == "none":
        return None
    return simulator_source(args.interval, getattr(args, "node", None), getattr(args, "sim_replay_start", None))


def simulator_source(interval_s: float, node: str | None = None, replay_start: float | None = None) -> Source:
    """The simulated cluster (or one node of it); anchored at `replay_start` so a replay is reproducible."""
    from datetime import datetime, timezone

    from gpuledger.collector.simulator import DEFAULT_NODES, SimulatorSource, cluster_of, default_simulator
    now = datetime.fromtimestamp(replay_start, timezone.utc) if replay_start is not None else None
    if node is None or node in {n.name for n in DEFAULT_NODES}:
        return SimulatorSource(default_simulator(days=1, now=now), interval_s, node=node, replay_start=replay_start)
    suffix = node.rsplit("-", 1)[-1]
    if not suffix.isdigit():
        raise InputError(f"simulated node must be one of the demo nodes or node-NNNN, got {node!r}")
    return SimulatorSource(cluster_of(int(suffix) + 1, now=now), interval_s, node=f"node-{int(suffix):04d}",
                           replay_start=replay_start)


def _store(args: argparse.Namespace, read_only: bool = False) -> Store:
    return Store(args.db, read_only=read_only, lake_data=args.lake_data if is_lake(args.db) else None)


def _open_store(args: argparse.Namespace, config: Config) -> Store:
    store = _store(args)
    config.apply_to(store)
    config.price(store)
    if config.teams:
        store.upsert_teams(config.team_frame())
        store.set_team_quotas(config.quota_frame())
    return store


def _open_existing(args: argparse.Namespace, config: Config, read_only: bool = False) -> Store:
    """The store of --db, which must exist. `read_only`: taken on a DuckLake catalog only (a reader beside the
    server); a DuckDB file is opened to write, which also brings an older file's schema up to date."""
    if not is_lake(args.db) and not Path(args.db).exists():
        raise StoreError(f"no database at {args.db}: pass --db, or run `gpuledger demo` / `gpuledger serve` first")
    store = _store(args, read_only=read_only and is_lake(args.db))
    config.apply_to(store)
    return store


def _require_data(store: Store, db: Path | str) -> None:
    if store.sample_count() == 0:
        raise StoreError(f"{db} holds no samples yet: run `gpuledger collect` or `gpuledger serve` first")


def main(argv: list[str] | None = None) -> int:
    """Run one command. Errors a user can fix (GpuledgerError) are one line and exit code 2; anything else
    is a bug and keeps its traceback."""
    args = build_parser().parse_args(argv)
    if hasattr(args, "db"):
        args.db = _database(args)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    try:
        if args.command == "dashboard":
            return cmd_dashboard(args)
        _find_server(args)
        _server_config_note(args)
        return COMMANDS[args.command](args, load_config(getattr(args, "config", None)))
    except GpuledgerError as exc:
        print(f"gpuledger {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `gpuledger recommend | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 0


def _find_server(args: argparse.Namespace) -> None:
    """A command that can ask a server, run without --server on a file a live server on this machine holds (its
    note beside the file, deploy/server_file.py): asks that server, and says so, instead of failing on the lock."""
    from gpuledger.deploy import server_file
    if getattr(args, "server", "") is not None or not hasattr(args, "db") or lake.is_lake(str(args.db)):
        return
    found = server_file.announced(args.db)
    if found is None:
        return
    args.server = found["url"]
    print(f"gpuledger {args.command}: {args.db} is held by the server at {args.server} (process {found['pid']}): "
          "asking it (pass --server to ask another; stop the server to use the file)", file=sys.stderr)


def _server_config_note(args: argparse.Namespace) -> None:
    """A --config given to a command a server answers: the server prices and judges with its own config, so say
    that this file's rates and thresholds are not what the answer rests on."""
    if getattr(args, "server", None) and getattr(args, "config", None) and args.command in READERS:
        print(f"gpuledger {args.command}: --config {args.config} is read for this command's own options only; the "
              f"server at {args.server} answers with the config it was started with", file=sys.stderr)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from gpuledger.deploy.dashboard_proc import start_dashboard
    from gpuledger.deploy.ports import require_free
    require_free(args.host, args.port, "--port", any_port=False)
    proc, url = start_dashboard(args.api, host=args.host, port=args.port)
    print(f"dashboard: {url} (API {args.api}); Ctrl-C to stop")
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return 0


def cmd_demo(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.deploy.demo import run_demo
    if is_lake(args.db):
        raise InputError("the demo builds (and rebuilds) a DuckDB file of its own: give --db a path, not a DuckLake "
                         "catalog")
    return run_demo(args.db, config, days=args.days, seed=args.seed, host=args.host,
                    api_port=args.api_port, dashboard_port=args.dashboard_port, interval_s=args.interval,
                    reports=args.reports, dashboard=not args.no_dashboard, duration_s=args.duration,
                    echo=lambda line: print(line, flush=True), trace=args.trace, trace_data=args.trace_data)


def cmd_report(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.deploy.weekly_report import weekly_report
    from gpuledger.deploy.demo import with_demo_slos
    try:
        if args.server:  # the server writes it (GET /v1/reports/WEEK: a team token gets its own page and CSV)
            from gpuledger.deploy.report_bundle import unpack
            files = unpack(_server(args).call("GET", f"/v1/reports/{args.week}", binary=True, timeout=900),
                           args.out)
        else:
            with _open_existing(args, config, read_only=True) as store:
                _require_data(store, args.db)
                files = weekly_report(store, with_demo_slos(store, config), args.out, args.week)
    except OSError as exc:
        raise InputError(f"cannot write the report into {args.out}: {exc.strerror or exc}") from exc
    print(f"report {files.label}: {files.html}")
    print(f"summary: {files.summary_csv}")
    for team, path in sorted(files.team_csvs.items()):
        print(f"  {team}: {files.team_pages.get(team, path)} and {path.name}")
    if args.pdf or args.send:
        from gpuledger.deploy.report_delivery import render_pdf, send
        if args.pdf:  # asked for: an install that cannot print fails naming what it lacks
            print(f"pdf: {render_pdf(files, strict=True)}")
        elif render_pdf(files) is None:  # --send alone: the mail goes without it, as the Monday job's does
            print("pdf: not attached (no Chromium here; see the log)")
        if args.send:
            if config.email is None:
                raise InputError("--send needs [report.email] in the --config file (host, admins, teams)")
            print(f"mailed {send(config.email, files)} message(s) through {config.email.host}:{config.email.port}")
    return 0


def _statement_of(args: argparse.Namespace, config: Config) -> dict:
    """--period's statement, after closing what is due; an open period only with --draft. With --server, the
    running server's (GET /v1/ledger/statements/PERIOD: it closes what is due itself; a team token gets its own
    and the shared lines)."""
    from gpuledger.analytics.ledger import close_due, statement
    if args.server:
        found = _instants(_server(args).call("GET", f"/v1/ledger/statements/{args.period}", timeout=600))
        found.pop("cluster_total_usd", None)
    else:
        with _open_existing(args, config) as store:
            if args.config:  # the site's card, checked as the server checks it; without --config: the stored one
                config.price(store)
            for period in close_due(store, config.ledger, by=f"gpuledger {args.command}"):
                print(f"closed period {period}", file=sys.stderr)
            found = statement(store, config.ledger, args.period)
    if found["state"] == "open" and not args.draft:
        raise InputError(f"period {found['period']} is open until {found['closes_at']:%Y-%m-%d %H:%M} UTC "
                         "([ledger] grace_days after its end), so it has no final statement yet: add --draft for its "
                         "figures so far")
    return found


def cmd_export(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.analytics.focus_export import focus_rows, write_focus
    kind = args.format or ("parquet" if args.out.suffix.lower() == ".parquet" else "csv")
    rows = focus_rows(_statement_of(args, config))
    try:
        write_focus(rows, args.out, kind)
    except OSError as exc:
        raise InputError(f"cannot write {args.out}: {exc.strerror or exc}") from exc
    print(f"FOCUS {kind}: {args.out} ({len(rows)} rows, BilledCost {rows['BilledCost'].sum():,.2f} USD)")
    return 0


def cmd_statement(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.analytics.ledger import for_team
    from gpuledger.analytics.report import write_statement
    found = _statement_of(args, config)
    if args.team:
        found = for_team(found, args.team)
    try:
        csv, page = write_statement(found, args.out, args.team)
    except OSError as exc:
        raise InputError(f"cannot write the statement into {args.out}: {exc.strerror or exc}") from exc
    print(statement_text(found))
    print(f"csv: {csv}\nhtml: {page}")
    if args.pdf:
        from gpuledger.deploy.report_delivery import print_pdf
        print(f"pdf: {print_pdf(page, strict=True)}")
    return 0


def statement_text(found: dict) -> str:
    """A statement as the terminal shows it: its state, a line per team, GPU model and rate card version, the
    adjustments, the team totals and the total."""
    import pandas as pd

    def when(key: str, shown: str = "%Y-%m-%d %H:%M UTC") -> str:
        return f"{pd.Timestamp(found[key]):{shown}}"
    state = (f"closed {when('closed_at')} by {found['closed_by']} (final)" if found["state"] == "closed"
             else f"DRAFT: open until {when('closes_at')}")
    cover = found.get("coverage") or {}
    covered = (cover.get("note") or f"samples in {cover['hours_with_data']:,} of {cover['hours_elapsed']:,.0f} "
               "hours") if cover else ""
    out = [f"statement {found['period']} ({when('start', '%Y-%m-%d')} to {when('end', '%Y-%m-%d')}), {state}; "
           f"{found['split']}", *([f"coverage: {covered}"] if covered else []),
           f"{'team':<24} {'GPU model':<14} {'rate card':<26} {'USD/GPU-h':>9} {'GPU-hours':>11} {'cost USD':>12}"]
    for line in found["lines"]:
        rate = "-" if line["usd_per_gpu_hour"] is None else f"{line['usd_per_gpu_hour']:.4g}"
        share = "" if line["kind"] == "usage" else f"  ({line['kind']} of {line['shared_from']})"
        out.append(f"{line['team']:<24.24} {line['gpu_model'] or '-':<14.14} {line['rate_card'] or 'unpriced':<26} "
                   f"{rate:>9} {line['gpu_hours']:>11,.2f} {line['cost_usd']:>12,.2f}{share}")
    for adj in found["adjustments"]:
        out.append(f"adjustment {adj['id']}: {adj['team']} {adj['usd']:+,.2f} USD for {adj['corrects']} "
                   f"by {adj['made_by']}: {adj['reason']}")
    for team in found["teams"]:
        out.append(f"  {team['team']:<22.22} usage {team['usage_usd']:>12,.2f}  adjustments "
                   f"{team['adjustments_usd']:>10,.2f}  total {team['total_usd']:>12,.2f}")
    out.append(f"total USD {found['total_usd']:,.2f}")
    return "\n".join(out)


_ISO_INSTANT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")


def _instants(value: Any) -> Any:
    """An API answer with its ISO instants as datetimes, for the text renderers the file path feeds datetimes."""
    if isinstance(value, dict):
        return {k: _instants(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_instants(v) for v in value]
    if isinstance(value, str) and _ISO_INSTANT.match(value):
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value


def _server(args: argparse.Namespace) -> Any:
    """The running server a command with --server asks, with the caller's token; a read goes without one to a
    server with --open-reads (the demo), and the server refuses it with 401 where reads need one."""
    from gpuledger.deploy.token_admin import RemoteAdmin
    if args.command in ("decide", "compact"):  # writes: an admin's token, as for token, audit and backup
        return RemoteAdmin(*_server_access(args))
    return RemoteAdmin(args.server, args.token or "", str(args.ca) if args.ca else None)


def cmd_recommend(args: argparse.Namespace, config: Config) -> int:
    if args.server:  # the server's answer is this command's output: GET /v1/recommendations, the same JSON
        params = {"end": args.at.isoformat()} if args.at else {}
        json.dump(_server(args).call("GET", "/v1/recommendations", params=params, timeout=600), sys.stdout,
                  indent=2)
        print()
        return 0
    from gpuledger.deploy.demo import with_demo_slos
    from gpuledger.policies.recommender import evaluate, refresh
    with _open_existing(args, config) as store:
        _require_data(store, args.db)
        config = with_demo_slos(store, config)
        evaluation = evaluate(store, config, args.at)
        if args.at:
            recs = evaluation.proposals()
        else:
            recs = refresh(store, config, evaluation.at, evaluation)
        recs += evaluation.insufficient()
    from gpuledger.deploy.api.recommendations import recommendations_answer
    json.dump(recommendations_answer(evaluation, recs), sys.stdout, indent=2)  # GET /v1/recommendations' shape
    print()
    return 0


def _edits(args: argparse.Namespace) -> dict[str, dict[str, dict[str, float]]]:
    """--proposal's file and the --set edits as {team: {model: {"guarantee": G, "limit": L}}}."""
    edits: dict[str, dict[str, dict[str, float]]] = {}
    if args.proposal is not None:
        try:
            text = args.proposal.read_text()
        except OSError as exc:
            raise InputError(f"cannot read --proposal {args.proposal}: {exc.strerror or exc}") from exc
        try:
            edits = json.loads(text) if text.lstrip().startswith("{") else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise InputError(f"--proposal {args.proposal}: neither JSON nor TOML ({exc})") from exc
        if not isinstance(edits, dict):
            raise InputError(f"--proposal {args.proposal}: expected {{team: {{model: {{guarantee, limit}}}}}}")
    for item in args.edits:
        match = re.fullmatch(r"([^:=]+):([^=]+)=([0-9.]+)(?:/([0-9.]+))?", item)
        if not match:
            raise InputError(f"--set {item!r}: expected TEAM:MODEL=GUARANTEE or TEAM:MODEL=GUARANTEE/LIMIT")
        team, model, guarantee, limit = match.groups()
        numbers = {"guarantee": float(guarantee), **({"limit": float(limit)} if limit else {})}
        edits.setdefault(team, {}).setdefault(model, {}).update(numbers)
    return edits


def _capacity(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        match = re.fullmatch(r"([^=]+)=([0-9]+)", item)
        if not match:
            raise InputError(f"--capacity {item!r}: expected MODEL=N (a whole number of GPUs)")
        out[match.group(1)] = int(match.group(2))
    return out


def _minutes(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def whatif_text(answer: dict) -> str:
    """POST /v1/whatif's answer as a table per team: current -> proposed."""
    out = [f"what-if: {answer['model']}-like scheduler, {answer['start']:%Y-%m-%d %H:%M} .. "
           f"{answer['end']:%Y-%m-%d %H:%M} UTC, {answer['jobs']} jobs replayed "
           f"(in {answer['seconds']:.2f} s)"]
    changed = [q for q in answer["quotas"] if q["changed"]]
    out.append("proposal: " + ("; ".join(
        f"{q['team']} {q['gpu_model']} guarantee {q['current_guarantee_gpus'] or 0:g} -> "
        f"{q['proposed_guarantee_gpus'] or 0:g}, limit {q['current_limit_gpus']:g} -> {q['proposed_limit_gpus']:g}"
        for q in changed) or "no quota changes"))
    if answer["capacity"]["current"] != answer["capacity"]["proposed"]:
        out.append(f"capacity: {answer['capacity']['current']} -> {answer['capacity']['proposed']}")
    now, then = (answer["configurations"][c] for c in ("current", "proposed"))
    out.append(f"{'team':<16}{'jobs':>6}  {'wait p50 min':>17}  {'wait p95 min':>17}  {'completion p95 h':>17}"
               f"  {'GPU-hours':>19}  {'preempted':>11}  {'waiting':>9}")
    for team, a in now["teams"].items():
        b = then["teams"][team]
        out.append(f"{team:<16}{a['jobs']:>6}  "
                   f"{_minutes(a['wait_p50_minutes']):>7} -> {_minutes(b['wait_p50_minutes']):>7}  "
                   f"{_minutes(a['wait_p95_minutes']):>7} -> {_minutes(b['wait_p95_minutes']):>7}  "
                   f"{_minutes(a['completion_p95_hours']):>7} -> {_minutes(b['completion_p95_hours']):>7}  "
                   f"{a['gpu_hours']:>8,.0f} -> {b['gpu_hours']:>8,.0f}  {a['preemptions']:>4} -> {b['preemptions']:>4}"
                   f"  {a['still_waiting']:>2} -> {b['still_waiting']:>2}")
    util = [f"{c}: {'-' if u is None else f'{u:.0%}'}" for c, u in
            (("current", now["utilisation"]), ("proposed", then["utilisation"]))]
    out.append("GPU utilisation (served / present, in the window): " + ", ".join(util))
    out.append("waits above: submission to first start, replayed until the queue drains (past the window's end); "
               "the backtest below cuts every wait at the window's end, as the record can only show it")
    out += [f"assumed: {n['jobs']} jobs {n['meaning']}" for n in answer["assumptions"]]
    out += backtest_text(answer.get("backtest"))
    out += [f"note: {n}" for n in answer["notes"]]
    return "\n".join(out)


def backtest_text(tested: dict | None) -> list[str]:
    """The backtest's lines: each team's p95 wait measured against replayed under the quotas in force."""
    if not tested:
        return ["backtest: none (no replay of the quotas in force)"]
    tol = tested["tolerance"]
    out = [f"backtest ({'calibrated' if tested['calibrated'] else 'NOT calibrated'}): the quotas in force replayed "
           f"against the record, p95 wait within max({tol['minutes']:g} min, {tol['fraction']:.0%}) for teams with "
           f"{tol['min_jobs']:g}+ jobs"]
    for row in tested["teams"]:
        p95 = row["wait_p95_minutes"]
        verdict = ("ok" if row.get("within_tolerance") else "OFF") if row["judged"] else "not judged (few jobs)"
        out.append(f"  backtest {row['team']:<16}{row['jobs']['measured']:>6} jobs  p95 wait (min) measured "
                   f"{_minutes(p95['measured']):>7} replayed {_minutes(p95['replayed']):>7}  {verdict}")
    return out


def placement_text(answer: dict) -> str:
    """POST /v1/whatif/placement's answer as a table per placer."""
    out = [f"placement what-if: {answer['start']:%Y-%m-%d %H:%M} .. {answer['end']:%Y-%m-%d %H:%M} UTC, "
           f"{answer['jobs']} jobs on {answer['nodes']} nodes ({answer['gpus']} GPUs), from empty",
           f"{'placer':<17}{'allocated':>10}{'fragmented':>11}{'stranded GPU-h':>15}{'stranded $':>12}"
           f"{'wait p50':>9}{'wait p95':>9}{'gangs earlier':>14}{'split':>13}{'seconds':>8}"]
    for p in answer["placers"]:
        usd = "-" if p["stranded_usd"] is None else f"{p['stranded_usd']:,.0f}"
        name = p["policy"] + (" +islands" if p["kept_within_islands"] else "")
        split = "-" if p["split_tasks"] is None else f"{p['split_tasks']} of {p['multi_gpu_tasks']}"
        out.append(f"{name:<17}{p['allocated_share']:>10.1%}{p['fragmented_share']:>11.1%}"
                   f"{p['stranded_gpu_hours']:>15,.0f}{usd:>12}{_minutes(p['wait_p50_minutes']):>9}"
                   f"{_minutes(p['wait_p95_minutes']):>9}{p['gang_jobs_started_earlier']:>7} of {p['gang_jobs']:<4}"
                   f"{split:>13}{p['seconds']:>8.2f}")
    out += [f"assumed: {n['jobs']} jobs {n['meaning']}" for n in answer["assumptions"]]
    out += [f"note: {n}" for n in answer["notes"]]
    return "\n".join(out)


def cmd_whatif(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.policies.recommender import evaluate
    from gpuledger.policies.whatif import default_window, run_whatif
    from gpuledger.policies.whatif.placement import placement_whatif
    start, end = default_window(config, args.end or utc_now(), args.days)
    placers = [p.strip() for p in args.placers.split(",") if p.strip()] if args.placers else []
    if args.server:  # POST /v1/whatif (or /placement): the server replays its store; the same answer, printed alike
        window = {"start": start.isoformat(), "end": end.isoformat()}
        question = ({**window, "placers": placers} if placers else
                    {**window, **({"model": args.model} if args.model else {}), "edits": _edits(args),
                     "use_recommendations": args.recommendations, "capacity": _capacity(args.capacity) or {}})
        answer = _instants(_server(args).call("POST", "/v1/whatif/placement" if placers else "/v1/whatif",
                                              json=question, timeout=600))
    else:
        with _open_existing(args, config) as store:
            _require_data(store, args.db)
            if placers:
                answer = placement_whatif(store, start, end, placers)
            else:
                answer = run_whatif(store, config, start, end, args.model, _edits(args), args.recommendations,
                                    _capacity(args.capacity), advise=evaluate).to_dict()
    if args.json:
        json.dump(json_safe(answer), sys.stdout, indent=1, allow_nan=False)
        print()
    else:
        print(placement_text(answer) if placers else whatif_text(answer))
    return 0


def _figure(value: float | None, digits: int = 1) -> str:
    """A number of the capacity review, or '-' where it is unknown (never 0)."""
    return "-" if value is None else f"{value:,.{digits}f}"


def _saturation_text(model: dict) -> str:
    """Weeks to saturation and their 80% range, in words."""
    weeks, low, high = (model[k] for k in ("weeks_to_saturation", "weeks_to_saturation_80_low",
                                           "weeks_to_saturation_80_high"))
    if model["status"] == "insufficient_data":
        return f"unknown: {model['reason']}"
    if model["status"] == "saturated":
        return "0: already saturated (the trend's demand is at or over capacity now)"
    if weeks is None:
        top = f"; at the top of the 80% range of growth it would in {low:,.1f} weeks" if low is not None else ""
        return f"none: not saturating at the current trend (flat or falling){top}"
    around = f", around {model['saturates_around']:%Y-%m-%d}" if model["saturates_around"] is not None else ""
    return f"saturates in {weeks:,.1f} weeks (80%: {low:,.1f} .. {'never' if high is None else f'{high:,.1f}'}){around}"


def capacity_text(answer: dict) -> str:
    """GET /v1/capacity/forecast's answer as the capacity review: per model its capacity, weekly demand, trend and
    weeks to saturation."""
    out = [f"capacity review: {answer['weeks']} weeks, {answer['start']:%Y-%m-%d %H:%M} .. "
           f"{answer['end']:%Y-%m-%d %H:%M} UTC. A week is fitted when samples cover {answer['min_coverage']:.0%} of "
           f"its hours; a trend needs {answer['min_weeks']}. Busy: allocated at or over {answer['idle_util_pct']:g}% "
           "utilisation; queued: GPUs x time waited."]
    if not answer["models"]:
        out.append("no GPU present at the window's end: nothing to forecast")
    for m in answer["models"]:
        out += ["", f"{m['gpu_model']}: {m['gpus']:g} GPUs, capacity {m['capacity_gpu_hours_per_week']:,.0f} "
                    f"GPU-hours a week; demand = {m['basis']}"]
        if m["basis_reason"]:
            out.append(f"  basis: {m['basis_reason']}")
        out.append(f"  {'week of':<18}{'hours':>6}{'allocated':>11}{'busy':>10}{'queued':>10}{'demand':>10}")
        for w in m["weeks"]:
            shown = "" if w["fitted"] else ("  partial: not fitted" if w["covered_hours"] else "  no samples")
            out.append(f"  {w['week_start']:%Y-%m-%d %H:%M}  {w['covered_hours']:>6.0f}"
                       f"{_figure(w['allocated_gpu_hours']):>11}{_figure(w['busy_gpu_hours']):>10}"
                       f"{_figure(w['queued_gpu_hours']):>10}{_figure(w['demand_gpu_hours']):>10}{shown}")
        if m["growth_gpu_hours_per_week"] is not None:
            out.append(f"  trend: {m['demand_now_gpu_hours_per_week']:,.0f} GPU-hours a week now "
                       f"({m['utilisation_now']:.0%} of capacity), growing {m['growth_gpu_hours_per_week']:+,.1f} "
                       f"+/- {m['growth_stderr']:,.1f} a week each week (80%: {m['growth_80_low']:+,.1f} .. "
                       f"{m['growth_80_high']:+,.1f})")
        out.append(f"  status: {m['status']}; weeks to saturation: {_saturation_text(m)}")
    out += [""] + [f"note: {n}" for n in answer["notes"]] if answer["notes"] else []
    return "\n".join(out)


def cmd_capacity(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.analytics.forecast import demand_forecast, forecast_window
    from gpuledger.analytics.records import rounded
    end = args.end or utc_now()
    forecast_window(end, args.weeks)  # a bad --weeks is refused before the database is opened
    if args.server:  # GET /v1/capacity/forecast: the same answer, from the server that holds the file
        shown = _server(args).call("GET", "/v1/capacity/forecast", params={"weeks": args.weeks,
                                                                           "end": end.isoformat()}, timeout=600)
        answer = _instants(shown)
    else:
        with _open_existing(args, config) as store:
            _require_data(store, args.db)
            answer = demand_forecast(store, end, args.weeks, config.waste.idle_util_pct)
        from gpuledger.deploy.api.models import CapacityForecast
        # as the API answers it (its model's JSON, rounded): the two paths print the same
        shown = rounded(CapacityForecast.model_validate(json_safe(answer)).model_dump(mode="json"))
    if args.json:
        json.dump(shown, sys.stdout, indent=1, allow_nan=False)
        print()
    else:
        print(capacity_text(answer))
    return 0


def cmd_emit(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.policies.exporting import Export, export
    if args.server:  # GET /v1/recommendations/export: the plan the server makes, written as the file path writes it
        if args.current is not None:
            raise InputError("emit --current compares on this machine's file: with --server, save the plan and diff "
                             "it against the objects in force, or run emit --current on a stopped server's --db")
        params = {"target": args.target, "status": args.status, "fill": str(args.fill).lower()}
        server = _server(args)
        native, objects = (server.call("GET", "/v1/recommendations/export", params={**params, "format": fmt},
                                       text=True, timeout=600) for fmt in ("native", "json"))
        files = Export(args.target, native, objects, "")
        return _write_plan(args, files)
    current = None
    if args.current is not None:
        try:
            current = args.current.read_text()
        except OSError as exc:
            raise InputError(f"cannot read --current {args.current}: {exc}") from exc
    with _open_existing(args, config) as store:
        _require_data(store, args.db)
        files = export(store, config, args.target, args.status, current, fill=args.fill)
    return _write_plan(args, files)


def _write_plan(args: argparse.Namespace, files: Any) -> int:
    """The plan on stdout in --format, or its files into --out."""
    if args.out is None:
        sys.stdout.write(files[args.format])
        return 0
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, text in files.named().items():
            (args.out / name).write_text(text)
            print(f"{args.target}: {args.out / name}")
    except OSError as exc:
        raise InputError(f"cannot write into {args.out}: {exc.strerror or exc}") from exc
    return 0


def cmd_decide(args: argparse.Namespace, config: Config) -> int:
    if args.server:  # through the running server: the same decision, audited there under the token's name
        body = {"decision": args.decision, "by": args.by, **({"note": args.note} if args.note else {})}
        rec = _server(args).call("POST", f"/v1/recommendations/{args.id}/decision", json=body)
    else:
        from gpuledger.deploy.token_admin import local_audit
        from gpuledger.policies.recommender import decide, evaluate
        with _open_existing(args, config) as store:
            with local_audit(store, "decide", args.id, {"recommendation": args.id, "decision": args.decision,
                                                        "by": args.by, "note": args.note}) as audit:
                rec = decide(store, args.id, args.decision, args.by, args.note, audit=audit,
                             shown=lambda: evaluate(store, config).insufficient()).to_dict()
    print(f"{rec['id']}: {rec['status']} by {rec['decided_by']} ({rec['kind']} {rec['team']} "
          f"{rec['gpu_model'] or ''}): {rec['reason']}")
    return 0


def cmd_import(args: argparse.Namespace, config: Config) -> int:
    if getattr(args, "server", None):
        return _import_through(args)
    if args.trace in JOB_FORMATS:
        return _import_jobs(args, config)
    if args.trace in QUEUE_FORMATS:
        return _import_queues(args, config)
    from gpuledger.deploy.trace_import import default_path, import_trace
    path = Path(args.path) if args.path else default_path(args.trace)
    if not path.exists():  # before the database is created: a wrong path leaves no empty file
        raise InputError(f"{path} not found: give the {args.trace} trace's folder")
    with _open_store(args, config) as store:
        counts = import_trace(store, args.trace, path, args.days, echo=lambda line: print(line, flush=True))
    print(f"imported {args.trace}: {counts['samples']:,} samples, {counts['jobs']:,} jobs, "
          f"{counts['fragmentation_readings']:,} fragmentation readings into {args.db}")
    return 0


def _read_input(args: argparse.Namespace) -> str:
    """The text of the file an import names, or of standard input for `-`."""
    if not args.path:
        raise InputError(f"give the file of {args.trace}'s output, or - to read it from standard input")
    if args.path == "-":
        return sys.stdin.read()
    _check_input(args)
    return Path(args.path).read_text(errors="replace")


def _check_input(args: argparse.Namespace) -> None:
    """An import's FILE, refused with the reason when it is missing, a folder or not a file."""
    if not args.path:
        raise InputError(f"give the file of {args.trace}'s output, or - to read it from standard input")
    path = Path(args.path)
    if path.is_dir():
        raise InputError(f"{path} is a folder: give the file of {args.trace}'s output, or - for standard input")
    if not path.is_file():
        raise InputError(f"{path} not found: give the file of {args.trace}'s output, or - for standard input")


def _import_through(args: argparse.Namespace) -> int:
    """`import FORMAT FILE --server URL`: the input pushed to a running server's POST /v1/jobs, its summary printed
    as the file path prints it; the server keeps collecting meanwhile."""
    from gpuledger.deploy.api.limits import JOBS_BODY_BYTES
    from gpuledger.deploy.token_admin import RemoteAdmin
    if not args.token:
        raise InputError("import --server needs an admin --token (or $GPULEDGER_TOKEN)")
    text = _read_input(args)
    if len(text.encode()) > JOBS_BODY_BYTES:
        raise InputError(f"{args.path} is over the {JOBS_BODY_BYTES // 2**20} MiB a server takes in one push: "
                         "split it (sacct -S/-E windows), or import it into a stopped server's --db")
    params = {k: v for k, v in {"format": args.trace, "fields": args.fields, "timezone": args.timezone,
                                "team_field": args.team_field, "team_label": args.team_label,
                                "class_label": args.class_label}.items() if v is not None}
    if args.trace in QUEUE_FORMATS:
        params = {"format": args.trace}
    elif args.trace != "kube-state":
        params.pop("team_label", None), params.pop("class_label", None)
    answer = RemoteAdmin(args.server, args.token, args.ca).call(
        "POST", "/v1/jobs", params=params, data=text.encode(), headers={"Content-Type": "text/plain; charset=utf-8"},
        timeout=600)
    print("\n".join(line.replace("the server's store", args.server) for line in answer["summary"]))
    return 0


def _import_options(args: argparse.Namespace) -> Any:
    from gpuledger.deploy.job_import import ImportOptions
    return ImportOptions(fields=args.fields.split(",") if args.fields else None, timezone=args.timezone,
                         team_field=args.team_field, team_label=args.team_label, class_label=args.class_label)


def _import_queues(args: argparse.Namespace, config: Config) -> int:
    """`import kueue|kai|sacctmgr FILE|-`: the queue state a Kueue controller's or KAI's /metrics page shows, or
    Slurm's association limits, taken now (deploy/job_import.py)."""
    from gpuledger.deploy.job_import import queue_batch, store_queues
    batch = queue_batch(args.trace, _read_input(args), args.path)
    with _open_store(args, config) as store:
        result = store_queues(store, args.trace, batch)
    print("\n".join(result.lines(args.db)))
    return 0


def _import_jobs(args: argparse.Namespace, config: Config) -> int:
    """`import sacct|squeue|kube-state FILE|-`: the GPU jobs of Slurm's job history or queue, or of a
    kube-state-metrics page, with what was skipped and why (deploy/job_import.py)."""
    from gpuledger.deploy.job_import import job_batches, store_jobs
    batches = job_batches(args.trace, _input_lines(args), _import_options(args), args.path)
    with _open_store(args, config) as store:
        result = store_jobs(store, args.trace, batches, args.path,
                            progress=lambda n: print(f"... {n:,} GPU jobs stored so far", file=sys.stderr,
                                                     flush=True))
    print("\n".join(result.lines(args.db)))
    return 0


def _input_lines(args: argparse.Namespace) -> Iterator[str]:
    """The lines of the file an import names, or of standard input for `-`, read as they are used."""
    if args.path == "-":
        yield from sys.stdin
        return
    _check_input(args)
    with open(args.path, errors="replace") as handle:
        yield from handle


def cmd_replay(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.policies.openb_placement import load_nodes, load_tasks
    from gpuledger.policies.replay import replay
    nodes, tasks = load_nodes(args.data), load_tasks(args.data, args.variant)
    print(f"openb/{args.variant}: {len(nodes.names):,} nodes, {int(nodes.gpu_count.sum()):,} GPUs, {len(tasks):,} "
          f"tasks; policy {args.policy}, seed {args.seed}, inflated to {args.inflation:.0%} of GPU capacity",
          file=sys.stderr, flush=True)

    shown = [-1]
    live = sys.stderr.isatty()

    def bar(done: int, total: int) -> None:  # a bar on a terminal, a line per 10% in a log
        pct = 100 * done // total
        if pct == shown[0] or (not live and pct % 10 and done < total):
            return
        shown[0] = pct
        filled = 40 * done // total
        print(f"{chr(13) if live else ''}[{'#' * filled}{'.' * (40 - filled)}] {pct:3d}% {done:,}/{total:,} tasks",
              end="" if live else "\n", file=sys.stderr, flush=True)
    result = replay(nodes, tasks, args.policy, seed=args.seed, inflation=args.inflation, progress=bar)
    if live:
        print(file=sys.stderr)
    at80 = result.at(80)
    if args.json:
        print(json.dumps({"trace": f"openb/{args.variant}", "policy": args.policy, "seed": args.seed,
                          "inflation": args.inflation, "tasks": result.tasks, "placed": result.placed,
                          "capacity_gpus": result.capacity_gpus, "seconds": round(result.seconds, 2),
                          "final_allocation_pct": round(result.final_allocation_pct, 2),
                          "fragmentation_at_80_pct": round(at80[1], 2) if at80 else None,
                          "steps": result.table()}, indent=2))
        return 0
    print(f"{'arrived':>8} {'allocated':>10} {'fragmented':>11}   (% of {result.capacity_gpus:,.0f} GPUs)")
    for row in result.table():
        print(f"{row['arrived_pct']:>7}% {row['allocated_pct']:>9.2f}% {row['fragmentation_pct']:>10.2f}%")
    print(f"placed {result.placed:,} of {result.tasks:,} tasks in {result.seconds:.1f} s")
    frag80 = f"{at80[1]:.2f}%" if at80 else "n/a"
    print(f"final allocation {result.final_allocation_pct:.2f}% fragmentation@80% {frag80}")
    return 0


def cmd_compact(args: argparse.Namespace, config: Config) -> int:
    """Fold, optionally rebuild, and apply retention, printing progress and what was dropped; with --server, the
    running server does it (POST /v1/admin/compact) and this prints its figures."""
    from gpuledger.deploy.compaction import compact, summary
    if args.server:
        print("asking the server to compact (rebuilding the rollups first)..." if args.rebuild
              else "asking the server to compact...", flush=True)
        done = _instants(_server(args).call("POST", "/v1/admin/compact", json={"rebuild": args.rebuild},
                                            timeout=3600))
    else:
        with _open_existing(args, config) as store:
            def progress(done: datetime, until: datetime) -> None:
                print(f"  folded up to {done:%Y-%m-%d %H:%M} UTC (until {until:%Y-%m-%d %H:%M})", flush=True)

            done = compact(store, args.rebuild, progress, note=lambda line: print(line, flush=True))
    print("\n".join(summary(done)))
    return 0


def cmd_collect(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.deploy.collect_loop import CollectLoop
    source = _make_source(args, config)
    first = source.collect()  # before the database is created: an unreachable exporter leaves no empty file
    with _open_store(args, config) as store:
        loop = CollectLoop(source, store, args.interval)
        for i in range(args.count):
            rows = loop.collect_once(first if i == 0 else None)
            print(f"read {i + 1}/{args.count}: {rows} sample(s) from {source.name} -> {args.db}")
            if i + 1 < args.count:
                loop.stop_event.wait(args.interval)
    return 0


def cmd_serve(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.analytics.store.access import list_tokens
    from gpuledger.analytics.store.ingest_writer import use_cross_thread_allocator
    from gpuledger.deploy.demo import with_demo_slos
    from gpuledger.deploy.ports import require_free
    from gpuledger.deploy.server import ApiServer, Serving
    if args.read_only:
        return _serve_read_only(args, config)
    require_free(args.host, args.port, "--port")  # before the store is opened and the backlog folded
    source = _make_source(args, config)
    unable = _unable_to_collect(source)
    if unable:
        source = None
    tls = _tls(args)
    use_cross_thread_allocator()  # this process decodes agents' bodies in one thread and frees them in another
    if not args.create and not is_lake(args.db) and not Path(args.db).exists():
        raise InputError(f"no database at {args.db}: check the path, or add --create to start a new, empty one")
    store = _open_store(args, config)
    config = with_demo_slos(store, config)  # a demo's file served again judges its services as the demo did
    if source is not None and source.source_name:  # a source reading history resumes after what it stored
        source.resume_after(store.latest_ts_of(source.source_name))
    api = ApiServer(store, config, host=args.host, port=args.port, token=args.token, open_reads=args.open_reads,
                    trusted_proxies=args.trusted_proxy, limits=_connection_limits(args),
                    tls=tls)
    jobs = _job_loop(args, store)
    serving = Serving(store, config, api, args.reports, source, args.interval, jobs=jobs,
                      apps=_app_loop(args, config, store))
    url = serving.url
    what = f"collecting from {source.name} every {args.interval:g}s" if source else "collecting nothing itself"
    pushes = "reads open to all" if args.open_reads else "reads need a token"
    print(f"serving {url} (docs {url}/docs), {what}, {pushes}, into {args.db}; Ctrl-C to stop", flush=True)
    if unable:
        print(unable, flush=True)
    if not args.token and list_tokens(store).empty:
        nobody = "nobody can push (agents) or use the admin routes" if args.open_reads else \
            "nobody can push or read"
        print(f"no API tokens yet, so {nobody}: stop the server and run `gpuledger token create "
              f"--role admin --db {args.db}`, or start it with --token (a bootstrap admin token)", flush=True)
    wait_for_stop()
    serving.stop()
    return 0


def _unable_to_collect(source: Source | None) -> str | None:
    """Why `serve`'s NVML source cannot collect on this machine (no driver, no GPU), in words with what to pass
    instead; None where it can (or another source was asked for: those report failures as they read)."""
    from gpuledger.collector.nvml_source import NvmlSource
    from gpuledger.collector.source import SourceError
    if not isinstance(source, NvmlSource):
        return None
    try:
        source.check()
    except SourceError as exc:
        return (f"not collecting: {exc} (no NVIDIA driver or GPU on this machine). Serving the API for agents "
                "and reads only; to collect, pass --source dcgm --dcgm-url URL, --source prometheus "
                "--prometheus-url URL, or --source simulator; --source none says this on purpose")
    return None


def _job_loop(args: argparse.Namespace, store: Store) -> Any:
    """The loop reading job lifecycle and queues (`--jobs-from prometheus|slurm`), or None."""
    if args.jobs_from == "none":
        return None
    from gpuledger.deploy.job_loop import JobLoop
    if args.jobs_from == "slurm":
        from gpuledger.collector.jobs.slurm_commands import SlurmLifecycle
        return JobLoop(SlurmLifecycle(since=args.since), store, args.jobs_interval)
    from gpuledger.collector.jobs.prometheus_jobs import PrometheusLifecycle
    return JobLoop(PrometheusLifecycle(args.prometheus_url, args.team_label, since=args.since,
                                       class_label=args.class_label), store, args.jobs_interval)


def _app_loop(args: argparse.Namespace, config: Config, store: Store) -> Any:
    """The loop reading inference servers' metrics (`--apps-from`), or None when there is nothing to read."""
    from gpuledger.deploy.app_loop import AppLoop
    if args.apps_from == "prometheus":
        from gpuledger.collector.apps.prometheus_apps import PrometheusApps
        source: Any = PrometheusApps(args.prometheus_url, since=min(args.since, timedelta(hours=6)))
    elif args.apps_from == "config" and config.apps.targets:
        from gpuledger.collector.apps.targets import TargetsSource
        source = TargetsSource(config.apps.targets)
    else:
        return None
    return AppLoop(source, store, config.attributor(), config.apps.interval_s, config.apps.aliases,
                   config.apps.triton_ensembles)


def _connection_limits(args: argparse.Namespace) -> Any:
    """The serve flags that bound what one client's connections may hold of the server (a ConnectionLimits)."""
    from gpuledger.deploy.connections import ConnectionLimits
    if args.max_connections_per_client < 0 or args.head_timeout <= 0 or args.body_timeout <= 0:
        raise InputError("--max-connections-per-client must be 0 or more, --head-timeout and --body-timeout above 0")
    return ConnectionLimits(per_client=args.max_connections_per_client, head_timeout_s=args.head_timeout,
                            body_timeout_s=args.body_timeout)


def _tls(args: argparse.Namespace) -> tuple[Path, Path] | None:
    """(certificate, key) when both are given and readable; neither: plain HTTP."""
    if bool(args.tls_cert) != bool(args.tls_key):
        raise InputError("HTTPS needs both --tls-cert and --tls-key")
    if not args.tls_cert:
        return None
    for path in (args.tls_cert, args.tls_key):
        if not path.is_file():
            raise InputError(f"cannot read {path}")
    return args.tls_cert, args.tls_key


def _serve_read_only(args: argparse.Namespace, config: Config) -> int:
    """An API replica over a DuckLake catalog another server writes: answers reads, collects and stores nothing."""
    from gpuledger.deploy.server import ApiServer
    if not is_lake(args.db):
        raise InputError("--read-only serves a DuckLake catalog (--db ducklake:postgres:...) that another server "
                         "writes; a DuckDB file has one process only")
    if args.token:
        raise InputError("a --read-only replica accepts no pushes: drop --token and point agents at the writer")
    store = _store(args, read_only=True)
    api = ApiServer(store, config, host=args.host, port=args.port, open_reads=args.open_reads, tls=_tls(args))
    url = api.start()
    print(f"serving {url} (docs {url}/docs) read-only from {args.db}; Ctrl-C to stop", flush=True)
    wait_for_stop()
    api.stop()
    store.close()
    return 0


def cmd_agent(args: argparse.Namespace, config: Config) -> int:
    from prometheus_client import start_http_server

    from gpuledger.collector.agent.agent import Agent
    from gpuledger.collector.agent.metrics import REGISTRY as AGENT_METRICS
    from gpuledger.collector.agent.spool import Spool
    from gpuledger.collector.metrics import REGISTRY as COLLECTOR_METRICS
    from gpuledger.collector.metrics import exported
    if args.token_file:
        try:
            args.token = args.token_file.read_text().strip()
        except OSError as exc:
            raise InputError(f"cannot read --token-file: {exc}") from exc
    if not args.token:
        raise InputError("the agent needs an agent:<node> token: --token, --token-file or $GPULEDGER_TOKEN "
                         "(make one with `gpuledger token create --role agent:NODE`)")
    source = _make_source(args, config)
    spool = Spool(args.spool, int(args.spool_max_mb * 1024 * 1024))
    if args.ca and not args.ca.is_file():
        raise InputError(f"cannot read --ca {args.ca}")
    agent = Agent(source, spool, args.server, args.token, args.node, args.interval, ca=args.ca)
    if args.metrics_port:
        start_http_server(args.metrics_port, addr="127.0.0.1", registry=exported(COLLECTOR_METRICS, AGENT_METRICS))
    agent.start()
    print(f"agent {args.node}: {source.name} every {args.interval:g}s -> {args.server}, spool {args.spool} "
          f"(stream {spool.stream_id[:8]}, next seq {spool.next_seq}, {len(spool.pending())} waiting)", flush=True)
    wait_for_stop(args.duration)
    agent.stop()
    print(f"agent {args.node}: stopped; {agent.produced} batch(es) produced, {agent.acked} acknowledged, "
          f"{len(spool.pending())} left in the spool, next seq {spool.next_seq}", flush=True)
    return 0


def _server_access(args: argparse.Namespace) -> tuple[str, str, str | None]:
    """(URL, admin token, CA file) of the running server a token, audit, backup or decide command asks."""
    if not args.token:
        raise InputError("--server needs an admin --token (or $GPULEDGER_TOKEN)")
    return args.server, args.token, str(args.ca) if args.ca else None


@contextmanager
def _token_admin(args: argparse.Namespace) -> Iterator[Any]:
    """Where tokens and the audit log are: the running --server, else the --db file (closed afterwards)."""
    from gpuledger.deploy.token_admin import LocalAdmin, RemoteAdmin
    if args.server:
        yield RemoteAdmin(*_server_access(args))
        return
    try:
        store = _store(args)
    except StoreError as exc:
        raise StoreError(f"{exc}; while a server runs, pass --server URL and an admin --token") from exc
    with store:
        yield LocalAdmin(store)


def cmd_token(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.deploy.token_admin import run_token
    if args.action == "create" and not args.role:
        raise InputError("token create needs --role (admin, reader, team:<team> or agent:<node>)")
    if args.action == "revoke" and not args.id:
        raise InputError("token revoke needs the token's id (see `gpuledger token list`)")
    # what each action reads: a flag of another action was ignored (`token list --role admin` listed every token)
    takes = {"create": {"role", "name", "expires"}, "list": {"revoked", "json"}, "revoke": {"id"}}[args.action]
    given = {"role": args.role, "name": args.name, "revoked": args.revoked, "json": args.json, "id": args.id,
             "expires": args.expires}
    stray = sorted(k for k, v in given.items() if v and k not in takes)
    if stray:
        raise InputError(f"token {args.action} does not take {', '.join('--' + s if s != 'id' else 'an id' for s in stray)}"
                         f" (it takes {', '.join('--' + t if t != 'id' else 'an id' for t in sorted(takes))})")
    with _token_admin(args) as admin:
        return run_token(admin, args.action, args.name, args.role, args.id, args.revoked, args.json,
                         note=lambda text: print(text, file=sys.stderr), expires_in=args.expires)


def cmd_audit(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.deploy.token_admin import run_audit
    with _token_admin(args) as admin:
        return run_audit(admin, args.since, args.limit, args.json)


def cmd_backup(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.deploy.backups import backup_local, backup_remote, describe
    if args.server:
        print(f"backing up {args.server} into {args.dir}", file=sys.stderr)
        target, manifest = backup_remote(*_server_access(args), args.dir,
                                         echo=lambda text: print(text, file=sys.stderr))
    else:
        store = _open_existing(args, config)
        try:
            target, manifest = backup_local(store, args.dir)
        finally:
            store.close()
    print(describe(target, manifest))
    return 0


def cmd_restore(args: argparse.Namespace, config: Config) -> int:
    from gpuledger.analytics.store.access import AuditFiles
    from gpuledger.analytics.store.backup import restore, verify
    from gpuledger.deploy.backups import describe
    from gpuledger.deploy.token_admin import local_entry
    if is_lake(args.db):
        raise InputError("restore writes a DuckDB file; a DuckLake catalog is restored by PostgreSQL's own tools")
    files = AuditFiles.of(args.db)  # the site's key (beside --db, or $GPULEDGER_AUDIT_KEY_FILE) signs its backups
    if args.check:
        print("ok: " + describe(args.backup, verify(args.backup, files)))
        return 0
    done = restore(args.backup, args.db, args.force, files, local_entry("restore", str(args.db)))
    print(f"restored {args.db} from " + describe(args.backup, done.manifest)
          + (f"; upgraded from schema {done.upgraded_from}" if done.upgraded_from else "")
          + (f"; the database it replaced is kept as {done.kept}" if done.kept else ""))
    return 0


def cmd_scrape(args: argparse.Namespace, config: Config) -> int:
    """`scrape URL|FILE|-`: what gpuledger would store from one /metrics page; 1 when nothing was recognised."""
    from gpuledger.collector.page_check import check_page, fetch_page, summary
    # the config's aliases and Triton ensembles apply, so a name taught there is checked as the server reads it
    answer = check_page(fetch_page(args.source, args.timeout), aliases=config.apps.aliases,
                        ensembles=config.apps.triton_ensembles)  # an unreadable page: InputError, exit 2
    if args.json:
        json.dump(answer, sys.stdout, indent=1, allow_nan=False)
        print()
    else:
        print("\n".join(summary(answer, args.source)))
    return 0 if answer["kind"] else 1


COMMANDS: dict[str, Callable[[argparse.Namespace, Config], int]] = {
    "demo": cmd_demo, "serve": cmd_serve, "agent": cmd_agent, "collect": cmd_collect,
    "report": cmd_report, "recommend": cmd_recommend, "decide": cmd_decide, "emit": cmd_emit,
    "compact": cmd_compact, "replay": cmd_replay, "import": cmd_import, "token": cmd_token, "audit": cmd_audit,
    "backup": cmd_backup, "restore": cmd_restore, "scrape": cmd_scrape, "statement": cmd_statement,
    "export": cmd_export, "whatif": cmd_whatif, "capacity": cmd_capacity, "node": node_admin.cmd_node,
    "jobs-agent": jobs_agent.cmd_jobs_agent,
    "notes": lambda args, config: notes_command.cmd_notes(args, config, _open_existing, _server),
    "config": config_command.cmd_config,
}


if __name__ == "__main__":
    sys.exit(main())
