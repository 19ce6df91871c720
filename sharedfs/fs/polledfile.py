"""A lock file that programs without sharedfs poll for: created whole, and changing hands without going missing.

torch's ``FileBaton`` and filelock's ``SoftFileLock`` read its absence as "free", so it is replaced, never re-created.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
import uuid
from typing import Callable

from sharedfs.fs import stale
from sharedfs.fs.directory import Directory, Identity, identity
from sharedfs.fs.recordfile import create_record, discard_if_same
from sharedfs.fs.safefile import read_untrusted

__all__ = ["NO_LINKS", "create_unlinked", "create_whole", "read_with_identity", "record_beside", "replace_foreign",
           "unlink_quietly"]

#: ``link(2)`` refusals that mean "this filesystem has no hard links", not "the name exists".
NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK, errno.EXDEV})


def read_with_identity(path: str) -> tuple[bytes, Identity] | None:
    """The file's bytes and identity; ``None`` when it is gone.  Never follows a planted symlink or FIFO.

    A name sharedfs cannot trust to read (a symlink, a FIFO, a file too long to be a record)
    reads as empty, with an identity no file has: to the caller, a file that holds no record.
    """
    try:
        got = read_untrusted(path)
    except FileNotFoundError:
        return None
    if got is None:
        return b"", (-1, -1)
    data, st = got
    return data, (st.st_dev, st.st_ino)


def create_whole(path: str, data: bytes) -> Identity | None:
    """Create ``path`` holding ``data`` in one step; its identity, or ``None`` when it exists.

    A hard link of a complete temporary file, so no waiter ever reads a half-written
    record (and a holder killed in between leaves no empty file, which would read as one
    of a program without sharedfs).  NFS may retransmit a link whose reply was lost and answer
    EEXIST for our own success: the temporary file's link count then tells.  Without hard
    links the file is created ``O_EXCL`` and written at once.
    """
    temp = f"{path}.{uuid.uuid4().hex}.tmp"
    fd = create_record(temp, data, 0o666)
    held = identity(fd)
    try:
        try:
            os.link(temp, path)
        except FileExistsError:
            if os.fstat(fd).st_nlink < 2:
                return None
        except OSError as exc:
            if exc.errno not in NO_LINKS:
                raise
            return create_unlinked(path, data)
        return held
    finally:
        discard_if_same(temp, held)
        stale.close(fd)


def create_unlinked(path: str, data: bytes) -> Identity | None:
    """Create ``path`` ``O_EXCL`` and write ``data`` into it (no hard links here); ``None`` when it exists."""
    try:
        fd = create_record(path, data, 0o666)
    except FileExistsError:
        return None
    try:
        return identity(fd)
    finally:
        stale.close(fd)


def record_beside(path: str, data: bytes) -> str:
    """A complete file holding ``data`` beside ``path`` (a name of sharedfs's own, never one a poller looks at)."""
    temp = f"{path}.{uuid.uuid4().hex}.tmp"
    stale.close(create_record(temp, data, 0o666))
    return temp


def unlink_quietly(path: str, *held: Identity) -> None:
    """Unlink ``path``, a name of sharedfs's own; one that is gone already is not an error.

    Through the descriptor of its directory (``unlinkat``); given ``held``, only while the name
    still is one of those files (a neighbour's file swapped in stays).
    """
    try:
        where, name = Directory.containing(path)
    except FileNotFoundError:
        return
    with where:
        if not held:
            try:
                os.unlink(name, dir_fd=where.fd)
            except FileNotFoundError:
                pass
            return
        try:
            now = identity(where.lstat(name))
        except FileNotFoundError:
            return
        if now in held:
            where.unlink_if_same(name, now)


#: ``renameat2(2)`` flags: swap the two names in one step.
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
#: Refusals of RENAME_EXCHANGE that mean "this filesystem cannot", as filelock reads them.
_NO_EXCHANGE = frozenset({errno.EINVAL, errno.ENOSYS, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP})


@functools.lru_cache(maxsize=None)
def _renameat2() -> Callable[..., int] | None:
    """glibc's ``renameat2``, or ``None`` (another libc, or an old glibc): loaded only when a takeover needs it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # only a takeover of a dead holder's file needs it

    function = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if function is None:
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


def _exchange(first: str, second: str) -> bool:
    """Swap the two names atomically; False when the filesystem (or the C library) cannot."""
    function = _renameat2()
    if function is None:
        return False
    import ctypes

    if function(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), first, None, second)


def replace_foreign(path: str, expected: Identity, source: str) -> bool:
    """Put the file ``source`` names at ``path`` in place of the file ``expected`` identifies, in one step.

    The one place sharedfs takes over a foreign lock file (one left by a holder that is gone):
    ``path`` never goes missing on the way.  ``source`` keeps its name (a second link moves;
    without hard links ``source`` itself moves).  With ``RENAME_EXCHANGE`` (what filelock >= 4.3
    breaks a marker with) the file displaced is checked afterwards and swapped back when it was
    not ``expected`` (somebody replaced it in between); a filesystem that refuses the exchange
    (NFS, most FUSE daemons) gets a rename right after checking that ``expected`` is still there.
    False when ``path`` is not ``expected`` (any more): nothing changed at ``path``.
    """
    swap = f"{path}.{uuid.uuid4().hex}.swap"
    ours = identity(os.lstat(source))
    try:
        os.link(source, swap)
    except OSError as exc:
        if exc.errno not in NO_LINKS:
            raise
        os.rename(source, swap)
    displaced_live = False
    try:
        try:
            if identity(os.lstat(path)) != expected:
                return False
        except OSError as exc:  # gone, or replaced by another client (ESTALE): not the file we judged
            if not stale.gone(exc):
                raise
            return False
        if _exchange(swap, path):
            if identity(os.lstat(swap)) == expected:
                return True  # swap names the displaced file now: removed below
            displaced_live = True  # not the file we judged: give it its name back
            if not _exchange(swap, path):
                raise OSError(errno.EIO, f"could not give {path} back to its holder after exchanging it; its file "
                                         f"is at {swap}: move it back with mv -f {swap} {path}")
            displaced_live = False
            return False
        os.rename(swap, path)
        return True
    finally:
        if not displaced_live:  # never remove a live holder's file: only ours, or the dead one displaced
            unlink_quietly(swap, ours, expected)
