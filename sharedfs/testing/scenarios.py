"""The field failures ``sharedfs demo`` reproduces, and the programs that reproduce them.

One implementation for the demo (:mod:`sharedfs.commands.demo` runs :data:`SCENARIOS`)
and the tests (``tests/integration/test_demo.py`` runs the same functions), so
what a user watches and what CI asserts cannot drift apart.

Each scenario runs real programs in separate processes on a simulated cluster
filesystem (:class:`Sim`): a FUSE filesystem when this process may mount one
(root and /dev/fuse), otherwise an ``LD_PRELOAD`` library that makes flock
fail; the scenarios that need a second node's view of the filesystem (lag,
node-local locks) run only under FUSE.  It returns two :class:`Outcome` s:
without sharedfs, then with it.  A scenario whose framework or tool is not
installed raises :class:`ScenarioSkipped` with the command that installs it:
a missing framework is not a reproduced failure.

The wids and webdataset scenarios read real tar shards from a local HTTP
server (:mod:`sharedfs.testing.shardserver`, which counts the fetches); the
broadcast trap gives each simulated node its own tmpfs at the same path
(``unshare``); the lock scenarios put the holder on another "host" (its own
UTS and PID namespaces).  Everything mounted or started is cleaned up by the
:class:`Sim`'s ``ExitStack``, also on Ctrl-C.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:
    from sharedfs.testing.shardserver import ShardServer

__all__ = ["OLD_FILELOCK", "REFERENCES", "SCENARIOS", "Outcome", "Scenario", "ScenarioSkipped", "Sim",
           "install_command", "missing_modules", "old_filelock_dir"]

#: The last filelock release whose FileLock raises NotImplementedError on ENOSYS (datasets#6395);
#: 3.24 and later fall back to SoftFileLock themselves.  Cluster images often pin older releases.
OLD_FILELOCK = "filelock==3.23.0"

#: Public threads the scenarios cite, and where to read them.
REFERENCES = {
    "datasets#6395": "https://github.com/huggingface/datasets/issues/6395",
    "datasets#1672": "https://github.com/huggingface/datasets/issues/1672",
    "filelock#389": "https://github.com/tox-dev/filelock/issues/389",
    "lingua#49": "https://github.com/facebookresearch/lingua/issues/49",
    "OLMo#829": "https://github.com/allenai/OLMo/issues/829",
    "pytorch#92553": "https://github.com/pytorch/pytorch/issues/92553",
    "srt-slurm#251": "https://github.com/ishandhanani/srt-slurm/issues/251",
    "modelscope#1778": "https://github.com/modelscope/modelscope/issues/1778",
    "webdataset#386": "https://github.com/webdataset/webdataset/issues/386",
    "LlamaFactory#3065": "https://github.com/hiyouga/LLaMA-Factory/issues/3065",
    "ms-swift#3667": "https://github.com/modelscope/ms-swift/issues/3667",
    "pytorch#189245": "https://github.com/pytorch/pytorch/issues/189245",
    "triton#2688": "https://github.com/triton-lang/triton/issues/2688",
    "prime-rl PR #2305": "https://github.com/PrimeIntellect-ai/prime-rl/pull/2305",
    "diffusers#1517": "https://github.com/huggingface/diffusers/issues/1517",
    "tvm-ffi#667": "https://github.com/apache/tvm-ffi/issues/667",
}

#: The distribution (and the version range the shims support) behind each module a scenario imports.
DISTRIBUTIONS = {
    "datasets": "datasets>=2.14,<6",
    "webdataset": "webdataset>=0.2,<1.1",
    "wids": "wids>=0.1,<0.2",
    "torch": "torch",
    "triton": "triton>=3.0,<4",
    "transformers": "transformers>=4.57,<6",
    "modelscope_hub": "modelscope-hub>=0.4.6,<0.6",
    "megatron": "megatron-core>=0.16,<0.17",
    "tvm_ffi": "apache-tvm-ffi>=0.1.5,<0.2",
}


class ScenarioSkipped(Exception):
    """A scenario cannot run here; the message says what is missing and how to get it."""


@dataclass
class Outcome:
    failed: bool  # did the program fail (crash, hang, corrupt, break a live lock)?
    evidence: str
    #: Why it failed (or did not), as this run observed it ("" where the evidence says it all).
    cause: str = ""


#: The filesystems ``sharedfs demo --fs`` runs on: our FUSE fake, and the real ones of
#: :mod:`sharedfs.testing.realfs` (one client mount per node).
FILESYSTEMS = ("hostilefs", "juicefs", "moosefs", "glusterfs")


@dataclass(frozen=True)
class OnRealFS:
    """The volume a cross-node scenario needs on a real filesystem (:func:`sharedfs.testing.realfs.volume`)."""

    profile: str = "lagging"
    nodes: int = 3  # one volume serves every scenario (the Triton and makedirs ones want 3 nodes)
    node_local_locks: bool = False  # MooseFS: flock and fcntl exclude one node's processes only


@dataclass
class Sim:
    """The simulated cluster filesystem: FUSE mounts, or the LD_PRELOAD fallback."""

    work: Path
    stack: ExitStack
    fuse: bool
    why_not_fuse: str = ""
    counter: int = 0
    base_env: dict[str, str] = field(default_factory=dict)
    #: Progress notes a scenario wants the user to see (a download, a long wait).
    note: Callable[[str], None] = lambda line: None
    #: Which filesystem the cross-node scenarios run on (:data:`FILESYSTEMS`), and, on a real one,
    #: the volume the running scenario asked for.
    fs: str = "hostilefs"
    plan: OnRealFS | None = None
    _volumes: dict[OnRealFS, tuple[Path, ...]] = field(default_factory=dict)

    @property
    def real(self) -> bool:
        return self.fs != "hostilefs"

    def node_dirs(self) -> list[Path]:
        """A fresh directory on the real volume :attr:`plan` names, seen through each node's own client mount.

        Volumes are started on first use and kept for the demo's other scenarios (``stack`` stops them).
        """
        from sharedfs.testing.realfs import RealFSUnavailable, volume

        assert self.plan is not None, "node_dirs() is for a scenario running on a real filesystem"
        if self.plan not in self._volumes:
            self.note(f"starting {self.fs} ({self.plan.nodes} client mounts, {self.plan.profile} caches"
                      + (", node-local locks" if self.plan.node_local_locks else "") + ")")
            try:
                vol = self.stack.enter_context(volume(self.fs, nodes=self.plan.nodes, profile=self.plan.profile,
                                                      workdir=self.work, node_local_locks=self.plan.node_local_locks))
            except RealFSUnavailable as exc:
                raise ScenarioSkipped(str(exc)) from None
            self._volumes[self.plan] = vol.mounts
        mounts = self._volumes[self.plan]
        self.counter += 1
        name = f"s{self.counter}"
        (mounts[0] / name).mkdir()
        dirs = [mnt / name for mnt in mounts]
        deadline = time.monotonic() + 30  # the other clients' entry caches may not show it yet
        while not all(d.is_dir() for d in dirs) and time.monotonic() < deadline:
            time.sleep(0.1)
        return dirs

    def shared_dir(self, profile: str, *, lag_ms: float = 2000) -> tuple[Path, dict[str, str]]:
        """A fresh directory with ``profile``'s faults, and the environment its processes need."""
        self.counter += 1
        if self.fuse:
            from sharedfs.testing.hostilefs import FuseUnavailable, mount

            root = self.work / f"fs{self.counter}"
            (root / "backing").mkdir(parents=True)
            (root / "mnt").mkdir()
            try:
                handle = self.stack.enter_context(mount(root / "backing", root / "mnt", profile, lag_ms=lag_ms))
            except FuseUnavailable as exc:
                raise ScenarioSkipped(f"the FUSE filesystem could not be mounted: {exc}") from None
            return Path(handle.path), dict(self.base_env)
        from sharedfs.testing.preload import PreloadUnavailable, preload_env

        path = self.work / f"fs{self.counter}"
        path.mkdir()
        errno_name = {"lustre-noflock": "ENOSYS", "nfs-nolock": "ENOLCK"}[profile]
        try:
            return path, preload_env([str(path)], errno_name, base=self.base_env)
        except PreloadUnavailable as exc:
            raise ScenarioSkipped(f"the LD_PRELOAD fault library could not be built: {exc}") from None


def python_command() -> str:
    """How to name this interpreter in a command the user can paste: ``python`` when that is this one."""
    found = shutil.which("python")
    if found and os.path.realpath(found) == os.path.realpath(sys.executable) and \
            os.path.dirname(found) == os.path.dirname(sys.executable):
        return "python"
    return shlex.quote(sys.executable)


def install_command(modules: list[str]) -> str:
    """The exact command that installs ``modules`` into this interpreter."""
    specs = " ".join(shlex.quote(DISTRIBUTIONS.get(name, name)) for name in modules)
    return f"{python_command()} -m pip install {specs}"


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` this interpreter (and so every scenario process) cannot import."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def run_py(code: str, *args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                              env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, -9, "", f"hung: killed after {timeout:.0f} s")


def last_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line or "hung" in line]
    return (errors or lines or ["(no output)"])[-1].strip()[:160]


def _unshare(*namespaces: str) -> list[str]:
    """``unshare`` into ``namespaces`` (a user namespace too when not root), or skip when it cannot."""
    if not shutil.which("unshare"):
        raise ScenarioSkipped("needs unshare (util-linux) to simulate another node: apt-get install util-linux")
    user_ns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    argv = ["unshare", *user_ns, *namespaces]
    probe = subprocess.run([*argv, "true"], capture_output=True, text=True, check=False)
    if probe.returncode:
        raise ScenarioSkipped(f"`{' '.join(argv)}` is refused here ({probe.stderr.strip() or probe.returncode}); "
                              "unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone)")
    return argv


# -- datasets on flock-less storage ---------------------------------------------------------------

LOAD = """
    import json, sys
    import datasets
    datasets.disable_progress_bars()
    data, cache = sys.argv[1], sys.argv[2]
    ds = datasets.load_dataset("json", data_files=data, cache_dir=cache, split="train")
    print(len(ds))
"""


def _jsonl(sim: Sim) -> str:
    data = sim.work / "rows.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(100)))
    return str(data)


def old_filelock_dir() -> Path:
    """Where the demo keeps :data:`OLD_FILELOCK` (fetched once, then reused offline)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache, "sharedfs", "demo", OLD_FILELOCK.replace("==", "-"))


def fetch_old_filelock(sim: Sim) -> Path:
    """:data:`OLD_FILELOCK` installed into :func:`old_filelock_dir` (needs a package index the first time)."""
    target = old_filelock_dir()
    if (target / "filelock").is_dir():
        return target
    fetch = (f"{python_command()} -m pip install --no-deps --target {shlex.quote(str(target))} {OLD_FILELOCK}")
    sim.note(f"fetching {OLD_FILELOCK} from your package index (once; kept in {target})")
    staging = target.with_name(target.name + f".partial-{os.getpid()}")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                           "--target", str(staging), OLD_FILELOCK], capture_output=True, text=True, check=False)
    if proc.returncode:
        shutil.rmtree(staging, ignore_errors=True)
        why = (proc.stderr.strip().splitlines() or [f"pip exited {proc.returncode}"])[-1][:120]
        raise ScenarioSkipped(f"needs {OLD_FILELOCK} (the last filelock that raises on ENOSYS) from a package "
                              f"index, which failed ({why}); fetch it once with: {fetch}")
    try:
        staging.rename(target)  # whole or not at all: a concurrent demo may have won the race
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def datasets_enosys(sim: Sim) -> tuple[Outcome, Outcome]:
    overlay = fetch_old_filelock(sim)
    path, env = sim.shared_dir("lustre-noflock")
    old = run_py(LOAD, _jsonl(sim), str(path / "cache-a"),
                 env={**env, "PYTHONPATH": str(overlay), "SHAREDFS_DISABLE": "1"})
    new = run_py(LOAD, _jsonl(sim), str(path / "cache-b"), env={**env, "PYTHONPATH": str(overlay)})
    return (Outcome(old.returncode != 0, f"{OLD_FILELOCK}: {last_error(old)}"),
            Outcome(new.returncode != 0, f"{OLD_FILELOCK}: loaded 100 rows" if new.returncode == 0
                    else last_error(new)))


def datasets_enolck(sim: Sim) -> tuple[Outcome, Outcome]:
    path, env = sim.shared_dir("nfs-nolock")
    without = run_py(LOAD, _jsonl(sim), str(path / "cache-a"), env={**env, "SHAREDFS_DISABLE": "1"})
    with_ = run_py(LOAD, _jsonl(sim), str(path / "cache-b"), env=env)
    return (Outcome(without.returncode != 0, last_error(without)),
            Outcome(with_.returncode != 0, "loaded 100 rows" if with_.returncode == 0 else last_error(with_)))


# -- locks that exclude one node only ------------------------------------------------------------

COUNTER = """
    import json, os, sys, time
    lock_file, counter, which, gate, count = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    if which == "sharedfs":
        import sharedfs
        lock = sharedfs.lock(lock_file)
    else:
        import filelock
        lock = filelock.FileLock(lock_file)
    # Start together: on a loaded machine the first processes could otherwise finish before the last start.
    open(os.path.join(gate, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(gate)) < count and time.monotonic() < deadline:
        time.sleep(0.005)
    holds = []  # (entered, left, value read, value written): what the scenario's cause is derived from
    for _ in range(10):
        with lock:
            entered = time.monotonic()  # one clock for every process of this machine, whatever its "node"
            try:
                with open(counter) as fh:
                    value = int(fh.read() or 0)
            except (FileNotFoundError, ValueError):  # another "holder" is replacing it right now
                value = 0
            time.sleep(0.002)
            with open(counter + f".{os.getpid()}", "w") as fh:
                fh.write(str(value + 1))
            os.replace(counter + f".{os.getpid()}", counter)
            holds.append((entered, time.monotonic(), value, value + 1))
    print(json.dumps(holds))
"""
COUNTER_PROCESSES, COUNTER_HOLDS = 8, 80


@dataclass(frozen=True)
class Holds:
    """What the counter's holders did, from their own records: who overlapped whom, who read a stale value."""

    holds: int
    handovers: int
    overlapped: int  # handovers where the next holder entered before the last one left
    stale: int  # reads of something other than what the last holder to leave had written

    @classmethod
    def of(cls, records: list[tuple[float, float, int, int]]) -> Holds:
        records = sorted(records)
        overlapped = stale = 0
        left_last = float("-inf")
        for i, (entered, left, read, _) in enumerate(records):
            if i and entered < left_last:
                overlapped += 1
            left_last = max(left_last, left)
            before = [(lft, wrote) for _, lft, _, wrote in records if lft <= entered]
            if read != max(before, default=(0.0, 0))[1]:
                stale += 1
        return cls(len(records), max(len(records) - 1, 0), overlapped, stale)

    def text(self) -> str:
        return (f"{self.overlapped} of {self.handovers} handovers overlapped, "
                f"{self.stale} of {self.holds} reads stale")

    def cause(self, fs: str) -> str:
        """The cause this run showed (two holders at once outranks a stale read: it explains both)."""
        if self.overlapped:
            return (f"node-local flock: two holders at once in {self.overlapped} of {self.handovers} handovers "
                    "(flock excluded only the processes of one node)")
        if self.stale:
            return (f"the next holder read a stale value through the client cache ({self.stale} of {self.holds} "
                    f"reads); flock excluded across nodes (0 of {self.handovers} handovers overlapped)")
        return (f"not reproduced on {fs}: flock excluded across nodes and every holder read the last value "
                f"(0 of {self.handovers} handovers overlapped, 0 stale reads)")


def _counter_run(sim: Sim, which: str) -> Outcome:
    if sim.real:  # one client mount per node: a process reaches the volume through its node's own mount
        dirs = sim.node_dirs()
        env = dict(sim.base_env)
        # The lock file exists on every node before the start, as after a first run: else a lagging mount's
        # negative entry cache holds the second node's open(O_CREAT) for its 3 s while the first node's
        # processes finish all their holds, and the run shows no overlap whatever the locks do.
        (dirs[0] / "c.lock").touch()
        deadline = time.monotonic() + 30
        while not all((d / "c.lock").exists() for d in dirs) and time.monotonic() < deadline:
            time.sleep(0.1)
    else:
        path, env = sim.shared_dir("localflock")
        dirs = [path, path]
    gate = Path(tempfile.mkdtemp(prefix=f"gate-{which}-", dir=sim.work))  # local: every process sees it at once
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(COUNTER), str(dirs[i % 2] / "c.lock"),
                               str(dirs[i % 2] / "count"), which, str(gate), str(COUNTER_PROCESSES)],
                              env={**env, "SHAREDFS_NODE_ID": f"node{i % 2}"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(COUNTER_PROCESSES)]
    done = [p.communicate(timeout=300) for p in procs]
    if any(p.returncode for p in procs):
        error = next(err for p, (_, err) in zip(procs, done) if p.returncode).strip().splitlines()[-1]
        return Outcome(True, error, cause=f"a holder crashed: {error[:120]}")
    holds = Holds.of([tuple(h) for out, _ in done for h in json.loads(out.strip().splitlines()[-1])])
    if sim.real:  # node 0's cache may still show an older counter than the last holder wrote
        from sharedfs.testing.realfs import LAG_S

        time.sleep(LAG_S + 0.5)
    value = int((dirs[0] / "count").read_text())
    return Outcome(value != COUNTER_HOLDS, f"counter {value}/{COUNTER_HOLDS} ({COUNTER_HOLDS - value} updates lost); "
                                           f"{holds.text()}", cause=holds.cause(sim.fs))


def node_local_flock(sim: Sim) -> tuple[Outcome, Outcome]:
    return _counter_run(sim, "filelock"), _counter_run(sim, "sharedfs")


# -- metadata that lags between nodes ------------------------------------------------------------

def makedirs_race(sim: Sim) -> tuple[Outcome, Outcome]:
    """lingua's makedirs and torch DCP's save, unchanged, from 6 ranks on 3 nodes: without sharedfs, then with it.

    The programs make no ``sharedfs.`` call (:mod:`sharedfs.testing.scenario_makedirs`): sharedfs's
    ``makedirs`` shim is what changes between the two runs.
    """
    from sharedfs.testing import scenario_makedirs

    mounts: list[Path] | None = None
    if sim.real:  # each node's ranks go through that node's own client mount
        mounts = sim.node_dirs()
        path, env = mounts[0], dict(sim.base_env)
    else:
        path, env = sim.shared_dir("lagging", lag_ms=3000)
    outcomes = []
    for run, extra in (("run-without", {"SHAREDFS_DISABLE": "1"}), ("run-with", {})):
        results = scenario_makedirs.run_ranks(path, run, {**env, **extra}, mounts=mounts)
        tally = scenario_makedirs.tally(results)
        failures = sum(len(results) - ok for ok, _ in tally.values())
        steps = len(results) * len(tally)
        first = next((failure for _, failure in tally.values() if failure), "")
        if failures:
            cause = f"{failures} of {steps} rank-steps failed; the first: {first[:120]}"
        else:  # what a real FUSE client here does: EEXIST is not followed by "not a directory"
            cause = f"not reproduced on {sim.fs}: its client does not show it (0 of {steps} rank-steps failed)"
        outcomes.append(Outcome(failures > 0, scenario_makedirs.evidence(results), cause=cause))
    return outcomes[0], outcomes[1]


#: Longer than OLMo-core's fixed 10 s wait: what NFS attribute and negative-lookup caches do to a new directory.
OLMO_CORE_LAG_MS = 13_000


def visibility_timeout(sim: Sim) -> tuple[Outcome, Outcome]:
    """OLMo#829 with OLMo-core itself: 4 ranks on 2 nodes call ``save_state_dict``, unchanged, in its own venv."""
    from sharedfs.testing.frameworkvenv import VenvBuildError, install_sharedfs, python_of, source_checkout
    from sharedfs.testing.olmo_core_job import REQUIREMENTS, olmo_core_venv, start_job, summary

    try:
        root = olmo_core_venv(note=sim.note)
        install_sharedfs(root, source_checkout())  # from a wheel's installation: its files are copied
    except VenvBuildError as exc:
        raise ScenarioSkipped(f"could not build the OLMo-core 3.0.0 venv ({str(exc).splitlines()[-1][:120]}); "
                              f"it needs the packages pinned in {REQUIREMENTS.name} from your package index") from None
    path, env = sim.shared_dir("lagging", lag_ms=OLMO_CORE_LAG_MS)
    env = {k: v for k, v in env.items() if not k.startswith(("SHAREDFS_", "PYTHON"))}
    # Both jobs at once, each in its own directory of the one mount (the lag is per entry): the demo waits for
    # the slower one instead of both.
    jobs = [start_job(python_of(root), path / f"checkpoint-{name}", {**env, **extra},
                      local_root=sim.work / f"olmo-core-nodes-{name}", nodes=2, per_node=2)
            for name, extra in (("without", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {}))]
    outcomes = []
    for job in jobs:
        reports = job.reports(timeout=120)
        saved = all(r["ok"] for r in reports)
        timeouts = [r["error"] for r in reports if str(r["error"]).startswith("TimeoutError")]
        evidence = summary(reports)
        if timeouts:
            evidence += f": {timeouts[0][:120]}"
        elif saved:
            slowest = max(r["seconds"] for r in reports)
            evidence += f", the last after {slowest:.0f} s ({OLMO_CORE_LAG_MS // 1000} s lag)"
        outcomes.append(Outcome(not saved, evidence))
    return outcomes[0], outcomes[1]


# -- existence locks whose holder is on another node ---------------------------------------------

HOLD = """
    import sys, time
    which, lock_file = sys.argv[1], sys.argv[2]
    if which == "filelock":
        import filelock
        lock = filelock.SoftFileLock(lock_file)
    else:
        import sharedfs
        lock = sharedfs.lock(lock_file)
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
"""
TAKE = """
    import sys, time
    which, lock_file = sys.argv[1], sys.argv[2]
    start = time.monotonic()
    if which == "filelock":
        import filelock
        filelock.SoftFileLock(lock_file, timeout=8).acquire()
    else:
        import sharedfs
        sharedfs.lock(lock_file, timeout=8).acquire()
    print(f"{time.monotonic() - start:.1f}")
"""


def other_host_prefix() -> list[str]:
    """Run a command as if on another host: its own UTS namespace and host name, so nothing here
    can probe its pid, exactly as across real nodes (a user namespace makes this work without root)."""
    return [*_unshare("--uts"), "sh", "-c", 'hostname node-a && exec "$0" "$@"']


def stale_lock(sim: Sim) -> tuple[Outcome, Outcome]:
    """A job on node A is killed while holding an existence lock; the rerun on node B must not hang."""
    prefix = other_host_prefix()
    outcomes = []
    for which, extra in (("filelock", {}), ("sharedfs", {"SHAREDFS_LOCK": "lease", "SHAREDFS_LEASE_SECONDS": "2"})):
        lock_dir = sim.work / f"stale-{which}"
        lock_dir.mkdir()
        env = {**sim.base_env, **extra}
        holder = subprocess.Popen([*prefix, sys.executable, "-c", textwrap.dedent(HOLD), which,
                                   str(lock_dir / "job.lock")], env={**env, "SHAREDFS_NODE_ID": "node-a"},
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGKILL)  # Slurm preemption, OOM killer, time limit
        holder.wait()
        taker = run_py(TAKE, which, str(lock_dir / "job.lock"), env={**env, "SHAREDFS_NODE_ID": "node-b"})
        if taker.returncode:
            outcomes.append(Outcome(True, f"rerun waits forever: {last_error(taker)[:110]}"))
        else:
            outcomes.append(Outcome(False, f"rerun took the lock after {taker.stdout.strip()} s (2 s lease)"))
    return outcomes[0], outcomes[1]


#: How long the live holder keeps its lock, and how long the waiter's first attempt waits.
LIVE_HOLD_SECONDS, LIVE_FIRST_WAIT = 3.0, 1.0

LIVE_HOLDER = """
    import os, sys, time
    which, lock_file, held, hold, trying = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
    if which == "filelock":
        import filelock
        lock = filelock.SoftFileLock(lock_file)
    else:
        import sharedfs
        lock = sharedfs.lock(lock_file)
    lock.acquire()
    open(held, "w").close()
    # Held for `hold` s from the waiter's first attempt, not from now: on a busy machine the waiter's
    # interpreter may take longer than that to start, and would find the lock already released.
    deadline = time.monotonic() + 120
    while not os.path.exists(trying) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(hold)
    # Written before the release: a waiter that really waited took the lock after this moment.
    print(time.time(), flush=True)
    lock.release()
"""
LIVE_WAITER = """
    import json, sys, time
    which, lock_file, first_wait, trying = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    if which == "filelock":
        import filelock
        lock, Timeout = filelock.SoftFileLock(lock_file), filelock.Timeout
    else:
        import sharedfs
        lock, Timeout = sharedfs.lock(lock_file), sharedfs.LockTimeout
    out = {"first_attempt": None}
    open(trying, "w").close()  # the holder holds on from here
    try:
        lock.acquire(timeout=first_wait)  # what a user sees while the holder works on
    except Timeout as exc:
        out["first_attempt"] = f"{type(exc).__name__}: {exc}"
        lock.acquire(timeout=60)
    out["acquired_at"] = time.time()
    print(json.dumps(out), flush=True)
"""


#: Another PID namespace on this machine whose processes get pids far above this namespace's: a pid
#: recorded there names no process here, as a pid recorded on another node (or in another container
#: of one pod) does.  The shell forks the program, so it gets the high pid (pid 1 is the shell).
OTHER_PID_SPACE = ('echo $(( $(cat /proc/sys/kernel/pid_max) - 100 )) > /proc/sys/kernel/ns_last_pid 2>/dev/null; '
                   '"$0" "$@" & wait $!')


def _live_run(sim: Sim, which: str, prefix: list[str], overlay: Path) -> Outcome:
    lock_dir = sim.work / f"live-{which}"
    lock_dir.mkdir()
    lock_file, held, trying = lock_dir / "train.lock", lock_dir / "held", lock_dir / "trying"
    # The same filelock on both sides (the one cluster images pin), so sharedfs is the only difference;
    # an existence lock, as on Lustre without flock (forced: the demo's work dir is local disk).
    env = {**sim.base_env, "PYTHONPATH": str(overlay), "SHAREDFS_LOCK": "soft"}
    if which == "filelock":
        env["SHAREDFS_DISABLE"] = "1"
    holder = subprocess.Popen([*prefix, sys.executable, "-c", textwrap.dedent(LIVE_HOLDER), which, str(lock_file),
                               str(held), str(LIVE_HOLD_SECONDS), str(trying)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not held.exists():
            if holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the holder did not take the lock: {holder.communicate()[1][-300:]}")
            time.sleep(0.02)
        waiter = run_py(LIVE_WAITER, which, str(lock_file), str(LIVE_FIRST_WAIT), str(trying), env=env, timeout=90)
        released = float(holder.communicate(timeout=60)[0].strip() or "inf")
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    if waiter.returncode:
        return Outcome(True, f"waiter: {last_error(waiter)}")
    result = json.loads(waiter.stdout.strip().splitlines()[-1])
    if result["acquired_at"] < released:
        early = released - result["acquired_at"]
        return Outcome(True, f"BROKE the live holder's lock: the holder's pid does not exist here, so it was "
                             f"taken for dead; both held the lock for {early:.1f} s")
    first = (result["first_attempt"] or "").replace(f"{lock_dir}/", "")
    waited = f"waited for the live holder and took the lock when it released it ({LIVE_HOLD_SECONDS:g} s)"
    if "held by pid" not in first:
        return Outcome(True, f"{waited}, without a word about who holds it ({first[:80]})")
    holder_text = first.split("held by ", 1)[1].split(". ", 1)[0]
    return Outcome(False, f"{waited}; meanwhile it named the holder: {holder_text}")


def live_lock(sim: Sim) -> tuple[Outcome, Outcome]:
    """A holds an existence lock and works on; B, with the same host name but another PID space, wants it.

    Two containers of one pod (or nodes whose containers share a host name) look like one host,
    but a pid from one means nothing in the other.  :data:`OLD_FILELOCK`'s rule -- same host name,
    pid not running here, so dead -- breaks the live holder's lock; sharedfs's rule also needs the
    same boot and PID namespace before a pid may prove anything, so B waits and names A.
    """
    overlay = fetch_old_filelock(sim)
    prefix = [*_unshare("--pid", "--fork", "--mount-proc"), "sh", "-c", OTHER_PID_SPACE]
    return _live_run(sim, "filelock", prefix, overlay), _live_run(sim, "sharedfs", prefix, overlay)


# -- wids and webdataset: real tar shards from a local HTTP server --------------------------------

SHARDS, SHARD_SAMPLES = 4, 10


def _shard_server(sim: Sim, delay: float) -> tuple[ShardServer, list[str], dict[str, str]]:
    """A fresh :class:`ShardServer` (closed by ``sim.stack``), its shard URLs, and the expected samples."""
    from sharedfs.testing.shardserver import ShardServer, make_shards

    root = sim.work / "shards"
    expected = make_shards(root, count=SHARDS, samples=SHARD_SAMPLES)  # deterministic: rewriting is harmless
    server = sim.stack.enter_context(ShardServer(root, delay=delay, max_seconds=120))
    return server, server.urls(server.shard_names()), expected


def _readers(sim: Sim, code: str, args: list[str], env: dict[str, str], nodes: int, count: int,
             timeout: float = 90) -> list[subprocess.CompletedProcess[str]]:
    """``count`` reader processes over ``nodes`` simulated nodes, released together by a gate."""
    sim.counter += 1
    gate = str(sim.work / f"gate{sim.counter}")
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args, gate],
                              env={**env, "SHAREDFS_NODE_ID": f"node{i % nodes}", "SHAREDFS_TEST_INDEX": str(i),
                                   "SHAREDFS_TEST_COUNT": str(count)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(count)]
    done = []
    try:
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                err += f"\nhung: killed after {timeout:.0f} s"
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:  # Ctrl-C or an error: no reader outlives the demo
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


def _samples(proc: subprocess.CompletedProcess[str]) -> dict[str, str] | None:
    if proc.returncode:
        return None
    try:  # wids prints cache-miss warnings to stdout: the result is the last line
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None


WIDS_READER = """
    import json, sys
    from sharedfs.testing.shardserver import sample_digest, start_together
    import wids
    urls, cache, samples, gate = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    start_together(gate)  # before wids touches the cache: a failing reader must not strand the others
    ds = wids.ShardListDataset([{"url": u, "nsamples": samples} for u in urls], cache_dir=cache,
                               transformations=[])
    got = {}
    for i in range(len(ds)):
        s = ds[i]
        data = s[".bin"]
        data = data.read() if hasattr(data, "read") else bytes(data)
        got[s["__key__"]] = sample_digest(s["__key__"], data)
    print(json.dumps(got))
"""


def triton_cache(sim: Sim) -> tuple[Outcome, Outcome]:
    """Triton's kernel cache filled by 9 processes on 3 nodes through its own API (triton#2688).

    The programs make no ``sharedfs.`` call (:mod:`sharedfs.testing.scenario_triton`).
    """
    from sharedfs.testing import scenario_triton

    if sim.real:
        mounts = sim.node_dirs()
        path, env = mounts[0], dict(sim.base_env)
    else:
        path, env = sim.shared_dir("lagging", lag_ms=2000)
        mounts = [path] * 3
    outcomes = []
    for label, extra in (("without", {"SHAREDFS_DISABLE": "1"}), ("with", {})):
        node_dirs = {f"n{i}": str(mounts[i] / f"cache-{label}") for i in range(3)}
        reports = scenario_triton.run(path / f"cache-{label}", {"n0": 3, "n1": 3, "n2": 3}, {**env, **extra},
                                      node_dirs=node_dirs)
        failed = scenario_triton.failed(reports)
        evidence = f"{len(reports) - failed}/{len(reports)} processes compiled or loaded all 6 kernels"
        errors = scenario_triton.first_errors(reports)
        if errors:
            first = errors[0].split(": ", 1)[1]
            for mnt in {*mounts, path}:
                first = first.replace(str(mnt), "...")
            evidence += "; " + first
            cause = f"{failed} of {len(reports)} processes failed; the first: {first[:120]}"
        else:
            cause = f"not reproduced on {sim.fs}: 0 of {len(reports)} processes failed" if sim.real else ""
        outcomes.append(Outcome(failed > 0, evidence, cause=cause))
    return outcomes[0], outcomes[1]


def wids_flockless(sim: Sim) -> tuple[Outcome, Outcome]:
    """webdataset#386: wids' ULockFile flocks ``<shard>.tar.lock`` in the cache dir."""
    server, urls, expected = _shard_server(sim, delay=0.1)
    path, env = sim.shared_dir("nfs-nolock")
    outcomes = []
    for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
        server.reset()
        results = _readers(sim, WIDS_READER, [json.dumps(urls), str(path / label), str(SHARD_SAMPLES)],
                           {**env, **extra}, nodes=2, count=2)
        broken = [r for r in results if _samples(r) != expected]
        if broken:
            outcomes.append(Outcome(True, f"{len(broken)}/2 readers: {last_error(broken[0])}"))
        else:
            fetches = server.counts()
            outcomes.append(Outcome(any(n != 1 for n in fetches.values()),
                                    f"2/2 readers (2 nodes) read all {len(expected)} samples; fetches per shard: "
                                    f"max {max(fetches.values())}"))
    return outcomes[0], outcomes[1]


WDS_READER = """
    import json, sys
    # webdataset runs without torch (its pytorch.py); not importing it spares 8 readers 2 s of CPU each.
    sys.modules["torch"] = None
    from sharedfs.testing.shardserver import sample_digest, start_together
    import webdataset as wds
    urls, cache, gate = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    ds = wds.WebDataset(urls, cache_dir=cache, shardshuffle=False, empty_check=False)
    start_together(gate)  # the ranks of one job hit the server at once
    print(json.dumps({s["__key__"]: sample_digest(s["__key__"], s["bin"]) for s in ds}))
"""


def webdataset_duplicates(sim: Sim) -> tuple[Outcome, Outcome]:
    """webdataset's cache has no lock at all: every reader of a shared cache_dir downloads every shard."""
    server, urls, expected = _shard_server(sim, delay=0.3)
    # GPFS-like (flock excludes within a node only) under FUSE; ENOLCK NFS under the fallback.
    path, env = sim.shared_dir("localflock" if sim.fuse else "nfs-nolock")
    nodes = 2 if sim.fuse else 1
    outcomes = []
    for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {})):
        server.reset()
        (path / label).mkdir()  # webdataset refuses a cache_dir that does not exist
        results = _readers(sim, WDS_READER, [json.dumps(urls), str(path / label)], {**env, **extra},
                           nodes=nodes, count=8)
        fetches = [server.counts().get(name, 0) for name in server.shard_names()]
        where = f"8 readers on {nodes} node{'s' if nodes > 1 else ''}"
        broken = [r for r in results if _samples(r) != expected]
        evidence = f"{where}: fetches per shard: mean {sum(fetches) / len(fetches):.1f}, max {max(fetches)}"
        if broken:  # seen here: the shard missing right after the readers' concurrent renames onto it
            error = last_error(broken[0]).replace(f"{path}/", "")
            evidence += f"; {len(broken)}/8 readers crashed: {error[:100]}"
        outcomes.append(Outcome(bool(broken) or any(n != 1 for n in fetches), evidence))
    return outcomes[0], outcomes[1]


# -- the node-local-cache broadcast trap ----------------------------------------------------------

#: Each simulated node mounts its own tmpfs at the *same* path in its own mount namespace: a real
#: node-local /tmp (same path on every node, different content), which one machine cannot imitate
#: with plain directories.
PRIVATE_TMPFS = 'mount -t tmpfs -o mode=1777 sharedfs-node-local "$0" && exec "$@"'
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
PICKLE = """
    import json, pickle, sys
    import datasets
    datasets.disable_progress_bars()
    mode, data, blob = sys.argv[1:4]
    if mode == "send":  # node A: prepare, then what broadcast_object_list does to a Dataset
        ds = datasets.load_dataset("json", data_files=data, split="train")
        open(blob, "wb").write(pickle.dumps(ds))
        sys.exit()
    ds = pickle.loads(open(blob, "rb").read())  # node B
    print(len(ds))
"""


def _on_node(prefix: list[str], node: str, root: Path, env: dict[str, str],
             *args: str) -> subprocess.CompletedProcess[str]:
    """Run PICKLE on ``node``: its own mount namespace with a private tmpfs at ``root``."""
    argv = [*prefix, "sh", "-c", PRIVATE_TMPFS, str(root), sys.executable, "-c", textwrap.dedent(PICKLE), *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd="/", timeout=90, check=False,
                              env={**env, "SHAREDFS_NODE_ID": node})
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(argv, -9, "", f"hung: killed after {exc.timeout:.0f} s")


def broadcast_trap(sim: Sim) -> tuple[Outcome, Outcome]:
    """Node A prepares a Dataset in its node-local cache and sends it pickled; node B cannot open it."""
    prefix = _unshare("--mount", "--propagation", "private")
    data = _jsonl(sim)
    outcomes = []
    for label, extra in (("plain", {"SHAREDFS_DISABLE": "1"}), ("sharedfs", {"SHAREDFS_CACHE": "node-local"})):
        root = sim.work / f"node-local-{label}"
        root.mkdir()
        blob = sim.work / f"dataset-{label}.pickle"
        env = {**sim.base_env, **OFFLINE, **extra, "SHAREDFS_CACHE_ROOT": str(root), "HF_HOME": str(root / "hf_home")}
        if label == "plain":  # the user's own node-local cache, as the usual advice for Lustre goes
            env["HF_DATASETS_CACHE"] = str(root / "hf_datasets")
        sent = _on_node(prefix, "a", root, env, "send", data, str(blob))
        if sent.returncode:
            raise RuntimeError(f"node a could not prepare the dataset: {last_error(sent)}")
        got = _on_node(prefix, "b", root, env, "receive", data, str(blob))
        if got.returncode == 0:
            outcomes.append(Outcome(False, f"node b opened its own copy: {got.stdout.strip()} rows"))
            continue
        error = last_error(got)
        full = next((line for line in reversed(got.stderr.splitlines()) if "NodeLocalDatasetError:" in line), "")
        explained = all(needed in full for needed in (
            "does not exist on this node (b)", "pickles its Arrow data as a file path", "SHAREDFS_CACHE=shared",
            "main_process_first(per_node=True)"))
        if explained:
            # Still an error, but the explanatory one (cause and both fixes) instead of a bare missing
            # path: counted as fixed, and the evidence says so.
            outcomes.append(Outcome(False, "explanatory error (counted as fixed): NodeLocalDatasetError: node b "
                                           "cannot open node a's node-local Arrow file; names the cause (pickled "
                                           "as a path) and both fixes (shared cache, one preparer per node)"))
        else:
            outcomes.append(Outcome(True, f"node b: {error}"))
    return outcomes[0], outcomes[1]


def _torch_case(sim: Sim, profile: str | None) -> tuple[Outcome, Outcome]:
    """The failure torch's extension build lock has on ``profile`` (None: the local disk) with the installed
    torch and filelock (:func:`sharedfs.testing.scenario_torch.case_for`), without and with sharedfs."""
    from sharedfs.testing.scenario_torch import ToolchainMissing, case_for, run_case

    sim.counter += 1
    work = sim.work / ("torch-extension" if profile is None else f"torch-extension-{sim.counter}")
    work.mkdir()
    root, env = (work, sim.base_env) if profile is None else sim.shared_dir(profile)
    try:
        result = run_case(case_for(profile), work, root, env, hang_after=5)
    except ToolchainMissing as exc:
        raise ScenarioSkipped(str(exc)) from None
    return Outcome(not result.ok_without, result.without), Outcome(not result.ok_with, result.with_sharedfs)


def torch_extension(sim: Sim) -> tuple[Outcome, Outcome]:
    """A ``cpp_extension.load`` (how DeepSpeed builds its ops) SIGKILLed mid-compile; the rerun must load it."""
    return _torch_case(sim, None)


def torch_extension_enolck(sim: Sim) -> tuple[Outcome, Outcome]:
    """torch >= 2.14 on NFS without lockd: its build lock is filelock's flock, which answers ENOLCK."""
    return _torch_case(sim, "nfs-nolock")


def torch_extension_enosys(sim: Sim) -> tuple[Outcome, Outcome]:
    """torch >= 2.14 on Lustre without ``-o flock``: what the installed filelock does on ENOSYS."""
    from sharedfs.testing.scenario_torch import filelock_on_enosys

    if not sim.fuse and filelock_on_enosys() == "soft-fallback":
        # filelock >= 4.3 breaks a dead holder's soft lock on its own host by exchanging two names, which the
        # local disk under the LD_PRELOAD fallback can do and a FUSE (or NFS) client cannot: nothing to show here.
        why = f" ({sim.why_not_fuse})" if sim.why_not_fuse else ""
        raise ScenarioSkipped(f"needs FUSE{why}: a filesystem that refuses RENAME_EXCHANGE, as a FUSE Lustre client "
                              "does (under the LD_PRELOAD fallback the local disk lets filelock >= 4.3 break the "
                              "killed builder's lock on this host)")
    return _torch_case(sim, "lustre-noflock")


def torch_extension_two_nodes(sim: Sim) -> tuple[Outcome, Outcome]:
    """torch >= 2.14 on GPFS-like storage whose flock excludes one node only: two nodes build at once."""
    return _torch_case(sim, "localflock")


# -- a team's HF_MODULES_CACHE (transformers remote code) ---------------------------------------------


def team_modules(sim: Sim) -> tuple[Outcome, Outcome]:
    """Two real users of a lab's 2775 ``HF_HOME`` load remote-code models: without sharedfs, then with it."""
    from sharedfs.testing import scenario_team_modules as team
    from sharedfs.testing.accounts import UsersUnavailable

    try:
        scratch, (alice, bob) = team.members(sim.stack)
    except UsersUnavailable as exc:
        raise ScenarioSkipped(str(exc)) from None
    outcomes = []
    for label, extra in (("without", {"SHAREDFS_DISABLE": "1"}), ("with", {})):
        got = team.run(scratch, alice, bob, label, {**sim.base_env, **extra})
        # The evidence names HF_HOME, not this machine's scratch directory.
        a, b = (text.replace(str(scratch / f"hf-{label}"), "$HF_HOME")[:200] for text in got)
        outcomes.append(Outcome(not (a.startswith("ok") and b.startswith("ok")), f"alice acc/a: {a}; bob acc/b: {b}"))
    return outcomes[0], outcomes[1]


# -- ModelScope's hub lock and Megatron's dataset index cache ----------------------------------------

#: The ModelScope users of the ENOLCK scenario, per simulated node.
MODELSCOPE_NODES = {"a": 2, "b": 2}


def modelscope_enolck(sim: Sim) -> tuple[Outcome, Outcome]:
    """ModelScope users on 2 nodes download one file into a hub cache on NFS without lockd (modelscope#1778).

    The programs make no ``sharedfs.`` call (:mod:`sharedfs.testing.scenario_modelscope`): only the hub's
    network fetch is replaced, its ``download_file`` and lock are its own (or the modelscope shim's).
    """
    from sharedfs.testing import scenario_modelscope

    path, env = sim.shared_dir("nfs-nolock")
    outcomes = []
    for label, extra in (("without", {"SHAREDFS_DISABLE": "1"}), ("with", {})):
        reports = scenario_modelscope.run(path / f"hub-{label}", MODELSCOPE_NODES, {**env, **extra})
        failed = [r for r in reports if not r["ok"]]
        locks = sorted({str(r["lock"]) for r in reports if r["lock"]})
        evidence = f"{len(reports) - len(failed)}/{len(reports)} downloads on 2 nodes completed"
        cause = ""
        if failed:
            first = str(failed[0]["error"]).replace(f"{path}/", "")
            evidence += f"; {first[:120]}"
            cause = (f"{len(failed)} of {len(reports)} downloads failed in the hub's download lock "
                     f"({', '.join(locks) or 'none imported'}._optional_file_lock); the first: {first[:100]}")
        outcomes.append(Outcome(bool(failed), evidence, cause=cause))
    return outcomes[0], outcomes[1]


def megatron_killed_rank0(sim: Sim) -> tuple[Outcome, Outcome]:
    """Rank 0 of a Megatron job is SIGKILLed while ``numpy.save`` writes its shuffle index; then the rerun.

    megatron-core on CPU, gloo (:mod:`sharedfs.testing.scenario_megatron`).  The killed job runs stock
    (what a job that ran before sharedfs, or without it, leaves); each rerun gets a copy of its cache,
    stock and with sharedfs, both at once.
    """
    from sharedfs.testing import scenario_megatron as megatron

    work = sim.work / "megatron"
    work.mkdir()
    prefix = str(work / "tiny")
    prepared = subprocess.run([sys.executable, "-m", megatron.__name__, "prepare", prefix], capture_output=True,
                              text=True, env=sim.base_env, cwd="/", timeout=120, check=False)
    if prepared.returncode:
        raise RuntimeError(f"megatron could not write the tiny indexed dataset: {last_error(prepared)}")
    short = megatron.kill_while_writing(work / "killed", prefix, {**sim.base_env, "SHAREDFS_DISABLE": "1"})
    cut = short.stat().st_size
    jobs = []
    for label, extra in (("without", {"SHAREDFS_DISABLE": "1"}), ("with", {})):
        shutil.copytree(work / "killed", work / label)
        jobs.append(megatron.start_job(str(work / label), prefix, megatron.MANY, ["a"], {**sim.base_env, **extra}))
    reports = [megatron.finish(job)[0] for job in jobs]
    rebuilt = (work / "with" / short.name).stat().st_size
    whole = f"{rebuilt:,}" if reports[1]["ok"] else "?"
    outcomes = []
    for report, label in zip(reports, ("without", "with")):
        size = (work / label / short.name).stat().st_size
        where = f"{report.get('build') or 'megatron'}"
        if report["ok"]:
            built = f"rebuilt shuffle_index.npy whole ({size:,} bytes; the killed job's {cut:,} refused)" \
                if size != cut else f"kept shuffle_index.npy ({size:,} bytes)"
            outcomes.append(Outcome(False, f"the rerun {built} and read a sample ({where})"))
            continue
        error = str(report["error"]).replace(f"{work}/", "")
        outcomes.append(Outcome(True, f"shuffle_index.npy cut at {cut:,} bytes by the SIGKILL; the rerun: "
                                      f"{error[:120]}",
                                cause=f"the killed rank 0 left shuffle_index.npy at its final name with {cut:,} of "
                                      f"{whole} bytes; the rerun's {where} took it as built, still {size:,} bytes, "
                                      f"and failed: {error[:100]}"))
    return outcomes[0], outcomes[1]


#: A tvm-ffi process still running this long after every process imported tvm-ffi counts as hung (a build here
#: takes 2-15 s; tvm-ffi retries ENOLCK every 0.1 s, forever).
TVM_FFI_HUNG_AFTER = 10.0
TVM_FFI_NODES = {"a": 2, "b": 2}


def tvm_ffi_enolck(sim: Sim) -> tuple[Outcome, Outcome]:
    """tvm-ffi users on 2 nodes ``load_inline`` one function with HOME on NFS without lockd (tvm-ffi#667).

    The programs make no ``sharedfs.`` call (:mod:`sharedfs.testing.scenario_tvm_ffi`): tvm-ffi's own cache
    directory, build lock, ninja and compiler.
    """
    from sharedfs.testing import scenario_tvm_ffi

    missing = scenario_tvm_ffi.missing_tools()
    if missing:
        raise ScenarioSkipped(f"tvm-ffi builds with ninja and a C++ compiler; missing here: {', '.join(missing)} "
                              "(apt-get install ninja-build g++)")
    path, env = sim.shared_dir("nfs-nolock")
    count = sum(TVM_FFI_NODES.values())
    outcomes = []
    for label, extra in (("without", {"SHAREDFS_DISABLE": "1"}), ("with", {})):
        home, work = path / f"home-{label}", sim.work / f"tvm-ffi-{label}"
        home.mkdir()
        work.mkdir()
        reports, compiles = scenario_tvm_ffi.run(home, work, TVM_FFI_NODES, {**env, **extra},
                                                 hung_after=TVM_FFI_HUNG_AFTER)
        hung = sum(1 for r in reports if r.get("hung"))
        failed = [str(r["error"]) for r in reports if not r["ok"] and not r.get("hung")]
        builds = sum(compiles.values())
        locks = sorted(home.glob(".cache/tvm-ffi/**/lock"))
        evidence = (f"{count - hung - len(failed)}/{count} processes on 2 nodes built or loaded the module; "
                    f"{builds} compile{'s' if builds != 1 else ''}")
        cause = ""
        if hung:
            evidence += f"; {hung} still waiting {TVM_FFI_HUNG_AFTER:.0f} s after import (killed)"
            where = (f"waited in tvm-ffi's build lock ({len(locks)} lock file{'s' if len(locks) != 1 else ''} "
                     "under ~/.cache/tvm-ffi, 0 compiles)" if locks and not builds else
                     f"were still running ({builds} compiles, {len(locks)} lock files)")
            cause = f"{hung} of {count} processes {where} {TVM_FFI_HUNG_AFTER:.0f} s after importing tvm-ffi; killed"
        if failed:
            first = failed[0].replace(f"{path}/", "")
            evidence += f"; {first[:120]}"
            cause = cause or f"{len(failed)} of {count} processes failed; the first: {first[:120]}"
        outcomes.append(Outcome(bool(hung or failed), evidence, cause=cause))
    return outcomes[0], outcomes[1]


@dataclass(frozen=True)
class Scenario:
    name: str
    field_report: str  # public threads (keys of REFERENCES) or the project's own docs
    run: Callable[[Sim], tuple[Outcome, Outcome]]
    needs_fuse: bool = False
    #: Modules the scenario's programs import (checked in this interpreter before it runs).
    needs: tuple[str, ...] = ()
    #: What the scenario shows, in one sentence (the HTML/Markdown report).
    story: str = ""
    #: The installed release of its framework fixed this failure itself ("torch 2.14"): without sharedfs it
    #: succeeds, and the demo says so instead of counting it as not fixed.
    upstream_fix: str = ""
    #: Per real filesystem: the volume this cross-node scenario runs on there, or why it does not run there
    #: (``{fs}`` is replaced by the filesystem's name); a kind missing here does not run there either.
    real: Mapping[str, OnRealFS | str] = field(default_factory=dict)

    def on(self, fs: str) -> OnRealFS | str:
        """How this scenario runs on the real filesystem ``fs``, or one line saying why it does not."""
        plan = self.real.get(fs, NOT_CROSS_NODE)
        return plan.format(fs=fs) if isinstance(plan, str) else plan


#: Why a scenario that does not claim a behaviour of one node's view of another does not run on a real one.
NOT_CROSS_NODE = "not a cross-node filesystem behaviour: it runs on this machine's own disk"
#: The lock failures no real filesystem here has: their flock works.
ENOSYS_ONLY = "its failure is a flock that answers ENOSYS (Lustre without -o flock); flock works on {fs}"
ENOLCK_ONLY = "its failure is a flock that answers ENOLCK (NFS without lockd); flock works on {fs}"
SAME_EVERYWHERE = "its failure is {what}, the same on every filesystem (it runs on this machine's own disk)"
FLOCK_ACROSS = "its failure is a flock that excludes one node only; {fs}'s flock excludes across client mounts"


def _on_every_real(plan: OnRealFS | str) -> dict[str, OnRealFS | str]:
    return dict.fromkeys(("juicefs", "moosefs", "glusterfs"), plan)


def _torch_scenarios() -> tuple[Scenario, ...]:
    """torch's build lock, as the installed torch and filelock fail (torch missing: the scenario it is skipped as).

    torch < 2.14 builds under a ``FileBaton`` that a killed builder leaves behind, on any filesystem.
    torch >= 2.14 holds filelock's lock instead: fixed upstream on a local disk, but NFS without
    lockd, Lustre without ``-o flock`` and GPFS-like node-local flock each fail it their own way.
    """
    from sharedfs.testing.scenario_torch import UPSTREAM_FIX, builds_under_filelock, filelock_on_enosys

    killed = Scenario("torch C++ extension build killed half-way", "pytorch#189245", torch_extension,
                      needs=("torch",), story="A cpp_extension.load() (how DeepSpeed builds its ops) is SIGKILLed "
                                              "mid-compile; the rerun must load the extension.",
                      real=_on_every_real(SAME_EVERYWHERE.format(what="the lock file a killed builder left")))
    if not builds_under_filelock():
        return (killed,)
    enosys = {
        "soft-fallback": "filelock >= 4.3 falls back to a soft lock (the file's existence); a load() is SIGKILLed "
                         "mid-compile, and the rerun must load the extension.",
        "swaps-class": "filelock 3.24-4.2 swaps the lock's class for SoftFileLock mid-acquire, which breaks "
                       "torch's FileLock subclass in __exit__.",
        "raises": "filelock before 3.24 raises where flock answers ENOSYS.",
    }[filelock_on_enosys()]
    return (
        replace(killed, upstream_fix=UPSTREAM_FIX,
                story=killed.story + f" {UPSTREAM_FIX} holds a flock instead of a baton, which the kernel drops "
                                     "with the killed builder."),
        Scenario("torch C++ extension build on NFS without lockd (ENOLCK)", "pytorch#189245", torch_extension_enolck,
                 needs=("torch",), story=f"{UPSTREAM_FIX}+ builds under filelock's flock, which NFS without lockd "
                                         "refuses with ENOLCK: every load() fails, the first build included.",
                 real=_on_every_real(ENOLCK_ONLY)),
        Scenario("torch C++ extension build on Lustre without -o flock (ENOSYS)", "pytorch#189245",
                 torch_extension_enosys, needs=("torch",),
                 story=f"{UPSTREAM_FIX}+ builds under filelock's flock, which this Lustre answers with ENOSYS: "
                       + enosys, real=_on_every_real(ENOSYS_ONLY)),
        Scenario("torch C++ extensions built by two nodes at once (GPFS, localflock)", "pytorch#189245",
                 torch_extension_two_nodes, True, needs=("torch",),
                 story=f"{UPSTREAM_FIX}+ builds under filelock's flock, which excludes processes of one node only: "
                       "node b loads the extension while node a builds it.",
                 real={"juicefs": FLOCK_ACROSS, "glusterfs": FLOCK_ACROSS,
                       "moosefs": "not wired to client mounts yet: its two builders share one path, and MooseFS "
                                  "with node-local locks has the behaviour (a gap, not a result)"}),
    )


SCENARIOS = (
    Scenario("datasets, Lustre without -o flock (ENOSYS)", "datasets#6395", datasets_enosys, needs=("datasets",),
             story=f"Hugging Face datasets with {OLD_FILELOCK} (cluster images often pin one before 3.24) on a "
                   "filesystem whose flock answers ENOSYS.", real=_on_every_real(ENOSYS_ONLY)),
    Scenario("datasets, NFS without lockd (ENOLCK)", "datasets#1672", datasets_enolck, needs=("datasets",),
             story="datasets on an NFS mount whose lock daemon is not running: every lock call answers ENOLCK.",
             real=_on_every_real(ENOLCK_ONLY)),
    Scenario("flock that excludes one node only (GPFS, localflock)", "filelock#389", node_local_flock, True,
             story="8 processes on 2 nodes increment one counter under filelock.FileLock; flock succeeds but "
                   "excludes only processes on the same node.",
             # Run on every real one, whatever its flock does: the cause printed is the one the run shows.
             real={"juicefs": OnRealFS(), "glusterfs": OnRealFS(),
                   "moosefs": OnRealFS(node_local_locks=True)}),
    Scenario("6 ranks makedirs on a lagging filesystem", "lingua#49, pytorch#92553", makedirs_race, True,
             needs=("torch",),
             story="6 ranks on 3 nodes run lingua's CheckpointManager and maybe_run_profiler (os.makedirs, "
                   "exist_ok=True) and torch DCP's save (Path.mkdir) unchanged while the metadata cache lags 3 s.",
             real=_on_every_real(OnRealFS())),
    Scenario("rank 0 made a dir, other node waits 10 s (OLMo-core)", "OLMo#829", visibility_timeout, True,
             story="4 ranks on 2 nodes save a checkpoint with OLMo-core 3.0.0's save_state_dict, unchanged, while "
                   "the other node's metadata cache hides the new directory for 13 s; OLMo-core waits a fixed 10 s.",
             real=_on_every_real("its failure needs a metadata cache that lags longer than OLMo-core's 10 s wait; "
                                 "{fs}'s lagging client caches lag 3 s")),
    Scenario("lock of a killed job on another node", "srt-slurm#251, modelscope#1778", stale_lock,
             story="A job on node A is killed while it holds an existence lock; the rerun on node B wants it.",
             real=_on_every_real(SAME_EVERYWHERE.format(what="an existence lock whose holder is on another host "
                                                             "(its own namespaces)"))),
    Scenario("a live lock is never broken", "docs/troubleshooting.md", live_lock,
             story=f"Two containers with one host name but separate PID namespaces (one pod; or nodes whose "
                   f"containers share a name), {OLD_FILELOCK}: A holds an existence lock and works on, B wants it "
                   "and must wait, never break it.",
             real=_on_every_real(SAME_EVERYWHERE.format(what="a holder's pid read in another PID namespace"))),
    Scenario("wids cache on storage without flock (ENOLCK)", "webdataset#386", wids_flockless,
             needs=("wids", "torch"),
             story="2 wids readers on 2 nodes share a cache directory on NFS without lockd.",
             real=_on_every_real(ENOLCK_ONLY)),
    Scenario("8 webdataset readers share one cache_dir", "webdataset#386", webdataset_duplicates,
             needs=("webdataset",),
             story="8 webdataset readers on 2 nodes share one cache_dir on network storage.",
             real=_on_every_real("webdataset takes no lock at all, so its duplicate downloads do not depend on "
                                 "the filesystem (the hostilefs run shows them)")),
    Scenario("Dataset from a node-local cache sent to another node", "LlamaFactory#3065, ms-swift#3667",
             broadcast_trap, needs=("datasets",),
             story="Node A prepares a dataset in its node-local cache and broadcasts it pickled to node B.",
             real=_on_every_real("its failure is node-local storage (a private tmpfs per node), not the shared "
                                 "filesystem")),
    Scenario("9 processes fill one Triton kernel cache", "triton#2688, prime-rl PR #2305", triton_cache, True,
             needs=("triton",),
             story="9 processes on 3 nodes put and read the same 6 kernels through triton.runtime.cache's own "
                   "get_cache_manager, as triton.compiler.compile does, while the metadata cache lags 2 s.",
             real=_on_every_real(OnRealFS())),
    *_torch_scenarios(),
    Scenario("two users of a team HF_HOME load remote code (transformers)", "diffusers#1517", team_modules,
             needs=("transformers",),
             story="Two real users of a lab's HF_HOME (2775, its group; umask 022) load remote-code models with "
                   "AutoConfig.from_pretrained(repo, trust_remote_code=True): alice acc/a, then bob acc/b.",
             real=_on_every_real(SAME_EVERYWHERE.format(what="a team directory's modes"))),
    Scenario("ModelScope download on NFS without lockd (ENOLCK)", "modelscope#1778", modelscope_enolck,
             needs=("modelscope_hub",),
             story="4 ModelScope users on 2 nodes download one file into a hub cache on NFS without lockd, through "
                   "modelscope_hub's own download_file and lock (the network fetch replaced locally).",
             real=_on_every_real(ENOLCK_ONLY)),
    Scenario("Megatron index after a killed rank 0", "docs/frameworks/megatron.md", megatron_killed_rank0,
             needs=("megatron",),
             story="Rank 0 of a megatron-core job (GPTDataset on CPU, gloo) is SIGKILLed while numpy.save writes "
                   "its shuffle index in path_to_cache; the rerun builds the datasets from that cache.",
             real=_on_every_real(SAME_EVERYWHERE.format(what="an index file a killed rank 0 left cut short"))),
    Scenario("tvm-ffi JIT build on NFS without lockd (ENOLCK)", "tvm-ffi#667", tvm_ffi_enolck, needs=("tvm_ffi",),
             story="4 processes on 2 nodes JIT-build one C++ function with tvm_ffi.cpp.load_inline, HOME on NFS "
                   "without lockd: tvm-ffi's build lock takes ENOLCK for \"held\" and retries every 0.1 s.",
             real=_on_every_real(ENOLCK_ONLY)),
)
