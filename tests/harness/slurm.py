"""A real Slurm cluster of fake nodes on this machine, for tests and benchmarks (docs/architecture.md).

``PYTHONPATH=tests python -m harness.slurm start DIR [--nodes 2]`` prints ``export SLURM_CONF=...``; ``stop DIR`` ends it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from sharedfs.demo.ports import free_ports

__all__ = [
    "APT_PACKAGES",
    "SlurmCluster",
    "SlurmUnavailable",
    "slurm_available",
    "start",
]

APT_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
REQUIRED_PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol",
                     "scancel", "unshare")
INSTALL_HINT = "apt-get install -y --no-install-recommends " + " ".join(APT_PACKAGES)
#: States in which a job will not run again (``squeue -o %T`` / ``scontrol`` names).
FINISHED_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "TIMEOUT",
})


class SlurmUnavailable(RuntimeError):
    """The test cluster cannot run here; the message says what is missing and how to get it."""


def slurm_available() -> tuple[bool, str]:
    """Whether this machine can run :func:`start`, and why not."""
    missing = [name for name in REQUIRED_PROGRAMS
               if shutil.which(name) is None and not os.path.exists(f"/usr/sbin/{name}")]
    if missing:
        return False, f"programs not found: {', '.join(missing)}; install them with: {INSTALL_HINT}"
    if os.geteuid() != 0:
        # slurmd must run jobs as their user and the fake nodes need UTS namespaces.
        return False, "the test Slurm cluster needs root (slurmd, unshare --uts)"
    return True, ""


def _program(name: str) -> str:
    found = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None)
    if found is None:
        raise SlurmUnavailable(f"{name} not found; install it with: {INSTALL_HINT}")
    return found


class SlurmCluster:
    """A running test cluster rooted at ``root`` (see the module docstring).

    ``nodes`` are the fake node names (``n1``, ``n2``, ...), each with ``cpus``
    CPUs.  :attr:`env` is ``os.environ`` plus ``SLURM_CONF``: pass it to every
    Slurm client command and to jobs (``sbatch`` exports the submitter's
    environment by default).
    """

    def __init__(self, root: Path, nodes: Sequence[str], cpus: int, epilog: str | None = None) -> None:
        self.root = Path(root)
        self.nodes = list(nodes)
        self.cpus = cpus
        self.epilog = epilog
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.sock"
        # The daemons run in the foreground as our children, so stop() reaps them (a container's
        # pid 1 often reaps nothing, and daemonized ones would linger there as zombies).
        self._children: list[subprocess.Popen] = []

    # -- environment and commands ----------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def client_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """:attr:`env` with ``extra`` added (use for srun/sbatch of test jobs)."""
        env = self.env
        env.update(extra or {})
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *argv: str, env: Mapping[str, str] | None = None, timeout: float = 60,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (``srun ...``, ``squeue ...``) against this cluster."""
        proc = subprocess.run(list(argv), check=False, capture_output=True, text=True, env=self.client_env(env),
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` failed with exit {proc.returncode}\n"
                               f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\n{self.logs_tail()}")
        return proc

    def sbatch(self, script: str, *args: str, env: Mapping[str, str] | None = None) -> str:
        """Submit ``script`` (the text of a batch script) and return the job id."""
        path = Path(tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.root / "jobs")[1])
        path.write_text(script)
        proc = self.run("sbatch", "--parsable", f"--output={self.root / 'jobs' / '%j.out'}", *args, str(path),
                        env=env)
        return proc.stdout.strip().split(";")[0]

    def output(self, job_id: str) -> str:
        """What a batch job printed (stdout and stderr)."""
        try:
            return (self.root / "jobs" / f"{job_id}.out").read_text()
        except FileNotFoundError:
            return ""

    def job_state(self, job_id: str) -> str:
        """The job's state as ``squeue`` names it (``PENDING``, ``RUNNING``, ...); ``UNKNOWN`` if purged."""
        proc = self.run("squeue", "-h", "--states=all", "-j", job_id, "-o", "%T", check=False)
        state = proc.stdout.strip()
        return state.split()[0] if proc.returncode == 0 and state else "UNKNOWN"

    def wait_state(self, job_id: str, states: Sequence[str] | frozenset[str], timeout: float = 60) -> str:
        """Wait until the job is in one of ``states``; returns the state.  ``TimeoutError`` names the last one."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.1)
        raise TimeoutError(f"job {job_id} still {state} after {timeout} s, wanted one of {sorted(states)}\n"
                           f"job output:\n{self.output(job_id)}\n{self.logs_tail()}")

    def wait_finished(self, job_id: str, timeout: float = 60) -> str:
        return self.wait_state(job_id, FINISHED_STATES, timeout)

    def logs_tail(self, lines: int = 15) -> str:
        parts = []
        for log in sorted((self.root / "log").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name} (last {lines} lines)\n" + "\n".join(text))
        return "\n".join(parts)

    # -- life cycle -----------------------------------------------------------------------

    def write_config(self) -> None:
        ctld_port, *node_ports = free_ports(1 + len(self.nodes))
        host = socket.gethostname()
        for sub in ("state", "log", "run", "jobs", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.root / "spool" / node).mkdir(exist_ok=True)
        lines = [
            "# written by harness.slurm: a throwaway test cluster, fake nodes on one host",
            "ClusterName=sharedfstest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd-%n.log'}",
            # No cgroups in a container/VM test box: track processes by parent pid, bind nothing.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerParameters=sched_interval=1",
            "ReturnToService=2",
            # Fast turnaround: scancel escalates SIGTERM to SIGKILL after 2 s.
            "KillWait=2",
            "InactiveLimit=0",
            "MinJobAge=300",
            "SlurmdTimeout=60",
            "MessageTimeout=10",
        ]
        if self.epilog:
            lines.append(f"Epilog={self.epilog}")
        for node, port in zip(self.nodes, node_ports):
            lines.append(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={self.cpus} State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES OverSubscribe=YES "
                     "MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 30) -> None:
        ok, reason = slurm_available()
        if not ok:
            raise SlurmUnavailable(reason)
        self.root.mkdir(parents=True, exist_ok=True)
        # munged refuses a socket in a directory others cannot traverse, and a key others can read.
        os.chmod(self.root, 0o755)
        self.write_config()
        try:
            self._start_munge(timeout)
            self._spawn("slurmctld", [_program("slurmctld"), "-D", "-f", str(self.conf)])
            for node in self.nodes:
                # A UTS namespace per node: jobs there see the node name as their host name.
                self._spawn(f"slurmd-{node}", [_program("unshare"), "--uts", "--", "/bin/sh", "-c",
                                                'hostname "$0" && exec "$@"', node,
                                                _program("slurmd"), "-D", "-f", str(self.conf), "-N", node])
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise

    def _start_munge(self, timeout: float) -> None:
        munge_dir = self.munge_socket.parent
        munge_dir.mkdir(mode=0o755, exist_ok=True)
        os.chmod(munge_dir, 0o755)
        key = munge_dir / "munge.key"
        if not key.exists():
            subprocess.run([_program("mungekey"), "-c", "-k", str(key)], check=True, capture_output=True)
        os.chmod(key, 0o600)
        proc = self._spawn("munged", [_program("munged"), "--foreground", f"--key-file={key}",
                                      f"--socket={self.munge_socket}",
                                      f"--pid-file={self.root / 'run' / 'munged.pid'}",
                                      f"--log-file={self.root / 'log' / 'munged.log'}",
                                      f"--seed-file={munge_dir / 'munged.seed'}"])
        deadline = time.monotonic() + timeout
        while not self.munge_socket.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SlurmUnavailable(f"munged did not start (exit {proc.poll()}); see "
                                       f"{self.root / 'log' / 'munged.err'}\n{self.logs_tail()}")
            time.sleep(0.02)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        # Each daemon's own log (root/log/*.log) says why it did not come up; what it prints
        # before it opens that log goes to root/log/<name>.err.
        with open(self.root / "log" / f"{name}.err", "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=self.env,
                                    start_new_session=True)
        self._children.append(proc)
        time.sleep(0.05)
        if proc.poll() is not None:
            raise SlurmUnavailable(f"{name} exited at once (exit {proc.returncode}): "
                                   f"{(self.root / 'log' / f'{name}.err').read_text().strip()}\n{self.logs_tail()}")
        return proc

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            proc = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=10)
            out = proc.stdout
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            if proc.returncode == 0 and all(states.get(node) in ("idle", "mix", "alloc") for node in self.nodes):
                return
            time.sleep(0.2)
        raise SlurmUnavailable(f"the test cluster's nodes did not become idle within {timeout} s "
                               f"(sinfo: {out.strip() or 'no answer'})\n{self.logs_tail()}")

    def _our_pids(self) -> Iterator[tuple[str, int]]:
        """(daemon, pid) for each daemon started from this root that is still running."""
        for pid_file in sorted((self.root / "run").glob("*.pid")):
            try:
                pid = int(pid_file.read_text().split()[0])
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue  # gone already, or not a pid
            # A reused pid belongs to someone else: only a process started with our paths is ours.
            if str(self.conf) in cmdline or str(self.munge_socket) in cmdline:
                yield pid_file.stem, pid

    def _our_steps(self) -> list[int]:
        """slurmstepd processes of this cluster (they inherit our slurmd's SLURM_CONF)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/comm", encoding="ascii", errors="replace") as fh:
                    if fh.read().strip() != "slurmstepd":
                        continue
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    environ = fh.read().split(b"\0")
            except OSError:
                continue
            if f"SLURM_CONF={self.conf}".encode() in environ:
                found.append(int(entry))
        return found

    def stop(self, timeout: float = 15) -> None:
        """Stop the jobs and daemons of this root (pid files, command line checked); idempotent."""
        if self.conf.exists() and any(name == "slurmctld" for name, _ in self._our_pids()):
            # Cancel what still runs, so slurmd ends (and reaps) its job steps before it goes.
            jobs = self.run("squeue", "-h", "-o", "%i", check=False, timeout=10).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False, timeout=10)
                deadline = time.monotonic() + 10
                while self._our_steps() and time.monotonic() < deadline:
                    time.sleep(0.1)
        # slurmd first, then the controller, munge last; steps left over (a wedged job) are killed.
        order = sorted(self._our_pids(), key=lambda item: (not item[0].startswith("slurmd"), item[0] == "munged"))
        order += [("slurmstepd", pid) for pid in self._our_steps()]
        order += [("child", proc.pid) for proc in self._children
                  if proc.poll() is None and proc.pid not in {pid for _, pid in order}]
        for _, pid in order:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        for _name, pid in order:
            while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") and not _is_zombie(pid):
                time.sleep(0.05)
            if os.path.exists(f"/proc/{pid}") and not _is_zombie(pid):
                os.kill(pid, signal.SIGKILL)
        for proc in self._children:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._children.clear()

    def __enter__(self) -> SlurmCluster:  # noqa: PYI034 - the class is not meant to be subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def start(root: Path | None = None, *, nodes: int = 2, cpus: int = 4, epilog: str | None = None,
          timeout: float = 30) -> SlurmCluster:
    """Configure and start a test cluster with ``nodes`` fake nodes ``n1..nN`` under ``root``.

    ``root`` defaults to a new directory in ``/tmp`` (kept short: munge's socket
    path must fit a unix socket address).  ``epilog`` is a script run by each
    slurmd at the end of each job (``Epilog=``).  Raises :class:`SlurmUnavailable`
    saying what is missing when the cluster cannot run here.
    """
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="sfslurm-"))
    cluster = SlurmCluster(Path(root), [f"n{i}" for i in range(1, nodes + 1)], cpus, epilog)
    cluster.start(timeout=timeout)
    return cluster


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.slurm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="configure and start a cluster in DIR")
    p_start.add_argument("root", metavar="DIR")
    p_start.add_argument("--nodes", type=int, default=2)
    p_start.add_argument("--cpus", type=int, default=4)
    p_stop = sub.add_parser("stop", help="stop the daemons started from DIR")
    p_stop.add_argument("root", metavar="DIR")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    if args.command == "start":
        try:
            cluster = start(root, nodes=args.nodes, cpus=args.cpus)
        except SlurmUnavailable as exc:
            print(f"cannot start the test cluster: {exc}", file=sys.stderr)
            return 2
        print(f"export SLURM_CONF={cluster.conf}")
        return 0
    conf = root / "slurm.conf"
    if not conf.exists():
        print(f"{conf} does not exist: is {root} a test cluster directory?", file=sys.stderr)
        return 2
    SlurmCluster(root, [], 0).stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
