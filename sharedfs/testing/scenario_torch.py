"""A torch C++ extension build killed half-way, and the load() that comes after it.

``torch.utils.cpp_extension.load()`` (how DeepSpeed, and so XTuner, JIT-compile ops)
serialises builds with ``<build_dir>/lock``, created ``O_EXCL`` and removed only when
the build returns.  A builder killed by Slurm, the OOM killer or Ctrl-C leaves it, and
every later ``load()`` of that extension, on every node, waits forever without a word
(pytorch#189245).  :func:`torch_extension_stale_lock` reproduces it without sharedfs and
shows the rerun rebuilding with it; the tests (``tests/integration/test_torch.py``) use
the same :class:`Toolchain` and programs.

The extension (``torch_ext/answer.cpp``) includes ``Python.h`` only, so a build takes
well under a second.  The compiler is a wrapper script (:class:`Toolchain`) that counts
its compilations and can be held mid-compile, so "killed half-way" is exact, not a race.
"""

from __future__ import annotations

import json
import os
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

__all__ = ["EXTENSION", "LOAD", "SOURCE", "Toolchain", "ToolchainMissing", "TorchScenario", "kill_mid_build",
           "run_load", "start_load", "torch_extension_stale_lock", "toolchain"]

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

    Not just its process group: ninja starts each command in a process group of its own.
    """
    for pid in [proc.pid, *_session_members(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


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
        if len(fields) > 3 and int(fields[3]) == session:  # field 6 of stat: the session id
            members.append(int(entry))
    return members


class TorchScenario(NamedTuple):
    """What :func:`torch_extension_stale_lock` saw: did the rerun load the extension, without and with sharedfs."""

    ok_without: bool
    ok_with: bool
    without: str  # evidence, one line each
    with_sharedfs: str


def torch_extension_stale_lock(work: Path, env: Mapping[str, str] | None = None, *,
                               hang_after: float = 10.0) -> TorchScenario:
    """A ``load()`` killed mid-build, then a rerun of it: without sharedfs (it waits forever: shown by
    ``hang_after`` seconds), and with sharedfs (the dead builder's lock is broken and the rerun rebuilds).

    ``work`` is an empty directory (the extensions root goes below it; put it on a hostile mount to
    show the same on Lustre or NFS); ``env`` the base environment (default: this process's, without
    ``SHAREDFS_*``).  Raises :class:`ToolchainMissing` when no C++ compiler, ninja or Python.h is here.
    """
    base = {k: v for k, v in (os.environ if env is None else env).items() if not k.startswith("SHAREDFS_")}
    chain = toolchain(work)
    results = []
    for side, extra in (("without", {"SHAREDFS_DISABLE": "1"}), ("with", {})):
        extensions = work / side / "torch_extensions"
        side_env = chain.env(base, extensions, **extra)
        kill_mid_build(chain, side_env)
        started = time.monotonic()
        # The hang is shown for hang_after seconds; a rerun that recovers gets a minute (a loaded machine).
        rerun = answer(run_load(side_env, hang_after if side == "without" else max(hang_after, 60.0)))
        took = time.monotonic() - started
        left = extensions / EXTENSION / "lock"
        if rerun is None or rerun.get("answer") != 42:
            results.append((False, f"the rerun's load() still waited after {hang_after:.0f} s: the killed build left "
                                   f"{left.relative_to(work)}{' (empty)' if _empty(left) else ''}, and torch waits "
                                   "for it forever"))
        else:
            results.append((True, f"the rerun rebuilt the extension and loaded it in {took:.1f} s (the killed "
                                  "builder's lock named it, and it was gone)"))
    (ok_without, without), (ok_with, with_sharedfs) = results
    return TorchScenario(ok_without, ok_with, without, with_sharedfs)


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False
