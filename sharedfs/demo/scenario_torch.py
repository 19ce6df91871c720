"""torch C++ extension builds on cluster storage: the failure the installed torch and filelock have, and its fix.

``torch.utils.cpp_extension.load()`` (how DeepSpeed, and so XTuner, JIT-compile ops)
serialises builds with ``<build_dir>/lock``.  Which failure that lock has depends on the
installed releases (:func:`case_for`):

* torch < 2.14: a ``FileBaton``, the file created ``O_EXCL`` and removed only when the
  build returns.  A builder killed by Slurm, the OOM killer or Ctrl-C leaves it, and every
  later ``load()`` of that extension, on every node, waits forever without a word
  (pytorch#189245), on any filesystem.
* torch >= 2.14 (pytorch#189245's fix): ``torch.utils._filelock.FileLock`` (filelock's
  flock), which the kernel drops with a killed builder: fixed upstream on a local disk.  On
  cluster storage the lock has filelock's failures instead: NFS without lockd fails every
  ``load()`` (ENOLCK, every filelock); Lustre without ``-o flock`` (ENOSYS) leaves a soft
  lock behind a killed builder that hangs the rerun (filelock >= 4.3), breaks torch's
  subclass in ``__exit__`` (filelock 3.24-4.2) or raises (older filelock); GPFS-like
  ``localflock`` lets two nodes compile into one build directory at once.

:func:`run_case` shows a case without sharedfs and then with it; the demo
(:mod:`sharedfs.demo.scenarios`) and the tests (``tests/integration/test_torch.py``)
run the same cases, with the same :class:`Toolchain` and programs.

The extension (``torch_ext/answer.cpp``) includes ``Python.h`` only, so a build takes
well under a second.  The compiler is a wrapper script (:class:`Toolchain`) that counts
its compilations and can be held mid-compile, so "killed half-way" and "two builds at
once" are exact, not races.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, NamedTuple

from packaging.version import InvalidVersion, Version

__all__ = ["EXTENSION", "FILELOCK_TORCH", "FIXED_UPSTREAM", "LOAD", "PROFILES", "SOURCE", "UPSTREAM_FIX", "Case",
           "Toolchain", "ToolchainMissing", "TorchScenario", "builds_under_filelock", "case_for", "filelock_on_enosys",
           "kill_mid_build", "release", "run_case", "run_load", "start_load", "toolchain",
           "torch_extension_stale_lock"]

SOURCE = Path(__file__).with_name("torch_ext") / "answer.cpp"
EXTENSION = "sharedfs_answer"

#: One extension user: load (building if needed) and call it; argv: extension name, source file.
LOAD = textwrap.dedent("""
    import json, sys, time
    started = time.monotonic()
    from torch.utils.cpp_extension import load
    module = load(sys.argv[1], [sys.argv[2]], verbose=False)
    print(json.dumps({"answer": module.answer(), "seconds": round(time.monotonic() - started, 2)}), flush=True)
""")

#: The compiler wrapper: count each compilation (``-c``), hold it while the stall file exists, run the real one.
_WRAPPER = """#!/bin/sh
# sharedfs test compiler: logs each compilation, waits while {stall} exists, then runs {real}.
case " $* " in
  *" -c "*)
    echo "$$" >> {log}
    while [ -e {stall} ]; do sleep 0.05; done ;;
esac
exec {real} "$@"
"""


class ToolchainMissing(RuntimeError):
    """No C++ compiler, ninja or Python headers: the message says what to install."""


@dataclass(frozen=True)
class Toolchain:
    """A C++ compiler that counts its compilations and can be held mid-compile, and where ninja is."""

    compiler: Path
    log: Path
    stall: Path
    ninja_dir: str

    def env(self, base: Mapping[str, str], extensions_dir: Path | None = None, **extra: str) -> dict[str, str]:
        """``base`` with this compiler (``CXX``), ninja on ``PATH``, one build job, and the extensions root."""
        env = dict(base)
        # ninja goes last on PATH: where it is (/usr/bin, a venv) may hold other programs a test replaces.
        env.update(CXX=str(self.compiler), MAX_JOBS="1", PATH=os.pathsep.join([env.get("PATH", ""), self.ninja_dir]))
        if extensions_dir is not None:
            env["TORCH_EXTENSIONS_DIR"] = str(extensions_dir)
        env.update(extra)
        return env

    def compiles(self) -> int:
        """How many compilations have started since this toolchain was made."""
        try:
            return len(self.log.read_text().split())
        except FileNotFoundError:
            return 0

    def hold(self) -> None:
        """From now on every compilation waits (a build that can be killed half-way) ..."""
        self.stall.touch()

    def let_go(self) -> None:
        """... until this is called."""
        self.stall.unlink(missing_ok=True)


def toolchain(work: Path) -> Toolchain:
    """Write the compiler wrapper under ``work``; raises :class:`ToolchainMissing` naming what to install."""
    real = shutil.which("g++") or shutil.which("c++")
    if real is None:
        raise ToolchainMissing("no C++ compiler: apt-get install g++")
    ninja = shutil.which("ninja") or shutil.which("ninja", path=os.path.dirname(sys.executable))
    if ninja is None:
        raise ToolchainMissing("no ninja: apt-get install ninja-build (or pip install ninja)")
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        raise ToolchainMissing("no Python.h for this interpreter: apt-get install python3-dev")
    bin_dir = work / "toolchain"
    bin_dir.mkdir(parents=True, exist_ok=True)
    chain = Toolchain(bin_dir / "wrapped-g++", bin_dir / "compiles.log", bin_dir / "stall", os.path.dirname(ninja))
    # torch accepts a compiler whose path names g++ without asking it for its version.
    chain.compiler.write_text(_WRAPPER.format(log=_sh(chain.log), stall=_sh(chain.stall), real=_sh(Path(real))))
    chain.compiler.chmod(0o755)
    return chain


def _sh(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


def start_load(env: Mapping[str, str], name: str = EXTENSION) -> subprocess.Popen[str]:
    """Start one ``load()`` in a session of its own: killing the session takes ninja and the compiler along."""
    return subprocess.Popen([sys.executable, "-c", LOAD, name, str(SOURCE)], env=dict(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, cwd="/")


def finish(proc: subprocess.Popen[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """Wait for a :func:`start_load`; ``None`` when it is still running after ``timeout`` (it is then killed)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        proc.communicate()
        return None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_load(env: Mapping[str, str], timeout: float, name: str = EXTENSION) -> subprocess.CompletedProcess[str] | None:
    """One ``load()``; ``None`` when it hangs for ``timeout`` seconds."""
    return finish(start_load(env, name), timeout)


def answer(done: subprocess.CompletedProcess[str] | None) -> dict[str, float] | None:
    """What a finished :func:`start_load` printed (``answer``, ``seconds``), or ``None`` when it failed or hung."""
    if done is None or done.returncode != 0:
        return None
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else None


def kill_mid_build(chain: Toolchain, env: Mapping[str, str], timeout: float = 60.0, name: str = EXTENSION) -> int:
    """Start a build, SIGKILL its whole session while the compiler runs (Slurm, OOM killer); returns its pid."""
    before = chain.compiles()
    chain.hold()
    builder = start_load(env, name)
    try:
        deadline = time.monotonic() + timeout
        while chain.compiles() == before:
            if builder.poll() is not None:
                raise RuntimeError(f"the build ended before it compiled: {builder.communicate()[1][-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the build did not start compiling within {timeout:.0f} s")
            time.sleep(0.05)
    finally:
        _kill_session(builder)
        builder.communicate()
        chain.let_go()
    return builder.pid


def _kill_session(proc: subprocess.Popen[str]) -> None:
    """SIGKILL every process of ``proc``'s session, as Slurm kills a job's cgroup.

    Not just its process group: ninja starts each command in a process group of its own.  Listed again until
    none is left: a compiler ninja forked after a listing would otherwise live on and finish the module later.
    """
    deadline = time.monotonic() + 10.0
    while True:
        members = [pid for pid in [proc.pid, *_session_members(proc.pid)] if pid != proc.pid or proc.poll() is None]
        if not members or time.monotonic() > deadline:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def _session_members(session: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # Field 6 of stat is the session id; a zombie (state Z) is dead already.
        if len(fields) > 3 and int(fields[3]) == session and fields[0] != b"Z":
            members.append(int(entry))
    return members


class TorchScenario(NamedTuple):
    """What :func:`run_case` saw: did the program succeed, without and with sharedfs."""

    ok_without: bool
    ok_with: bool
    without: str  # evidence, one line each
    with_sharedfs: str


# -- which failure the installed releases have ----------------------------------------------------

#: From this torch release on, ``_jit_compile`` holds ``torch.utils._filelock.FileLock(<build_dir>/lock)``
#: instead of a ``FileBaton`` (pytorch#189245's fix).
FILELOCK_TORCH = (2, 14)
UPSTREAM_FIX = "torch 2.14"
#: How a failure fixed upstream for the installed torch is reported (the demo's verdict, the tests' ids).
FIXED_UPSTREAM = f"fixed upstream in {UPSTREAM_FIX} (sharedfs keeps older releases safe)"
#: The filesystems a case runs on: ``None`` is the local disk, the others are hostilefs profiles.
PROFILES: tuple[str | None, ...] = (None, "nfs-nolock", "lustre-noflock", "localflock")


def release(distribution: str) -> tuple[int, ...] | None:
    """The installed ``distribution``'s release numbers (``2.14.1+cu130`` -> ``(2, 14, 1)``), from its metadata."""
    try:
        return Version(importlib.metadata.version(distribution)).release
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return None


def builds_under_filelock(torch_release: tuple[int, ...] | None = None) -> bool:
    """Whether the installed torch builds extensions under filelock (>= 2.14), not a ``FileBaton``."""
    found = release("torch") if torch_release is None else torch_release
    return found is not None and found >= FILELOCK_TORCH


def filelock_on_enosys(filelock_release: tuple[int, ...] | None = None) -> str:
    """What the installed filelock's ``FileLock`` does where flock answers ENOSYS (Lustre without ``-o flock``).

    ``"raises"`` (< 3.24: "FileSystem does not appear to support flock"); ``"swaps-class"``
    (3.24-4.2: falls back to ``SoftFileLock`` by changing the lock's class mid-acquire, which
    breaks a subclass's ``super()`` -- torch's, in ``__exit__``); ``"soft-fallback"`` (>= 4.3:
    the same lock object holds the file's existence, a soft lock a killed holder leaves behind).
    """
    found = release("filelock") if filelock_release is None else filelock_release
    if found is None or found < (3, 24):
        return "raises"
    return "swaps-class" if found < (4, 3) else "soft-fallback"


@dataclass(frozen=True)
class Case:
    """One way ``<build_dir>/lock`` fails on one filesystem, for the installed torch and filelock."""

    profile: str | None  # None: the local disk; else the hostilefs profile
    #: ``"killed"`` (a build is killed half-way, then rerun), ``"first-load"`` (the first load() fails),
    #: ``"two-nodes"`` (two nodes load at once).
    story: str
    #: The test id, and the demo's words for the failure.
    key: str
    #: What the failing side's evidence contains (a test asserts it).
    expect: str
    #: The installed torch fixed this one itself: the side without sharedfs must succeed.
    fixed_upstream: bool = False

    @property
    def id(self) -> str:
        return f"{self.profile or 'local-disk'}-{self.key}"


def case_for(profile: str | None, torch_release: tuple[int, ...] | None = None,
             filelock_release: tuple[int, ...] | None = None) -> Case:
    """The failure ``<build_dir>/lock`` has on ``profile`` with the installed (or the given) releases."""
    if not builds_under_filelock(torch_release):
        return Case(profile, "killed", "stale-baton", "waits for it forever")
    if profile is None:
        return Case(profile, "killed", "fixed-upstream-in-torch-2.14", "rebuilt", fixed_upstream=True)
    if profile == "nfs-nolock":
        return Case(profile, "first-load", "ENOLCK", "No locks available")
    if profile == "localflock":
        return Case(profile, "two-nodes", "two-nodes-compile-at-once", "2 compilations at once")
    if profile == "lustre-noflock":
        behaviour = filelock_on_enosys(filelock_release)
        if behaviour == "soft-fallback":
            return Case(profile, "killed", "ENOSYS-soft-lock-outlives-the-killed-builder", "waits for it forever")
        if behaviour == "swaps-class":
            return Case(profile, "first-load", "ENOSYS-class-swap", "super(type, obj): obj must be an instance")
        return Case(profile, "first-load", "ENOSYS-raises", "does not appear to support flock")
    raise ValueError(f"no torch build case for the filesystem profile {profile!r}")


# -- running a case: without sharedfs, then with it -------------------------------------------------

SIDES: tuple[tuple[str, dict[str, str]], ...] = (("without", {"SHAREDFS_DISABLE": "1"}), ("with", {}))


def run_case(case: Case, work: Path, root: Path, env: Mapping[str, str] | None = None, *,
             hang_after: float = 10.0) -> TorchScenario:
    """Run ``case`` without sharedfs, then with it, building into ``root/<side>/torch_extensions``.

    ``work`` is an empty local directory (the compiler wrapper goes there); ``root`` the
    directory on the case's filesystem (the local disk, or a hostilefs mount of
    ``case.profile``); ``env`` the base environment (default: this process's), without its
    ``SHAREDFS_*`` settings but with a ``LD_PRELOAD`` fault library's (``SHAREDFS_FAULT_*``,
    :mod:`sharedfs.demo.preload`).  A program that hangs is shown hanging for
    ``hang_after`` seconds; one that recovers gets a minute.  Raises
    :class:`ToolchainMissing` when no C++ compiler, ninja or Python.h is here.
    """
    base = {k: v for k, v in (os.environ if env is None else env).items()
            if not k.startswith("SHAREDFS_") or k.startswith("SHAREDFS_FAULT_")}
    chain = toolchain(work)
    run = {"killed": _killed, "first-load": _first_load, "two-nodes": _two_nodes}[case.story]
    results = [run(case, chain, root / side / "torch_extensions", {**base, **extra}, side == "without", hang_after)
               for side, extra in SIDES]
    (ok_without, without), (ok_with, with_sharedfs) = results
    return TorchScenario(ok_without, ok_with, without, with_sharedfs)


def _killed(case: Case, chain: Toolchain, extensions: Path, base: dict[str, str], plain: bool,
            hang_after: float) -> tuple[bool, str]:
    """A ``load()`` SIGKILLed mid-compile, then a rerun on the same node: does the rerun load the extension?"""
    env = chain.env(base, extensions)
    kill_mid_build(chain, env)
    started = time.monotonic()
    # The hang is shown for hang_after seconds; a rerun that recovers gets a minute (a loaded machine).
    rerun = answer(run_load(env, hang_after if plain and not case.fixed_upstream else max(hang_after, 60.0)))
    took = time.monotonic() - started
    left = extensions / EXTENSION / "lock"
    shown = Path(*left.parts[-4:])
    if rerun is None or rerun.get("answer") != 42:
        if case.key == "stale-baton":
            what = f"{shown}{' (empty)' if _empty(left) else ''}, and torch waits for it forever"
        else:
            what = (f"{shown} ({_soft_record(left)}), a soft lock filelock breaks only on its own host and only by "
                    "an atomic exchange of names this filesystem refuses, so it waits for it forever")
        return False, f"the rerun's load() still waited after {hang_after:.0f} s: the killed build left {what}"
    if plain and case.fixed_upstream:
        return True, (f"the rerun rebuilt the extension and loaded it in {took:.1f} s: {UPSTREAM_FIX} holds a "
                      "flock, which went with the killed builder (pytorch#189245's fix)")
    if case.key == "stale-baton":
        return True, (f"the rerun rebuilt the extension and loaded it in {took:.1f} s (the killed builder's lock "
                      "named it, and it was gone)")
    return True, (f"the rerun rebuilt the extension and loaded it in {took:.1f} s (no lock outlived the killed "
                  "builder: sharedfs knew its holder was gone)")


def _first_load(case: Case, chain: Toolchain, extensions: Path, base: dict[str, str], plain: bool,
                hang_after: float) -> tuple[bool, str]:
    """The first ``load()`` of an extension: does it build and load?"""
    started = time.monotonic()
    done = run_load(chain.env(base, extensions), max(hang_after, 120.0))
    if answer(done) is not None:
        return True, f"load() built the extension and loaded it in {time.monotonic() - started:.1f} s"
    if done is None:
        return False, "load() hung"
    return False, f"load() failed: {_error_line(done.stderr)}"


def _two_nodes(case: Case, chain: Toolchain, extensions: Path, base: dict[str, str], plain: bool,
               hang_after: float) -> tuple[bool, str]:
    """Node a builds (held mid-compile); node b loads the same extension meanwhile: does b compile too?"""
    from sharedfs.demo.nodes import node_env

    on_a = chain.env(node_env("a", base), extensions)
    on_b = chain.env(node_env("b", base), extensions)
    before = chain.compiles()
    chain.hold()
    try:
        builder = start_load(on_a)
        _wait_for_compiles(chain, before + 1, builder, 60.0)
        second = start_load(on_b)
        # b imports torch (2-3 s, more on a loaded machine), then reaches the lock: without sharedfs the wait ends
        # as soon as b compiles too; with it, b must not compile for hang_after seconds.
        deadline = time.monotonic() + (30.0 if plain else hang_after)
        while chain.compiles() < before + 2 and time.monotonic() < deadline and second.poll() is None:
            time.sleep(0.05)
        at_once = chain.compiles() - before
    finally:
        chain.let_go()
    finished = [finish(proc, 120.0) for proc in (builder, second)]
    failed = [done for done in finished if (answer(done) or {}).get("answer") != 42]
    total = chain.compiles() - before
    if at_once > 1:
        broken = ""
        if failed:  # two compilers and linkers wrote one build directory: a load may find a half-written module
            why = _error_line(failed[0].stderr) if failed[0] is not None else "hung"
            broken = f"; {len(failed)} of the 2 then failed: {why}"
        return False, (f"{at_once} compilations at once: node b compiled the extension into the same build "
                       f"directory while node a's build ran (flock excludes processes of one node only){broken}")
    if failed:
        return False, f"{2 - len(failed)}/2 nodes loaded the extension ({total} compilations)"
    return True, f"node b waited for node a's build and loaded it: {total} compilation for 2 nodes"


def _wait_for_compiles(chain: Toolchain, count: int, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while chain.compiles() < count:
        if proc.poll() is not None:
            raise RuntimeError(f"the build ended before it compiled: {proc.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            _kill_session(proc)
            raise RuntimeError(f"the build did not start compiling within {timeout:.0f} s")
        time.sleep(0.05)


def _error_line(stderr: str) -> str:
    """The exception a failed load() ended with (its last ``SomethingError: ...`` line), shortened."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"[\w.]+(Error|Exception|Timeout): ", line)]
    return (errors or lines or ["(no output)"])[-1][:160]


def _soft_record(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").split("\n")
    except OSError:
        return "gone"
    return f"pid {lines[0]}'s record" if lines and lines[0].isdigit() else "no record"


def torch_extension_stale_lock(work: Path, env: Mapping[str, str] | None = None, *,
                               hang_after: float = 10.0) -> TorchScenario:
    """A ``load()`` killed mid-build on the local disk, then a rerun, without and with sharedfs (:func:`run_case`).

    torch < 2.14: the rerun waits forever for the killed builder's baton without sharedfs;
    torch >= 2.14 recovers by itself (:data:`FIXED_UPSTREAM`).  ``work`` is an empty
    directory (the extensions root goes below it too).
    """
    return run_case(case_for(None), work, work, env, hang_after=hang_after)


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False
