"""Filling a remote-code module cache: each file copied in once, whole, while the other ranks wait.

Stock copies in place on every rank, so a rank may import a half-written module (docs/frameworks/transformers.md).
"""

from __future__ import annotations

import errno
import functools
import os
import secrets
import shutil
import stat
import threading
from types import ModuleType
from typing import Any, Callable

from sharedfs.cluster import teamfiles
from sharedfs.cluster.dirs import wait_for
from sharedfs.errors import SharedFSError
from sharedfs.fs import stale
from sharedfs.fs.publish import Replaced, fsync_dir
from sharedfs.fs.recordfile import discard_if_same, identity, same_file
from sharedfs.fs.safefile import create_exclusive, read_untrusted, write_all
from sharedfs.locks import lock
from sharedfs.model.policy import Policy

__all__ = ["LOCK_NAME", "PACKAGES", "SourceChanged", "ShutilView", "fill_once", "hashing", "publish_copy"]

#: The packages transformers and diffusers keep in ``HF_MODULES_CACHE``: made together in a team's cache, whose
#: root the group may then only read (:mod:`sharedfs.cluster.teamfiles`, a code root).
PACKAGES = ("diffusers_modules", "transformers_modules")
#: The lock file a fill takes in the directory it copies into.
LOCK_NAME = ".sharedfs-fill.lock"
#: Module files larger than this are never compared byte for byte: they are published again.
COMPARE_LIMIT = 64 * 1024 * 1024
#: errnos of a filesystem that cannot make hard links: the publication renames instead.
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS})
#: How many times a fill starts again because the local model's files changed while it ran.
ATTEMPTS = 3


class SourceChanged(SharedFSError):
    """A local model's files changed between the hash its module folder is named for and the copy."""


class _Fill(threading.local):
    depth = 0  # nested get_cached_module_file calls of this thread
    held: Any = None  # the fill lock this thread holds, until the outermost call returns
    hashed: Any = None  # (hash function, args, kwargs, folder hash) of the local model this fill copies


_fill = _Fill()


def fill_once(original: Callable[..., Any], verify: Callable[[str], None] | None = None) -> Callable[..., Any]:
    """``get_cached_module_file`` whose copies publish whole, under one fill lock released when it returns.

    ``verify`` checks the path it returns before the lock is released (and before the framework
    imports it); a fill that found its local model changed meanwhile runs again.
    """

    @functools.wraps(original)
    def get_cached_module_file(*args: Any, **kwargs: Any) -> Any:
        state = _fill
        if state.depth:
            return _nested(original, args, kwargs)
        for attempt in range(ATTEMPTS):
            state.depth = 1
            try:
                found = original(*args, **kwargs)
                if verify is not None:
                    verify(found)
                return found
            except SourceChanged:
                if attempt == ATTEMPTS - 1:
                    raise
            finally:
                state.depth, state.hashed = 0, None
                if state.held is not None:
                    held, state.held = state.held, None
                    held.release()
        raise AssertionError("unreachable")  # pragma: no cover

    return get_cached_module_file


def _nested(original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    _fill.depth += 1
    try:
        return original(*args, **kwargs)
    finally:
        _fill.depth -= 1


def hashing(original: Callable[..., str]) -> Callable[..., str]:
    """transformers' ``_compute_local_source_files_hash``, remembered in a fill (docs/frameworks/transformers.md)."""

    @functools.wraps(original)
    def _compute_local_source_files_hash(*args: Any, **kwargs: Any) -> str:
        found = original(*args, **kwargs)
        if _fill.depth:
            _fill.hashed = (original, args, kwargs, found)
        return found

    return _compute_local_source_files_hash


def _still_hashed() -> None:
    """Raise :class:`SourceChanged` if the local model this fill copies no longer has the folder's hash."""
    hashed = _fill.hashed
    if hashed is None:
        return
    function, args, kwargs, folder = hashed
    now = function(*args, **kwargs)
    if now != folder:
        model = args[0] if args else "the local model"
        raise SourceChanged(f"the files of {model} changed while its modules were copied (hash {folder}, now "
                            f"{now}), {ATTEMPTS} times; load it again once they stop changing")


class ShutilView:
    """What a framework module's ``shutil`` name holds: :mod:`shutil`, with ``copyfile`` publishing inside a fill."""

    def __init__(self, policy: Policy, real: ModuleType = shutil) -> None:
        self._real = real
        self._policy = policy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __repr__(self) -> str:
        return f"<sharedfs view of {self._real!r}>"

    def copyfile(self, src: Any, dst: Any, *, follow_symlinks: bool = True) -> Any:
        if _fill.depth == 0 or not follow_symlinks:
            return self._real.copyfile(src, dst, follow_symlinks=follow_symlinks)
        self._publish(src, dst)
        return dst

    def copy(self, src: Any, dst: Any, *, follow_symlinks: bool = True) -> Any:
        """``shutil.copy`` (transformers before 5.x): inside a fill the mode is the umask's, never the source's."""
        if _fill.depth == 0 or not follow_symlinks:
            return self._real.copy(src, dst, follow_symlinks=follow_symlinks)
        if os.path.isdir(dst):
            dst = os.path.join(dst, os.path.basename(os.fspath(src)))
        self._publish(src, dst)
        return dst

    def _publish(self, src: Any, dst: Any) -> None:
        if _fill.held is None:
            directory = os.path.dirname(os.path.abspath(os.fspath(dst)))
            held = lock(os.path.join(directory, LOCK_NAME), policy=self._policy)
            held.acquire()
            _fill.held = held
        publish_copy(src, dst, self._policy, check=_still_hashed)


#: What :func:`_published` answers for a name this node does not see.
_MISSING = b"\0missing"


def _published(dst: str) -> bytes | None:
    """What ``dst`` holds as seen here (read with a cap, never through a symlink); :data:`_MISSING` when this
    node does not see the name, ``None`` when it cannot be read (a symlink, a FIFO, too large)."""
    try:
        found = read_untrusted(dst, COMPARE_LIMIT)
    except FileNotFoundError:
        return _MISSING
    except OSError:
        return None
    return None if found is None else found[0]


def publish_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str], policy: Policy,
                 check: Callable[[], None] | None = None) -> None:
    """Make ``dst`` a complete copy of ``src``, unless it is one already (docs/frameworks/transformers.md).

    The source is read once; ``check`` (raising to refuse) runs after that read, before anything is published.
    """
    src, dst = os.fspath(src), os.path.abspath(os.fspath(dst))
    # One look decides: a name that appears between two looks must never be replaced (the ranks that saw it
    # are importing it), only a name seen with other content.
    seen = _published(dst)
    with open(src, "rb") as source:
        data = source.read(COMPARE_LIMIT + 1)
        if seen is not None and seen is not _MISSING and data == seen:
            return  # published while this rank waited for the fill lock
        directory, name = os.path.split(dst)
        temp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
        fd = create_exclusive(temp, 0o666)  # the umask or the default ACL decide, as for open()
        held = identity(fd)
        try:
            _never_writable_by_others(fd)
            write_all(fd, data)
            while chunk := source.read(1 << 20):  # larger than COMPARE_LIMIT: never compared, copied on
                write_all(fd, chunk)
        except BaseException:
            discard_if_same(temp, held)
            stale.close(fd)
            raise
    try:
        if check is not None:
            check()  # the content read above is the one the folder is named for
        os.fsync(fd)  # an NFS client sends the data now: other nodes read it whole once the name appears
        if not same_file(temp, fd):
            raise Replaced(f"{temp} was replaced while it was written; someone with write access to "
                           f"{directory} is interfering")
        if seen is not _MISSING:
            _replace(temp, dst)  # seen here with other content: a changed module, as stock replaces it
        else:
            try:
                os.link(temp, dst)
            except FileExistsError:
                # Published by another node and not visible here yet: wait to see that file, never overwrite it.
                wait_for(dst, policy.wait_timeout, what=f"module file {dst}, published by another process")
            except OSError as exc:
                if exc.errno not in _NO_LINKS:
                    raise
                os.replace(temp, dst)
            discard_if_same(temp, held)
    except BaseException:
        discard_if_same(temp, held)
        raise
    finally:
        stale.close(fd)  # ESTALE: another node replaced what we published; the descriptor is freed all the same
    fsync_dir(directory)
    teamfiles.give(dst)  # in a team cache: the group's to read, as every file the framework makes there


def _never_writable_by_others(fd: int) -> None:
    """Take group and world write away from a module file being written (umask 002 gives both)."""
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if mode & teamfiles.CODE_WRITERS:
        os.fchmod(fd, mode & ~teamfiles.CODE_WRITERS)


def _replace(temp: str, dst: str) -> None:
    """``os.replace``; in a sticky directory (a team's module cache) another member's file stays, and says so."""
    try:
        os.replace(temp, dst)
    except PermissionError as exc:
        if exc.errno != errno.EPERM:
            raise
        try:
            owner = os.lstat(dst).st_uid
        except OSError:
            raise exc from None
        import pwd

        try:
            who = pwd.getpwuid(owner).pw_name
        except KeyError:
            who = f"uid {owner}"
        raise PermissionError(exc.errno, f"sharedfs: cannot publish module {dst}: {who}'s file of that name, with "
                              f"other content, is there and only {who} may replace it (the directory is sticky); "
                              f"rename your module file, ask {who} to remove theirs, or set HF_MODULES_CACHE to a "
                              f"directory of your own") from None
