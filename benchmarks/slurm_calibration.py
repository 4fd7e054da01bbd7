"""Record the at-scale Slurm calibration on a real slurmctld and compare the Slurm-like replay with it (issue 39
item 3): the fixed workload of tests/slurm_workload.py runs on Debian's Slurm (tests/slurm_cluster.py: munge,
MariaDB, slurmdbd, slurmctld and a slurmd per GPU type, every port on 127.0.0.1), under the limits of the sacctmgr
script gpuledger emits, its `sacct -P` record is imported and replayed, and each team's mean and p95 wait is printed
beside the measured one. About three minutes; needs the packages .ci/run installs and root.

    python benchmarks/slurm_calibration.py [--save tests/data/slurm_scale_sacct.txt]

The waits are seconds long (time-compressed: seconds for hours), so a slurmctld starved of CPU moves them: record on
a machine with nothing else running. `--save` keeps the record; the test suite replays the saved one
(tests/test_slurm_scale.py) instead of timing a live scheduler on a loaded CI machine.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuledger.collector.jobs.sacct import parse_sacct  # noqa: E402
from gpuledger.policies.emitters import emitter_for  # noqa: E402
from tests.procs import wait_until  # noqa: E402
from tests.slurm_cluster import SlurmCluster, missing_programs  # noqa: E402
from tests.slurm_workload import (CAPACITY, ISSUE_BAR, JOB_NAME, PLAN, PRIME, SACCT_FIELDS, SCHEDULER,  # noqa: E402
                                  TEAMS, TYPES, calibrate, workload)


def _after_a_priority_calculation(cluster: SlurmCluster) -> None:
    """Return just after slurmctld recomputed the fair-share factors: a one-second job of the PRIME account runs,
    and its factor in sshare changes at the next calculation (usage is charged at a job's end, factors only each
    PriorityCalcPeriod). The workload then starts in phase with the model, which recomputes its factors at its first
    pass and every PriorityCalcPeriod after; out of phase, the factors of one or the other are up to a minute older,
    and on jobs of seconds that reorders whole queues (a real week's jobs run hours: there the phase is noise)."""
    def factor() -> list[str]:
        return cluster.run("sshare", "-h", "-P", "-A", PRIME, "-u", "root", "-o", "FairShare").stdout.split()[-1:]

    before = factor()
    cluster.run("sbatch", "-A", PRIME, "-p", TYPES["H100"], f"--gres=gpu:{TYPES['H100']}:1", "-c", "1", "--time=1",
                "-o", "/dev/null", "--parsable", "-J", "prime", "--wrap", "sleep 1")
    wait_until(lambda: factor() != before, 150, "slurmctld to recompute the fair-share factors", step_s=0.2)
    wait_until(lambda: not cluster.run("squeue", "-h", "-o", "%i").stdout.strip(), 30, "the priming job to end",
               step_s=0.1)


def record(cluster: SlurmCluster) -> str:
    """Run the workload, each job at its time, and return sacct's record once every job is recorded completed."""
    planned = workload()
    _after_a_priority_calculation(cluster)
    began, ids = time.monotonic(), []
    for job in planned:
        time.sleep(max(0.0, began + job["at"] - time.monotonic()))
        kind = TYPES[job["model"]]
        # CPUs as many as GPUs: Slurm's fair share charges the billing TRES (CPUs here), the model GPU-seconds
        ids.append(cluster.run("sbatch", "-A", job["team"], "-p", kind, f"--gres=gpu:{kind}:{job['gpus']}",
                               "-c", str(job["gpus"]), "--time=1", "-o", "/dev/null", "--parsable", "-J", JOB_NAME,
                               "--wrap", f"sleep {job['sleep']}").stdout.strip())
        print(f"\rsubmitted {len(ids)}/{len(planned)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    wait_until(lambda: not cluster.run("squeue", "-h", "-o", "%i").stdout.strip(), 400, "the workload to drain",
               step_s=2)

    def recorded() -> str | None:
        text = subprocess.run(["sacct", "-aP", "-S", "now-1hour", "-o", SACCT_FIELDS], capture_output=True, text=True,
                              env=dict(cluster.env, TZ="UTC"), timeout=60, check=True).stdout
        states = parse_sacct(text).jobs.set_index("job_id")["state"]
        return text if all(states.get(f"slurm:{job}") == "completed" for job in ids) else None

    return wait_until(recorded, 60, "sacct to record every job completed", step_s=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", type=Path, help="write the sacct record here (the test suite replays "
                        "tests/data/slurm_scale_sacct.txt)")
    args = parser.parse_args()
    missing = missing_programs()
    if missing:
        print(f"a real Slurm needs Debian's slurmctld slurmd slurmdbd munge mariadb-server; missing: "
              f"{', '.join(missing)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        cluster = SlurmCluster(Path(folder) / "slurm", gpus={TYPES[m]: n for m, n in CAPACITY.items()}, cpus=8,
                               per_type=True, extra_conf=SCHEDULER)
        try:
            cluster.start()
            script = cluster.root / "plan.sh"
            script.write_text(emitter_for("slurm").emit(PLAN).text)
            cluster.run("sh", str(script))
            cluster.run("sacctmgr", "-i", "add", "account", PRIME)
            cluster.run("sacctmgr", "-i", "add", "user", "root", f"account={','.join([*TEAMS, PRIME])}")
            text = record(cluster)
        finally:
            cluster.stop()
        if args.save:
            args.save.write_text(text)
            print(f"saved the record to {args.save}", file=sys.stderr)
        result = calibrate(text, Path(folder))
    print(result.table())
    return 0 if result.worst <= ISSUE_BAR else 1


if __name__ == "__main__":
    sys.exit(main())
