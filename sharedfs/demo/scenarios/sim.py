"""The simulated cluster a scenario runs on (:class:`Sim`), its two outcomes, and the install hints of a skip."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

#: The last filelock release whose FileLock raises NotImplementedError on ENOSYS (datasets#6395);
#: 3.24 and later fall back to SoftFileLock themselves.  Cluster images often pin older releases.
OLD_FILELOCK = "filelock==3.23.0"

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
#: :mod:`sharedfs.demo.realfs` (one client mount per node).
FILESYSTEMS = ("hostilefs", "juicefs", "moosefs", "glusterfs")


@dataclass(frozen=True)
class OnRealFS:
    """The volume a cross-node scenario needs on a real filesystem (:func:`sharedfs.demo.realfs.volume`)."""

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
        from sharedfs.demo.realfs import RealFSUnavailable, volume

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
            from sharedfs.demo.hostilefs import FuseUnavailable, mount

            root = self.work / f"fs{self.counter}"
            (root / "backing").mkdir(parents=True)
            (root / "mnt").mkdir()
            try:
                handle = self.stack.enter_context(mount(root / "backing", root / "mnt", profile, lag_ms=lag_ms))
            except FuseUnavailable as exc:
                raise ScenarioSkipped(f"the FUSE filesystem could not be mounted: {exc}") from None
            return Path(handle.path), dict(self.base_env)
        from sharedfs.demo.preload import PreloadUnavailable, preload_env

        path = self.work / f"fs{self.counter}"
        path.mkdir()
        errno_name = {"lustre-noflock": "ENOSYS", "nfs-nolock": "ENOLCK"}[profile]
        try:
            return path, preload_env([str(path)], errno_name, base=self.base_env)
        except PreloadUnavailable as exc:
            raise ScenarioSkipped(f"the LD_PRELOAD fault library is unavailable: {exc}") from None


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
