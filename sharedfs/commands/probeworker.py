"""The probe's worker: the filesystem steps, run as ``python -I -S probeworker.py '{json}'`` (no site, no sharedfs)."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import sys
import time
from typing import Any, Callable, Optional

if not __package__:  # run by path: import sharedfs/fs/ (stdlib only) without running sharedfs/__init__.py
    import types

    _top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for _name, _where in (("sharedfs", _top), ("sharedfs.fs", os.path.join(_top, "fs"))):
        _package = types.ModuleType(_name)
        _package.__path__ = [_where]
        sys.modules[_name] = _package

from sharedfs.fs import oslocks  # noqa: E402 - after the worker's package modules
from sharedfs.fs.directory import Changed, Directory, Identity, identity  # noqa: E402
from sharedfs.fs.safefile import write_all  # noqa: E402

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
