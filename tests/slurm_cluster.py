"""A real one-host Slurm with accounting, for tests: munge, MariaDB, slurmdbd, slurmctld and slurmd, Debian's
packages, every port on 127.0.0.1, every file in a temporary folder, all stopped again at the end.

Two GPU types are configured (2 x `h100`, 1 x `l4`) on character devices that exist everywhere, so
GrpTRES limits on `gres/gpu:<type>` can be set and jobs can ask for GPUs without a GPU. A larger cluster (the
at-scale calibration, benchmarks/slurm_calibration.py) takes more such devices (DEVICE_FILES, up to six GPUs), more
CPUs than the host has (slurmd takes the configured ones: SlurmdParameters=config_overrides), a node (a slurmd of
its own, `slurmd -N`) and a partition per GPU type, and lines of slurm.conf of its own; the defaults write the
configuration above unchanged. Slurm's clients take
munge's default socket (they ignore AuthInfo for the accounting connection), so a munged already answering
there is used as it is; otherwise one is started on it with a key of its own. Several clusters may run at once
(a benchmark beside the suite, or test files on several pytest-xdist workers): each registers as a user of that munged
under a lock, and the munged the tests started stops only when its last user stops.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.procs import free_port, wait_until

PROGRAMS = ("munged", "munge", "unmunge", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd",
            "sacctmgr", "sshare", "sbatch", "sinfo", "scontrol")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
# beside the socket, not in one cluster's folder: shared by every cluster of every test process
MUNGE_LOCK = MUNGE_SOCKET.parent / "gpuledger-tests.lock"
MUNGE_USERS = MUNGE_SOCKET.parent / "gpuledger-tests.users"  # one file per running cluster, named <pid>-<id>
MUNGE_STARTED = MUNGE_SOCKET.parent / "gpuledger-tests.munged"  # the munged the tests started (its pid file)
GPU_DEVICES = {"h100": "/dev/null,/dev/zero", "l4": "/dev/full"}
# character devices every Linux (and container) has, handed out in turn as GPUs when a cluster asks for counts
# (Slurm 22.05 reports a count-only gres/gpu as none)
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None]


def require_slurm() -> None:
    """Fail in CI (.ci/run installs Slurm) and skip elsewhere when a program a real Slurm needs is missing."""
    missing = missing_programs()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install Slurm, munge and MariaDB (.ci/run); missing: {', '.join(missing)}")
        pytest.skip(f"a real Slurm needs Debian's slurmctld slurmd slurmdbd munge mariadb-server; missing: "
                    f"{', '.join(missing)}")


@contextmanager
def _munge_locked() -> Iterator[None]:
    MUNGE_SOCKET.parent.mkdir(parents=True, exist_ok=True)
    with open(MUNGE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _munge_users() -> list[Path]:
    """The registered clusters whose process still runs (a crashed test's file is dropped)."""
    users = []
    for user in MUNGE_USERS.glob("*") if MUNGE_USERS.exists() else []:
        if _alive(int(user.name.split("-")[0])):
            users.append(user)
        else:
            user.unlink(missing_ok=True)
    return users


def _munge_works() -> bool:
    if not MUNGE_SOCKET.exists():
        return False
    encoded = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
    return encoded.returncode == 0 and subprocess.run(["unmunge"], input=encoded.stdout, capture_output=True,
                                                      timeout=10).returncode == 0


class SlurmCluster:
    def __init__(self, root: Path, gpus: dict[str, int] | None = None, cpus: int | None = None,
                 per_type: bool = False, extra_conf: str = "") -> None:
        """`gpus`: GPU type -> count, on DEVICE_FILES in turn (default: GPU_DEVICES); `cpus`: the node's
        CPUs (default 2, as the host is taken to have), per node; `per_type`: a node `gpu-<type>` and a partition
        `<type>` per GPU type (the first the default) in place of the one node and `debug` partition: slurmctld's
        main scheduler, once a job waits for resources, starts nothing more on its partition's nodes until
        backfill, so one node of two GPU types would hold up one type's jobs behind the other's;
        `extra_conf`: more slurm.conf lines."""
        self.root = root
        self.devices = dict(GPU_DEVICES)
        if gpus:
            if sum(gpus.values()) > len(DEVICE_FILES):
                raise ValueError(f"at most {len(DEVICE_FILES)} GPUs: one device file each")
            files = iter(DEVICE_FILES)
            self.devices = {t: ",".join(next(files) for _ in range(n)) for t, n in gpus.items()}
        self.cpus, self.per_type, self.extra_conf = cpus, per_type, extra_conf
        self.node_ports = {t: free_port() for t in self.devices} if per_type else {}
        self.host = socket.gethostname()
        self.ports = {name: free_port() for name in ("mysql", "dbd", "ctld", "slurmd")}
        self.conf = root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.pids: list[Path] = []  # pid files of what this cluster started, stopped in reverse order
        self.munge_user = f"{os.getpid()}-{id(self)}"

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        done = subprocess.run(list(args), capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
        return done

    def start(self) -> "SlurmCluster":
        for folder in ("db", "state", "spool", "log"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self._munge()
        self._mariadb()
        self._write_configs()
        self.run("slurmdbd")
        self.pids.append(self.root / "slurmdbd.pid")
        wait_until(lambda: self.run("sacctmgr", "-nP", "show", "cluster", check=False).returncode == 0, 60,
                   "slurmdbd answering")
        self.run("sacctmgr", "-i", "add", "cluster", "gpuledger")
        self.run("slurmctld", "-f", str(self.conf))
        self.pids.append(self.root / "slurmctld.pid")
        if self.per_type:
            for kind in self.node_ports:
                self.run("slurmd", "-N", f"gpu-{kind}", "-f", str(self.conf))
                self.pids.append(self.root / f"slurmd-gpu-{kind}.pid")
            wait_until(lambda: sorted(self.run("sinfo", "-N", "-h", "-o", "%N %T", check=False).stdout.split())
                       == sorted([f"gpu-{t}" for t in self.node_ports] + ["idle"] * len(self.node_ports)), 60,
                       "nodes idle")
            return self
        self.run("slurmd", "-f", str(self.conf))
        self.pids.append(self.root / "slurmd.pid")
        wait_until(lambda: "idle" in self.run("sinfo", "-h", "-o", "%T", check=False).stdout, 60, "node idle")
        return self

    def _munge(self) -> None:
        """Use the munged answering on the default socket, or start one there; either way register as its user."""
        with _munge_locked():
            if not _munge_works():
                key = MUNGE_SOCKET.parent / "gpuledger-tests.key"
                key.write_bytes(os.urandom(1024))
                key.chmod(0o600)
                subprocess.run(["munged", "--force", f"--socket={MUNGE_SOCKET}", f"--key-file={key}",
                                f"--pid-file={MUNGE_STARTED}", f"--log-file={MUNGE_SOCKET.parent / 'gpuledger-tests.log'}",
                                f"--seed-file={MUNGE_SOCKET.parent / 'gpuledger-tests.seed'}"], check=True, timeout=30)
                wait_until(_munge_works, 30, "munged answering")
            MUNGE_USERS.mkdir(exist_ok=True)
            (MUNGE_USERS / self.munge_user).touch()

    def _release_munge(self) -> None:
        """No longer a user of munged; the last user stops the munged the tests started (never a system one)."""
        with _munge_locked():
            (MUNGE_USERS / self.munge_user).unlink(missing_ok=True)
            if _munge_users() or not MUNGE_STARTED.exists():
                return
            try:
                pid = int(MUNGE_STARTED.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
                wait_until(lambda: not _alive(pid), 5, "munged to stop")
            except (OSError, ValueError, IndexError, AssertionError):
                pass
            MUNGE_STARTED.unlink(missing_ok=True)
            MUNGE_SOCKET.unlink(missing_ok=True)

    def _mariadb(self) -> None:
        # one install at a time on the host, and its output kept: two clusters starting together in CI (one per
        # worker) once failed here with nothing to say why
        with open(Path(tempfile.gettempdir()) / "gpuledger-tests-mariadb-install.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for attempt in range(2):
                shutil.rmtree(self.root / "db", ignore_errors=True)
                (self.root / "db").mkdir(parents=True)
                done = subprocess.run(["mariadb-install-db", f"--datadir={self.root / 'db'}", "--user=root",
                                       "--auth-root-authentication-method=normal"], capture_output=True, text=True,
                                      timeout=120)
                if done.returncode == 0:
                    break
            else:
                raise AssertionError(f"mariadb-install-db failed twice ({done.returncode}): "
                                     f"{(done.stderr or done.stdout)[-3000:]}")
        log = self.root / "log" / "mysql.err"
        subprocess.Popen(["mariadbd", f"--datadir={self.root / 'db'}", f"--socket={self.root / 'mysql.sock'}",
                          f"--port={self.ports['mysql']}", "--bind-address=127.0.0.1", "--user=root",
                          "--skip-grant-tables", "--skip-name-resolve", f"--pid-file={self.root / 'mysql.pid'}",
                          f"--log-error={log}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pids.append(self.root / "mysql.pid")
        wait_until(lambda: log.exists() and "ready for connections" in log.read_text(), 60, "MariaDB ready")

    def _write_configs(self) -> None:
        root, ports = self.root, self.ports
        dbd = root / "slurmdbd.conf"  # found beside slurm.conf
        dbd.write_text(f"""AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={ports['dbd']}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports['mysql']}
StorageUser=root
StorageLoc=slurm_acct_db
LogFile={root / 'log' / 'slurmdbd.log'}
PidFile={root / 'slurmdbd.pid'}
""")
        dbd.chmod(0o600)
        counts = {t: len(d.split(",")) for t, d in self.devices.items()}
        nodes = (f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus or 2} "
                 f"Gres={','.join(f'gpu:{t}:{n}' for t, n in counts.items())} State=UNKNOWN\n"
                 "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        spool, slurmd_pid, slurmd_log = root / "spool", root / "slurmd.pid", root / "log" / "slurmd.log"
        if self.per_type:
            spool, slurmd_pid, slurmd_log = root / "spool-%n", root / "slurmd-%n.pid", root / "log" / "slurmd-%n.log"
            for t in counts:
                (root / f"spool-gpu-{t}").mkdir(exist_ok=True)
            nodes = "\n".join(
                [f"NodeName=gpu-{t} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={self.node_ports[t]} "
                 f"CPUs={self.cpus or 2} Gres=gpu:{t}:{n} State=UNKNOWN" for t, n in counts.items()]
                + [f"PartitionName={t} Nodes=gpu-{t} Default={'YES' if i == 0 else 'NO'} MaxTime=INFINITE State=UP"
                   for i, t in enumerate(counts)])
        extra = "".join(line.strip() + "\n" for line in self.extra_conf.splitlines() if line.strip())
        if self.cpus and self.cpus > 2:  # more CPUs than the host may have: slurmd takes slurm.conf's
            extra = "SlurmdParameters=config_overrides\n" + extra
        self.conf.write_text(f"""ClusterName=gpuledger
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={ports['ctld']}
SlurmdPort={ports['slurmd']}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={spool}
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmdPidFile={slurmd_pid}
SlurmctldLogFile={root / 'log' / 'slurmctld.log'}
SlurmdLogFile={slurmd_log}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={ports['dbd']}
AccountingStorageTRES=gres/gpu,{','.join(f'gres/gpu:{t}' for t in counts)}
AccountingStorageEnforce=associations,limits
PriorityType=priority/multifactor
PriorityDecayHalfLife=7-0
PriorityCalcPeriod=1
PriorityWeightFairshare=10000
GresTypes=gpu
ReturnToService=2
{nodes}
{extra}""")
        (root / "gres.conf").write_text("".join(
            f"NodeName={f'gpu-{t}' if self.per_type else self.host} Name=gpu Type={t} File={d}\n"
            for t, d in self.devices.items()))

    def stop(self) -> None:
        """SIGTERM every daemon at once, then wait up to 5 s for all of them together and SIGKILL what is left:
        throwaway daemons in a temporary folder, no clean shutdown to wait for one by one (that took up to 5 s a
        daemon, per test)."""
        pids = []
        for pid_file in reversed(self.pids):
            try:
                pid = int(pid_file.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                continue
            pids.append(pid)
        deadline = time.monotonic() + 5
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if _alive(pid)]
            time.sleep(0.1)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self._release_munge()
