"""`gpuledger jobs-agent`: Slurm's jobs, queue and association limits read on the host where its client commands
work (the controller, a login node) and sent to a gpuledger server elsewhere, read after read.

Why a sender: the server that owns the store often runs where sacct cannot (a Kubernetes pod, another network),
and a cron of `sacct | gpuledger import sacct - --server` re-reads a fixed window and never marks a job that left
the queue. The sender runs the same commands `serve --jobs-from slurm` runs (collector/jobs/slurm_commands.py) and
sends their output as printed to `POST /v1/jobs/slurm`, which stores it as that loop would. Its cursor moves only
once the server has stored a read: a read the server did not take (down, refusing) is sent again with its window
widened, so nothing is lost; a read stored twice changes nothing (a job read again replaces itself).
"""
from __future__ import annotations

import argparse
import logging
import sys
from datetime import timedelta
from typing import Any

from gpuledger.collector.errors import GpuledgerError, InputError
from gpuledger.collector.jobs.slurm_commands import SLURM_READ_PATH, SlurmLifecycle
from gpuledger.collector.source import SourceError
from gpuledger.deploy.cli_options import add_server, duration, positive
from gpuledger.deploy.collect_loop import PollingLoop
from gpuledger.deploy.lifecycle import wait_for_stop
from gpuledger.deploy.token_admin import RemoteAdmin

log = logging.getLogger(__name__)


class SlurmSender(PollingLoop):
    """Each interval: one read of Slurm's commands, sent; the cursor moves when the server answers it stored."""

    silence = "no Slurm read sent from"
    failing = "sending Slurm reads from"

    def __init__(self, source: SlurmLifecycle, server: RemoteAdmin, interval_s: float = 60.0) -> None:
        super().__init__("jobs-agent-slurm", "slurm", interval_s)
        self.source = source
        self.server = server
        self.sent = 0

    def send_once(self) -> dict[str, Any]:
        """One read sent and acknowledged: what the server stored. A refused or failed send raises SourceError and
        leaves the cursor where it was."""
        outputs = self.source.outputs()
        body = {"at": outputs.at.isoformat(), "squeue": outputs.squeue, "sacct": outputs.sacct,
                "sacctmgr": outputs.sacctmgr, "team_field": outputs.team_field}
        try:
            stored = self.server.call("POST", SLURM_READ_PATH, json=body, timeout=300)
        except GpuledgerError as exc:
            raise SourceError(str(exc)) from exc
        self.source.advance(outputs)
        self.sent += 1
        self.succeeded()
        if self.sent == 1 or any(stored.get(k) for k in ("jobs", "restarts", "queue_rows", "left_queue")):
            log.info("sent to %s: stored %s", self.server.server,
                     ", ".join(f"{stored[k]} {k.replace('_', ' ')}" for k in ("jobs", "restarts", "queue_rows",
                                                                             "left_queue")))
        return stored

    poll = send_once


def add_parser(sub: Any) -> None:
    """The `jobs-agent` command's arguments."""
    p = sub.add_parser("jobs-agent", help="read Slurm's jobs on this host (squeue, sacct, sacctmgr) and send them "
                                          "to a running server, read after read",
                       description="Run on a host where Slurm's client commands reach slurmctld and slurmdbd (the "
                                   "controller or a login node). Each --interval it runs squeue, sacct (jobs changed "
                                   "since its last stored read, less a 10-minute overlap) and sacctmgr, and sends "
                                   "their output to --server's POST /v1/jobs/slurm, which stores it as `serve "
                                   "--jobs-from slurm` would: waits, outcomes, requeues, queued demand and the "
                                   "association limits in force. A read the server did not store is sent again "
                                   "with a wider window; nothing is lost while the server is down.")
    p.add_argument("--jobs-from", choices=["slurm"], default="slurm", help="what to read (default slurm)")
    add_server(p, "the gpuledger server to send to (default $GPULEDGER_SERVER)",
               "an admin token (default $GPULEDGER_TOKEN)")
    p.add_argument("--interval", type=positive, default=60.0, help="seconds between reads (default 60)")
    p.add_argument("--since", type=duration, default=timedelta(days=1),
                   help="how far back sacct reads on the first read, e.g. 7d, 12h (default 1d); later reads go "
                        "from the last stored one")
    p.add_argument("--team-field", choices=["Account", "Partition", "QOS"], default="Account",
                   help="the Slurm field naming the team (default Account)")
    p.add_argument("--once", action="store_true", help="send one read and exit (exit code 1 when it failed)")
    p.add_argument("--duration", type=positive, help="stop after this many seconds (default: until SIGTERM)")


def cmd_jobs_agent(args: argparse.Namespace, config: Any) -> int:
    if not args.server:
        raise InputError("jobs-agent needs --server URL (or $GPULEDGER_SERVER): the gpuledger server to send to")
    if not args.token:
        raise InputError("jobs-agent needs an admin --token (or $GPULEDGER_TOKEN): job records are site-wide")
    server = RemoteAdmin(args.server, args.token, str(args.ca) if args.ca else None)
    sender = SlurmSender(SlurmLifecycle(since=args.since, team_field=args.team_field), server, args.interval)
    if args.once:
        try:
            stored = sender.send_once()
        except SourceError as exc:
            print(f"gpuledger jobs-agent: error: {exc}", file=sys.stderr)
            return 1
        print(f"sent one Slurm read to {args.server}: stored {stored['jobs']} GPU jobs, {stored['queue_rows']} "
              f"limit figures, {stored['left_queue']} job(s) marked left_queue")
        return 0
    print(f"jobs-agent: reading Slurm every {args.interval:g}s, sending to {args.server}", flush=True)
    sender.start()
    wait_for_stop(args.duration)
    sender.stop()
    sender.join(timeout=30)
    print(f"jobs-agent: stopped; {sender.sent} read(s) stored, {sender.failures} failed")
    return 0


__all__ = ["SlurmSender", "add_parser", "cmd_jobs_agent"]
