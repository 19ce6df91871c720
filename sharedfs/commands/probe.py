"""Try, on a real directory, the filesystem operations sharedfs relies on.

:func:`probe` works inside a fresh, uniquely named subdirectory of the path
(removed afterwards, also after an error) and never hangs: every filesystem
access runs in a worker process (``python -I -S`` on this file, so neither
``sharedfs`` nor any ``.pth`` file is imported there), and a step that does not
finish within ``timeout`` seconds is reported as timed out and its worker
killed -- a lock call stuck on an unresponsive NFS lock daemon is the case in
mind (datasets#1672, DataBiosphere/toil#4846).

It checks only what one node can see: that a lock excludes a second process
*on this node*.  Whether it excludes other nodes is the classification's job
(:mod:`sharedfs.model.fsinfo`); a lock that passes here may still be node-local.

Output schema (version 1; every key is always present, values JSON-safe)::

    {
      "schema": 1,
      "path": "/abs/path",            # the directory probed
      "node": "host",                 # where the probe ran
      "workdir": "/abs/path/.sharedfs-probe-...",  # removed before returning
      "writable": true | false | null,  # null: undetermined (setup timed out)
      "error": null | "sentence",     # why the checks could not run
      "seconds": 0.12,                # wall time of the whole probe
      "results": {NAME: RESULT, ...}, # one per name in CHECKS, in that order
      "cleanup": RESULT               # removal of workdir
    }

    RESULT = {
      "ok": bool,
      "errno": "ENOSYS" | "ENOLCK" | ... | null,  # errno name of the failure
      "detail": "sentence",
      "timed_out": bool,
      "seconds": float
    }

The checks (:data:`CHECKS`):

``flock``            ``flock(LOCK_EX|LOCK_NB)`` on a new file succeeds.
``flock_excludes``   while held, a child process opening the file anew gets
                     ``EWOULDBLOCK`` from ``flock(LOCK_EX|LOCK_NB)``, and gets the
                     lock once it is released.
``posix``            ``fcntl.lockf(LOCK_EX|LOCK_NB)`` (POSIX record lock) succeeds.
``posix_excludes``   the same exclusion check with POSIX locks.
``o_excl``           ``O_CREAT|O_EXCL`` creates once; the second create fails ``EEXIST``.
``link``             a hard link can be made (checked by ``st_nlink``).
``rename_replace``   ``rename`` over an existing file replaces it.
``fsync``            write, ``fsync``, close, read back the same bytes.
"""

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
from typing import Any, Callable, Optional

if __package__:
    from sharedfs.fs import oslocks
else:  # the probe worker (``python -I -S probe.py``): no site-packages, no autoload, no package
    # sharedfs/fs/oslocks.py, beside this file's folder (sharedfs/commands/): stdlib only, like this file.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fs"))
    import oslocks  # type: ignore[no-redef]

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

# Runtime aliases: Optional rather than `X | None`, which Python 3.9 cannot evaluate.
Result = dict[str, Any]
#: What a worker step returns: (ok, detail, errno name).
StepOutcome = tuple[bool, str, Optional[str]]
Step = Callable[[str, float], StepOutcome]


def _result(
    ok: bool,
    detail: str,
    err: str | None = None,
    timed_out: bool = False,
    seconds: float = 0.0,
) -> Result:
    return {
        "ok": ok,
        "errno": err,
        "detail": detail,
        "timed_out": timed_out,
        "seconds": round(seconds, 4),
    }


_errno_name = oslocks.errno_name


def _describe(exc: OSError) -> str:
    name = _errno_name(exc)
    return f"{name}: {exc.strerror}" if name else str(exc)


# --------------------------------------------------------------------------
# Parent side


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
    while pending:
        outcome = _run_worker(workdir, pending, timeout)
        for step, result in outcome.results:
            if step not in pending:  # cleared by an earlier failure
                continue
            pending.remove(step)
            if step == "setup":
                created = _apply_setup(report, result)
                if not result["ok"]:
                    pending.clear()
            else:
                report["results"][step] = result
        if outcome.failed is None:
            continue
        step, result = outcome.failed
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

    if created:
        outcome = _run_worker(workdir, ["cleanup"], timeout)
        if outcome.results:
            report["cleanup"] = outcome.results[0][1]
        elif outcome.failed is not None:
            report["cleanup"] = outcome.failed[1]
    else:
        report["cleanup"] = _result(True, "nothing was created")
    report["seconds"] = round(time.monotonic() - started, 4)
    return report


def _apply_setup(report: dict[str, Any], result: Result) -> bool:
    """Record the setup step; return whether the work directory may exist."""
    if result["ok"]:
        report["writable"] = True
        return True
    report["writable"] = False
    uid = os.geteuid()
    reason = {
        "EACCES": f"{report['path']} is not writable by uid {uid}",
        "EPERM": f"{report['path']} is not writable by uid {uid}",
        "EROFS": f"{report['path']} is not writable: read-only filesystem",
        "ENOENT": f"{report['path']} does not exist",
        "ENOTDIR": f"{report['path']} is not a directory",
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


def _run_worker(workdir: str, steps: list[str], timeout: float) -> _Outcome:
    """Run ``steps`` in one worker process, killing it if a step exceeds ``timeout``."""
    outcome = _Outcome()
    cmd = [
        sys.executable,
        "-I",  # ignore PYTHON* variables and the user site
        "-S",  # no site-packages: no .pth file (sharedfs's own included) runs
        os.path.abspath(__file__),
        json.dumps({"workdir": workdir, "steps": steps, "timeout": timeout}),
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


# --------------------------------------------------------------------------
# Worker side (runs as ``python -I -S probe.py '{json}'``)


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class _StepTimeout(Exception):
    """A step's own bounded wait (for a child process) ran out."""


def _worker(spec: dict[str, Any]) -> None:
    workdir = spec["workdir"]
    child_timeout = max(0.5, float(spec["timeout"]) / 3)
    for step in spec["steps"]:
        _emit({"start": step})
        began = time.monotonic()
        timed_out = False
        try:
            ok, detail, err = _STEPS[step](workdir, child_timeout)
        except OSError as exc:
            ok, detail, err = False, _describe(exc), _errno_name(exc)
        except _StepTimeout as exc:
            ok, detail, err, timed_out = False, str(exc), None, True
        result = _result(ok, detail, err, timed_out, seconds=time.monotonic() - began)
        _emit({"step": step, "result": result})
        if step == "setup" and not ok:
            return  # no work directory: nothing else can run


def _setup(workdir: str, _timeout: float) -> StepOutcome:
    os.mkdir(workdir, 0o700)
    return True, f"created {workdir}", None


def _cleanup(workdir: str, _timeout: float) -> StepOutcome:
    import shutil

    if not os.path.lexists(workdir):
        return True, "nothing to remove", None
    shutil.rmtree(workdir)
    return True, f"removed {workdir}", None


_LABEL = {"flock": "flock", "posix": "POSIX (lockf)"}


def _lock(kind: str) -> Step:
    def step(workdir: str, _timeout: float) -> StepOutcome:
        fd = os.open(os.path.join(workdir, f"{kind}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                oslocks.lock(fd, kind)
            except OSError as exc:
                return False, f"an exclusive {_LABEL[kind]} lock failed: {_describe(exc)}", _errno_name(exc)
            oslocks.unlock(fd, kind)
            return True, f"an exclusive {_LABEL[kind]} lock was taken and released", None
        finally:
            os.close(fd)

    return step


def _contender(path: str, kind: str, timeout: float) -> tuple[str, str | None]:
    """In a forked child, open ``path`` anew and try the lock once.

    Returns ``("excluded"|"acquired"|"error"|"timeout", errno name)``.  The child
    holds a separate open file description, so flock sees a second holder, and
    is a separate process, so POSIX locks (owned per process) see one too.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = "error"
        name = ""
        try:
            os.close(read_end)
            fd = os.open(path, os.O_RDWR)
            state, failure = oslocks.try_lock(fd, kind)
            code = {"held": "acquired", "blocked": "excluded", "failed": "error"}[state]
            name = failure or ""
        except BaseException:  # noqa: BLE001 - a forked child must never unwind into the worker
            code = "error"
        finally:
            try:
                os.write(write_end, f"{code} {name}".encode())
            finally:
                os._exit(0)
    os.close(write_end)
    try:
        deadline = time.monotonic() + timeout
        while True:
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                return "timeout", None
            time.sleep(0.005)
        text = os.read(read_end, 256).decode().split()
    finally:
        os.close(read_end)
    code = text[0] if text else "error"
    return code, (text[1] if len(text) > 1 else None)


def _excludes(kind: str) -> Step:
    def step(workdir: str, timeout: float) -> StepOutcome:
        label = _LABEL[kind]
        path = os.path.join(workdir, f"{kind}-excl.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                oslocks.lock(fd, kind)
            except OSError as exc:
                return (
                    False,
                    f"could not take the first {label} lock: {_describe(exc)}",
                    _errno_name(exc),
                )
            held, held_err = _contender(path, kind, timeout)
            oslocks.unlock(fd, kind)
            after, after_err = _contender(path, kind, timeout)
        finally:
            os.close(fd)
        if held == "excluded" and after == "acquired":
            return (
                True,
                (
                    f"a second process on this node was refused the {label} lock "
                    f"({held_err}) while it was held, and got it once released"
                ),
                None,
            )
        if held == "acquired":
            return (
                False,
                f"a second process on this node also got the {label} lock: it does not exclude",
                None,
            )
        if held == "timeout" or after == "timeout":
            raise _StepTimeout(f"the second process's {label} call did not return within {timeout:g} s")
        if held == "excluded":
            return (
                False,
                f"the {label} lock excluded a second process but was not free after release ({after}, {after_err})",
                after_err,
            )
        return False, f"the second process's {label} call failed ({held_err})", held_err

    return step


def _o_excl(workdir: str, _timeout: float) -> StepOutcome:
    path = os.path.join(workdir, "excl")
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    os.close(os.open(path, flags, 0o600))
    try:
        os.close(os.open(path, flags, 0o600))
    except FileExistsError:
        return True, "the second exclusive create failed with EEXIST", None
    return False, "the second exclusive create also succeeded: O_EXCL is not atomic here", None


def _link(workdir: str, _timeout: float) -> StepOutcome:
    src = os.path.join(workdir, "link-src")
    with open(src, "wb") as f:
        f.write(b"x")
    failure: OSError | None = None
    try:
        os.link(src, os.path.join(workdir, "link-dst"))
    except OSError as exc:
        failure = exc
    # The classic NFS check: a retransmitted LINK may report failure although
    # the link was made, so the link count is the truth.
    if os.stat(src).st_nlink == 2:
        if failure is not None:
            return True, f"link() reported {_describe(failure)} but the link exists", None
        return True, "a hard link was created (st_nlink == 2)", None
    if failure is not None:
        return False, f"link() failed: {_describe(failure)}", _errno_name(failure)
    return False, "link() succeeded but st_nlink is not 2", None


def _rename_replace(workdir: str, _timeout: float) -> StepOutcome:
    target = os.path.join(workdir, "rename-target")
    temp = os.path.join(workdir, "rename-temp")
    with open(target, "wb") as f:
        f.write(b"old")
    with open(temp, "wb") as f:
        f.write(b"new")
    os.rename(temp, target)
    with open(target, "rb") as f:
        content = f.read()
    if content == b"new" and not os.path.lexists(temp):
        return True, "rename over an existing file replaced it", None
    return False, f"after rename the target holds {content!r}", None


def _fsync(workdir: str, _timeout: float) -> StepOutcome:
    path = os.path.join(workdir, "fsync")
    data = os.urandom(4096)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        # close() reports deferred write errors on NFS, so it belongs in the check.
        os.close(fd)
    with open(path, "rb") as f:
        if f.read() != data:
            return False, "the bytes read back differ from the bytes written", None
    return True, "4096 bytes written, fsynced and read back", None


_STEPS: dict[str, Step] = {
    "setup": _setup,
    "flock": _lock("flock"),
    "flock_excludes": _excludes("flock"),
    "posix": _lock("posix"),
    "posix_excludes": _excludes("posix"),
    "o_excl": _o_excl,
    "link": _link,
    "rename_replace": _rename_replace,
    "fsync": _fsync,
    "cleanup": _cleanup,
}


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
