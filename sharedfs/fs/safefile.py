"""Opening files on a shared filesystem that other users, or dead processes, may have left there.

Never follows a symlink, never blocks, reads at most ``limit`` bytes; anything unexpected is "cannot tell".
"""

from __future__ import annotations

import os
import stat

from sharedfs.fs import stale

__all__ = ["NOFOLLOW", "RECORD_LIMIT", "create_exclusive", "read_untrusted", "write_all"]

#: Records sharedfs writes are a few hundred bytes; anything longer is not ours.
RECORD_LIMIT = 4096
#: Open flags for a file someone else may control: never follow a symlink, never block on open.
NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


def read_untrusted(path: str, limit: int = RECORD_LIMIT, *,
                   dir_fd: int | None = None) -> tuple[bytes, os.stat_result] | None:
    """The bytes of the regular file ``path`` and its ``fstat``, or ``None`` when it cannot be trusted to read.

    Raises :class:`FileNotFoundError` when ``path`` does not exist (the caller
    usually reads that as "released"); returns ``None`` for a symlink, a FIFO, a
    device, a directory, a file longer than ``limit`` bytes, or one we may not
    read.  The stat comes from the descriptor that was read, so the content and
    the identity (inode, change time) belong to the same file.  With ``dir_fd``, ``path`` is a
    name in that open directory (:class:`~sharedfs.fs.directory.Directory`).

    A file another client removed or replaced while it was read (ESTALE from the open, the read
    or the close) is read again through its name (:func:`~sharedfs.fs.stale.retry`); a name that
    stays stale is ``None``.
    """
    try:
        return stale.retry(lambda: _read_once(path, limit, dir_fd))
    except OSError as exc:
        if stale.is_stale(exc):
            return None
        raise


def _read_once(path: str, limit: int, dir_fd: int | None) -> tuple[bytes, os.stat_result] | None:
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) or stale.is_stale(exc):
            raise
        return None  # ELOOP (a symlink), EACCES, ENXIO (a FIFO without a writer), ...
    try:
        st = os.fstat(fd)
        data = os.read(fd, limit + 1) if stat.S_ISREG(st.st_mode) and st.st_size <= limit else None
    except BaseException as exc:
        stale.close(fd)
        if not isinstance(exc, OSError) or stale.is_stale(exc):
            raise
        return None
    os.close(fd)  # ESTALE here (GlusterFS answers it from the flush): the file went meanwhile, read it again
    if data is None or len(data) > limit:
        return None
    return data, st


def create_exclusive(path: str, mode: int, *, dir_fd: int | None = None) -> int:
    """Create ``path``, which must not exist in any form, and return a writable descriptor.

    ``mode`` is filtered by the umask as usual.  Raises :class:`FileExistsError`
    when the name exists (a file, a directory, or a symlink, dangling or not).  With ``dir_fd``,
    ``path`` is a name in that open directory.
    """
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode, dir_fd=dir_fd)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a short write on a full or slow filesystem)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
