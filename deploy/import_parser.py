"""The `import` command's arguments: one sub-command per format, each with its own description and only the
options it reads, so `gpuledger import sacct --help` says how to take sacct's output and nothing about traces
or kube-state-metrics. The command itself runs in deploy/cli.py (`cmd_import`)."""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable

from gpuledger.collector.jobs import JOB_FORMATS, QUEUE_FORMATS
from gpuledger.collector.traces import TRACE_NAMES

FILE_HELP = "the file of its output, or - for standard input"
TRACES = {
    "openb": "Alibaba's GPU-sharing trace: QoS classes as teams, fractional GPUs billed in milli-GPU, pods placed "
             "with FGD as scheduled",
    "philly": "Microsoft's Philly trace: virtual clusters as teams",
    "helios": "SenseTime's Helios (Earth) trace: virtual clusters as teams, hourly allocation and quotas",
    "genai": "Alibaba's inference pods with their real per-minute GPU utilisation",
}
FORMATS = {
    "sacct": ("Slurm's job history from `sacct -P`",
              "Loads the GPU jobs of `sacct -P` output as they are: states, queue waits, GPUs and outcomes, with their "
              "events; a job read again replaces itself. Take it with e.g. `sacct -aP -S now-14days -o JobID,State,"
              "Submit,Eligible,Start,End,Account,User,Partition,QOS,NodeList,AllocTRES,ReqTRES,Reason,ExitCode,JobName`"
              " (plus Restarts where sacct has it). A header line, or the pasted `$ sacct ... -o ...` command above "
              "the table, names the fields; sacct's default fixed-width table is read where its cells are whole and "
              "refused by column where sacct cut them (`OUT_OF_ME+`: widen them with -o Field%N, or use -P)."),
    "squeue": ("what waits in Slurm now, from `squeue`",
               "Loads what waits now, with Slurm's reason, from `squeue -a -o \"%i|%T|%V|%a|%u|%P|%q|%b|%r|%j|%D|%S\"` "
               "(sacct shows a job held for a later begin time only once eligible). Jobs stored as waiting or "
               "running that are no longer in the queue are marked as having left it."),
    "kube-state": ("GPU pods of a kube-state-metrics page",
                   "Loads the GPU pods of a kube-state-metrics page (e.g. `curl -s http://kube-state-metrics:8080/"
                   "metrics`) as jobs: created, scheduled, started, completed, phase and reason, restarts, owner."),
    "kueue": ("a Kueue controller's queue state",
              "Stores the queue state a Kueue controller manager's /metrics page shows (quota in force, usage, waiting "
              "workloads), compared with gpuledger's plan at /v1/workloads/queues and used as the quotas in force by "
              "the what-if."),
    "kai": ("KAI's queue state",
            "Stores the queue state KAI's queue controller or scheduler /metrics page shows (quota, limit, usage, "
            "waiting workloads), compared with gpuledger's plan at /v1/workloads/queues and used as the quotas in "
            "force by the what-if."),
    "sacctmgr": ("Slurm's association limits and shares",
                 "Stores what Slurm runs as each account's GPU limit and share, from `sacctmgr -P show assoc format="
                 "Account,User,ParentName,Fairshare,GrpTRES` (with or without -n; any field order under sacctmgr's "
                 "header): GrpTRES gres/gpu[:type]=N per account as its limit per GPU type, Fairshare as its shares. "
                 "The what-if then replays a Slurm site under the limits in force (accounts named like teams, "
                 "types as the site's sacct names them); /v1/workloads/queues compares them with gpuledger's plan. "
                 "User associations are skipped."),
}


def add_parser(sub: Any, add_common: Callable[[argparse.ArgumentParser], None],
               positive: Callable[[str], float]) -> None:
    """`import FORMAT [PATH] [options]`: `add_common` gives each format --db and --config, `positive` checks
    --days (both from deploy/cli.py, which runs the command)."""
    imp = sub.add_parser(
        "import", help="load a public cluster trace, or a site's jobs (sacct, squeue, kube-state-metrics) or queues "
                       "(Kueue, KAI), into the store",
        description="Loads a public trace's history (../shared/traces), a site's jobs or its scheduler's queue "
                    "state into the store, so every analytic, the dashboard and the weekly report run on it. "
                    "`gpuledger import FORMAT --help` says what each format reads and how to take it.")
    imp.set_defaults(days=None, fields=None, timezone="UTC", team_field="Account", team_label=None, class_label=None)
    formats = imp.add_subparsers(dest="trace", required=True, metavar="FORMAT",
                                 title="formats (each has its own --help)")
    for name in TRACE_NAMES:
        trace = formats.add_parser(name, help=f"trace: {TRACES[name]}",
                                   description=f"Loads {TRACES[name]}. Times are moved so the trace ends now; the "
                                               "import says what the history is evidence of.")
        add_common(trace)
        trace.add_argument("path", nargs="?",
                           help=f"the trace's folder (default: ../shared/traces/{name} beside the checkout)")
        trace.add_argument("--days", type=positive,
                           help="only the trace's last N days (default: openb 7, the others all of it)")
    for name in JOB_FORMATS + QUEUE_FORMATS:
        short, long = FORMATS[name]
        kind = "jobs" if name in JOB_FORMATS else "queues"
        page = formats.add_parser(name, help=f"{kind}: {short}", description=long)
        add_common(page)
        page.add_argument("path", nargs="?", metavar="FILE", help=FILE_HELP)
        page.add_argument("--server", metavar="URL", default=os.environ.get("GPULEDGER_SERVER"),
                          help="push it to this running server (POST /v1/jobs) instead of opening --db: the server "
                               "keeps collecting (default $GPULEDGER_SERVER)")
        page.add_argument("--token", default=os.environ.get("GPULEDGER_TOKEN"),
                          help="with --server: an admin token (default $GPULEDGER_TOKEN)")
        page.add_argument("--ca", metavar="PEM", help="with an https:// --server: its CA certificate")
        if name in ("sacct", "squeue"):
            _slurm_options(page, name)
        if name == "kube-state":
            page.add_argument("--team-label", help="the pod label naming the team (default: the namespace)")
            page.add_argument("--class-label", help="the pod label or annotation naming the workload class "
                                                    "(training, fine_tuning, batch_inference, online_inference, "
                                                    "interactive, agentic, or a usual alias; default: from the "
                                                    "priority class, the pod's owner and name)")


def _slurm_options(page: argparse.ArgumentParser, name: str) -> None:
    """The options sacct and squeue share, and sacct's --fields."""
    if name == "sacct":
        page.add_argument("--fields", help="the -o field list of output taken with --noheader (comma separated, in "
                                           "its order); a header line or a pasted sacct command wins")
    page.add_argument("--timezone", default="UTC",
                      help="the time zone it printed its times in, its host's (default UTC)")
    page.add_argument("--team-field", default="Account", choices=["Account", "Partition", "QOS"],
                      help="the field that names the team (default Account, as sshare groups usage)")


__all__ = ["add_parser", "FORMATS", "TRACES"]
