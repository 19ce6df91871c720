"""Try, on a real directory, the filesystem operations sharedfs relies on.

:func:`probe` works inside a fresh, uniquely named subdirectory of the path
(removed afterwards, also after an error) and never hangs: every filesystem
access runs in a worker process (``python -I -S`` on this file, so neither
``sharedfs`` nor any ``.pth`` file is imported there), and a step that does not
finish within ``timeout`` seconds is reported as timed out and its worker
killed -- a lock call stuck on an unresponsive NFS lock daemon is the case in
mind (datasets#1672, DataBiosphere/toil#4846).

**Nothing outside the work directory is opened, written or removed**, whoever runs the probe
(root included) and whatever other users do meanwhile.  The directory probed may be a team's,
writable by every member and not sticky, so any member may rename the work directory away and
put a directory of his own, full of symlinks to other users' files, in its place, or rename
someone's results directory to its name.  So the work directory is made ``0700`` under an
unpredictable name and opened once, without following a symlink, then checked to be the one
just made (empty, private, owned as what this process creates there); every check works
relative to that descriptor (``openat``/``linkat``/``renameat``/``unlinkat``, new files
``O_CREAT|O_EXCL|O_NOFOLLOW``); a later worker opens it again only while its name is still that
directory (device and inode); and it is emptied by descriptor, never by ``rmtree`` of a path.

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

import errno
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from typing import Any, Callable, Optional

if not __package__:  # the probe worker (``python -I -S probe.py``): no site-packages, no autoload, no package
    # sharedfs/fs/ (standard library only) sits beside this file's folder: import it under its own name
    # through two empty package modules, so that not even sharedfs/__init__.py runs here.
    import types

    _top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for _name, _where in (("sharedfs", _top), ("sharedfs.fs", os.path.join(_top, "fs"))):
        _package = types.ModuleType(_name)
        _package.__path__ = [_where]
        sys.modules[_name] = _package

from sharedfs.fs import oslocks  # noqa: E402 - after the worker's package modules
from sharedfs.fs.directory import Changed, Directory, Identity, identity  # noqa: E402
from sharedfs.fs.safefile import write_all  # noqa: E402

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
Step = Callable[["_Workdir", float], StepOutcome]


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
        os.path.abspath(__file__),
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


# --------------------------------------------------------------------------
# Worker side (runs as ``python -I -S probe.py '{json}'``)


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class _StepTimeout(Exception):
    """A step's own bounded wait (for a child process) ran out."""


class _Workdir:
    """The work directory, held open: every step works relative to its descriptor, never through its path.

    ``made`` is the (st_dev, st_ino) setup made; a later worker (one started after a step hung)
    opens the name only while it is still that directory.  (Nobody else can remove it and have its
    inode number reused: it is private, and holds the checks' files by then.)
    """

    def __init__(self, path: str, made: Identity | None) -> None:
        self.path = path
        self.name = os.path.basename(path)
        self.made = made
        self._held: Directory | None = None

    def parent(self) -> Directory:
        """The directory probed, as the user named it (a symlink on the way there is the user's own choice)."""
        return Directory.open(os.path.dirname(self.path))

    def held(self) -> Directory:
        if self._held is None:
            if self.made is None:
                raise _replaced(self.path)
            with self.parent() as parent:
                try:
                    self._held = parent.subdirectory(self.name, expect=self.made)
                except Changed:
                    raise _replaced(self.path) from None
        return self._held

    def take(self, made: Directory) -> None:
        self._held, self.made = made, identity(made.fd)


def _replaced(path: str) -> OSError:
    return OSError(errno.ESTALE, f"{path} is no longer the directory this probe made (someone else renamed it "
                   "away, or put another in its place): nothing in it was used")


def _worker(spec: dict[str, Any]) -> None:
    made = spec.get("made")
    workdir = _Workdir(spec["workdir"], (made[0], made[1]) if made else None)
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
        if step == "setup" and ok and workdir.made is not None:
            result["made"] = list(workdir.made)  # taken off by the parent, passed to later workers
        _emit({"step": step, "result": result})
        if step == "setup" and not ok:
            return  # no work directory: nothing else can run


def _private(st: os.stat_result, uid: int) -> bool:
    """A directory of ``uid``'s that nobody else may enter or change."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077


def _setup(workdir: _Workdir, _timeout: float) -> StepOutcome:
    with workdir.parent() as parent:
        os.mkdir(workdir.name, 0o700, dir_fd=parent.fd)
        # A writer of the directory probed may rename it away at once and put another in its place: open it
        # without following a symlink, and use it only if it is what mkdir makes (private, empty, ours).
        try:
            made = parent.subdirectory(workdir.name)
        except (Changed, FileNotFoundError):
            raise _replaced(workdir.path) from None
    if made.listing() or not _private(made.stat(), _creator(made)):
        made.close()
        raise _replaced(workdir.path)
    workdir.take(made)
    return True, f"created {workdir.path}", None


def _creator(where: Directory) -> int:
    """The owner this filesystem gives what this process creates in ``where``: this user, or the uid that an NFS
    export squashes root (or an unmapped NFSv4 user) to, which then owns the directory mkdir made too."""
    fd = where.create_exclusive(".owner", 0o600)
    try:
        return os.fstat(fd).st_uid
    finally:
        os.close(fd)
        where.unlink_quietly(".owner")


def _cleanup(workdir: _Workdir, _timeout: float) -> StepOutcome:
    """Empty the work directory through its descriptor, then remove it only while its name is still it."""
    if workdir.made is None:
        return _remove_unconfirmed(workdir)
    try:
        where = workdir.held()
    except FileNotFoundError:
        return False, f"{workdir.path} is gone (someone else moved or removed it): nothing was removed", None
    except OSError as exc:
        if exc.errno != errno.ESTALE:
            raise
        return False, (f"{workdir.path} is no longer the directory this probe made (someone else renamed it away, "
                       "or put another in its place): nothing was removed"), "ESTALE"
    for entry in where.listing():
        if not entry.is_dir(follow_symlinks=False):  # the checks make files only
            os.unlink(entry.name, dir_fd=where.fd)
    with workdir.parent() as parent:
        if not parent.names(workdir.name, workdir.made):
            return False, (f"emptied the work directory, but it is no longer at {workdir.path} (someone renamed "
                           "it): the empty directory stays where it was moved"), None
        # Between that look and this rmdir only an empty directory can go, and whoever could rename ours
        # away (a writer of a directory that is not sticky) may remove an empty directory there too.
        os.rmdir(workdir.name, dir_fd=parent.fd)
    return True, f"removed {workdir.path}", None


def _remove_unconfirmed(workdir: _Workdir) -> StepOutcome:
    """Setup did not report (it hung, or its worker died): remove what it may have made, if that is empty and ours."""
    with workdir.parent() as parent:
        try:
            st = parent.lstat(workdir.name)
        except FileNotFoundError:
            return True, "nothing to remove", None
        if not _private(st, os.geteuid()):
            return False, f"left {workdir.path}: it is not a directory this probe can have made", None
        os.rmdir(workdir.name, dir_fd=parent.fd)  # ENOTEMPTY if it holds anything: setup never used it
    return True, f"removed {workdir.path}", None


_LABEL = {"flock": "flock", "posix": "POSIX (lockf)"}


def _lock(kind: str) -> Step:
    def step(workdir: _Workdir, _timeout: float) -> StepOutcome:
        fd = workdir.held().create_exclusive(f"{kind}.lock", 0o600)
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


def _contender(where: Directory, name: str, kind: str, timeout: float) -> tuple[str, str | None]:
    """In a forked child, open ``name`` in ``where`` anew and try the lock once.

    Returns ``("excluded"|"acquired"|"error"|"timeout", errno name)``.  The child
    holds a separate open file description, so flock sees a second holder, and
    is a separate process, so POSIX locks (owned per process) see one too.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = "error"
        failed = ""
        try:
            os.close(read_end)
            fd = where.open_file(name, os.O_RDWR)
            state, failure = oslocks.try_lock(fd, kind)
            code = {"held": "acquired", "blocked": "excluded", "failed": "error"}[state]
            failed = failure or ""
        except BaseException:  # noqa: BLE001 - a forked child must never unwind into the worker
            code = "error"
        finally:
            try:
                os.write(write_end, f"{code} {failed}".encode())
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
    def step(workdir: _Workdir, timeout: float) -> StepOutcome:
        label = _LABEL[kind]
        where, name = workdir.held(), f"{kind}-excl.lock"
        fd = where.create_exclusive(name, 0o600)
        try:
            try:
                oslocks.lock(fd, kind)
            except OSError as exc:
                return (
                    False,
                    f"could not take the first {label} lock: {_describe(exc)}",
                    _errno_name(exc),
                )
            held, held_err = _contender(where, name, kind, timeout)
            oslocks.unlock(fd, kind)
            after, after_err = _contender(where, name, kind, timeout)
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


def _o_excl(workdir: _Workdir, _timeout: float) -> StepOutcome:
    where = workdir.held()
    os.close(where.create_exclusive("excl", 0o600))
    try:
        os.close(where.create_exclusive("excl", 0o600))
    except FileExistsError:
        return True, "the second exclusive create failed with EEXIST", None
    return False, "the second exclusive create also succeeded: O_EXCL is not atomic here", None


def _write_new(where: Directory, name: str, data: bytes, *, sync: bool = False) -> None:
    """Create ``name`` (it must not exist in any form: ``O_EXCL|O_NOFOLLOW``), write ``data``, and close it."""
    fd = where.create_exclusive(name, 0o600)
    try:
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        # close() reports deferred write errors on NFS, so it belongs in the check.
        os.close(fd)


def _read_back(where: Directory, name: str, limit: int) -> bytes | None:
    """The bytes of ``name`` (at most ``limit``), or None when it is not a regular file that short."""
    got = where.read_untrusted(name, limit)
    return None if got is None else got[0]


def _link(workdir: _Workdir, _timeout: float) -> StepOutcome:
    where = workdir.held()
    _write_new(where, "link-src", b"x")
    failure: OSError | None = None
    try:
        where.link("link-src", "link-dst")
    except OSError as exc:
        failure = exc
    # The classic NFS check: a retransmitted LINK may report failure although
    # the link was made, so the link count is the truth.
    if where.lstat("link-src").st_nlink == 2:
        if failure is not None:
            return True, f"link() reported {_describe(failure)} but the link exists", None
        return True, "a hard link was created (st_nlink == 2)", None
    if failure is not None:
        return False, f"link() failed: {_describe(failure)}", _errno_name(failure)
    return False, "link() succeeded but st_nlink is not 2", None


def _rename_replace(workdir: _Workdir, _timeout: float) -> StepOutcome:
    where = workdir.held()
    _write_new(where, "rename-target", b"old")
    _write_new(where, "rename-temp", b"new")
    os.rename("rename-temp", "rename-target", src_dir_fd=where.fd, dst_dir_fd=where.fd)
    content = _read_back(where, "rename-target", 16)
    if content == b"new" and not where.lexists("rename-temp"):
        return True, "rename over an existing file replaced it", None
    return False, f"after rename the target holds {content!r}", None


def _fsync(workdir: _Workdir, _timeout: float) -> StepOutcome:
    where = workdir.held()
    data = os.urandom(4096)
    _write_new(where, "fsync", data, sync=True)
    if _read_back(where, "fsync", len(data)) != data:
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
