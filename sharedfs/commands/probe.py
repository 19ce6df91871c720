"""Try, on a real directory, the filesystem operations sharedfs relies on: ``sharedfs doctor``'s probes.

Its output schema and checks: docs/cli.md, "The probes in doctor --json"."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

from sharedfs.commands import probeworker
from sharedfs.commands.probeworker import Result, _result

__all__ = ["CHECKS", "SCHEMA_VERSION", "probe"]

SCHEMA_VERSION = 1

CHECKS = (
    "flock",
    "flock_excludes",
    "posix",
    "posix_excludes",
    "o_excl",
    "link",
    "rename_replace",
    "fsync",
)

# A hung lock call means the lock service is stuck, not the filesystem: the
# dependent exclusion check is skipped and the other checks still run.  Any
# other step hanging means the filesystem itself is stuck: stop there.
_LOCK_CHECKS = {"flock": "flock_excludes", "posix": "posix_excludes"}


def probe(path: str | os.PathLike[str], timeout: float = 10.0) -> dict[str, Any]:
    """Try flock, POSIX locks, ``O_EXCL``, ``link``, ``rename`` and ``fsync`` under ``path``.

    Never raises for a filesystem problem (an unwritable or missing ``path``
    is reported in ``"error"``) and never waits much longer than ``timeout``
    seconds for any single step.  See the module docstring for the schema.
    """
    started = time.monotonic()
    path = os.path.abspath(os.fspath(path))
    node = socket.gethostname()
    workdir = os.path.join(path, f".sharedfs-probe-{node}-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    report: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "path": path,
        "node": node,
        "workdir": workdir,
        "writable": None,
        "error": None,
        "seconds": 0.0,
        "results": {name: _result(False, "not run") for name in CHECKS},
        "cleanup": _result(False, "not run"),
    }

    pending = ["setup", *CHECKS]
    created = True  # assume the directory may exist until setup says otherwise
    made: list[int] | None = None  # its (st_dev, st_ino), once setup has said: later workers open only that
    cleaned = False
    while pending:
        # A worker that gets through its checks cleans up too, through the descriptor it worked in.
        outcome = _run_worker(workdir, [*pending, "cleanup"], timeout, made)
        for step, result in outcome.results:
            if step == "cleanup":
                report["cleanup"], cleaned = result, True
            if step not in pending:  # cleared by an earlier failure
                continue
            pending.remove(step)
            if step == "setup":
                made = result.pop("made", None)
                created = _apply_setup(report, result)
                if not result["ok"]:
                    pending.clear()
            else:
                report["results"][step] = result
        if outcome.failed is None:
            continue
        step, result = outcome.failed
        if step == "cleanup":
            report["cleanup"], cleaned = result, True
        if step not in pending:  # already recorded
            continue
        pending.remove(step)
        if step == "setup":
            report["writable"] = None
            report["error"] = f"creating a directory in {path} {result['detail']}"
            for name in CHECKS:
                report["results"][name] = _result(False, "not run: creating the work directory hung")
            pending.clear()
            break
        report["results"][step] = result
        if result["timed_out"] and step in _LOCK_CHECKS:
            dependent = _LOCK_CHECKS[step]
            if dependent in pending:
                pending.remove(dependent)
                report["results"][dependent] = _result(False, f"not run: the {step} call hung")
        elif result["timed_out"] or not outcome.results:
            # The filesystem is stuck, or the worker cannot run at all.
            why = "hung" if result["timed_out"] else "stopped the probe worker"
            for rest in pending:
                report["results"][rest] = _result(False, f"not run: the {step} check {why}")
            pending.clear()

    if created and not cleaned:
        outcome = _run_worker(workdir, ["cleanup"], timeout, made)
        if outcome.results:
            report["cleanup"] = outcome.results[0][1]
        elif outcome.failed is not None:
            report["cleanup"] = outcome.failed[1]
    elif not created:
        report["cleanup"] = _result(True, "nothing was created")
    report["seconds"] = round(time.monotonic() - started, 4)
    return report


def _apply_setup(report: dict[str, Any], result: Result) -> bool:
    """Record the setup step; return whether the work directory may exist."""
    if result["ok"]:
        report["writable"] = True
        return True
    report["writable"] = result["errno"] == "ESTALE"  # it made the directory: writable, but not for this run
    uid = os.geteuid()
    reason = {
        "EACCES": f"{report['path']} is not writable by uid {uid}",
        "EPERM": f"{report['path']} is not writable by uid {uid}",
        "EROFS": f"{report['path']} is not writable: read-only filesystem",
        "ENOENT": f"{report['path']} does not exist",
        "ENOTDIR": f"{report['path']} is not a directory",
        "ESTALE": (f"someone else renamed or replaced the directory this probe made in {report['path']} at once "
                   f"(any writer of a directory that is not sticky can: chmod +t {report['path']} stops it)"),
    }.get(result["errno"] or "", f"cannot create a directory in {report['path']}")
    report["error"] = f"{reason} ({result['detail']}); nothing was tested"
    for name in CHECKS:
        report["results"][name] = _result(False, f"not run: {reason}")
    return False


class _Outcome:
    """What one worker run produced."""

    def __init__(self) -> None:
        self.results: list[tuple[str, Result]] = []
        # The step that hung or crashed the worker, with its result.
        self.failed: tuple[str, Result] | None = None


def _run_worker(workdir: str, steps: list[str], timeout: float, made: list[int] | None) -> _Outcome:
    """Run ``steps`` in one worker process, killing it if a step exceeds ``timeout``.

    ``made`` is the work directory's (st_dev, st_ino) as setup reported it (None before setup).
    """
    outcome = _Outcome()
    cmd = [
        sys.executable,
        "-I",  # ignore PYTHON* variables and the user site
        "-S",  # no site-packages: no .pth file (sharedfs's own included) runs
        probeworker.__file__,  # by path: see the worker's first lines
        json.dumps({"workdir": workdir, "made": made, "steps": steps, "timeout": timeout}),
    ]
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: one killpg ends its children too
        )
    except OSError as exc:
        outcome.failed = (steps[0], _result(False, f"cannot start the probe worker: {exc}"))
        return outcome

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    current: str | None = None
    step_started = time.monotonic()
    # The first deadline also covers the interpreter start-up.
    deadline = step_started + timeout + 5.0
    eof = False
    while not eof:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _kill(proc)
            if current is None and len(outcome.results) == len(steps):
                break  # every step answered; only the exit was slow
            step = current or steps[len(outcome.results)]
            outcome.failed = (
                step,
                _result(
                    False,
                    f"timed out after {timeout:g} s (the call did not return; the process was killed)",
                    timed_out=True,
                    seconds=time.monotonic() - step_started,
                ),
            )
            break
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            eof = True
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                event = json.loads(line)
            except ValueError:  # not ours (nothing else should write there)
                continue
            now = time.monotonic()
            if "result" in event:
                outcome.results.append((event["step"], event["result"]))
                current = None
            else:
                current = event["start"]
            step_started, deadline = now, now + timeout

    stderr = _finish(proc)
    if outcome.failed is None and len(outcome.results) < len(steps):
        step = current or steps[len(outcome.results)]
        tail = stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        outcome.failed = (step, _result(False, f"the probe worker crashed: {tail[0]}"))
    return outcome


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _finish(proc: subprocess.Popen[bytes]) -> str:
    """Reap the worker (without waiting forever) and return its stderr."""
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        # Stuck in an uninterruptible kernel call: leave it rather than hang too.
        return ""
    assert proc.stderr is not None and proc.stdout is not None
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stdout.close()
    proc.stderr.close()
    return stderr
