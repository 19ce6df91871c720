"""Record files: small files sharedfs writes whole into a directory others can write, and removes only if still its own.

Created ``O_EXCL|O_NOFOLLOW``, read as untrusted, removed only while the name is still that file (same device, inode).
"""

from __future__ import annotations

from typing import Callable

from sharedfs.fs import stale
from sharedfs.fs.directory import Directory, Identity, identity
from sharedfs.fs.safefile import write_all

__all__ = ["Identity", "create_record", "create_record_in", "discard_if_same", "identity", "same_file",
           "unlink_if_same"]


def same_file(path: str, fd: int) -> bool:
    """True while ``path`` names the file open as ``fd`` (False when either cannot be looked at)."""
    try:
        mine = identity(fd)
        where, name = Directory.containing(path)
    except OSError:
        return False
    with where:
        return where.names(name, mine)


def create_record(path: str, data: bytes, mode: int, *, prepare: Callable[[int], None] | None = None) -> int:
    """Create ``path`` holding ``data`` and return its open descriptor; :class:`FileExistsError` if it exists.

    ``prepare(fd)`` runs before the write (permissions, group).  If anything fails after
    the create, the file is removed (if its name is still ours) and closed, and the error raised.
    """
    where, name = Directory.containing(path)
    with where:
        return create_record_in(where, name, data, mode, prepare=prepare)


def create_record_in(where: Directory, name: str, data: bytes, mode: int, *,
                     prepare: Callable[[int], None] | None = None) -> int:
    """:func:`create_record` of the name ``name`` in the open directory ``where``."""
    fd = where.create_exclusive(name, mode)
    try:
        if prepare is not None:
            prepare(fd)
        write_all(fd, data)
    except BaseException:
        where.discard_if_same(name, identity(fd))
        stale.close(fd)
        raise
    return fd


def unlink_if_same(path: str, held: Identity) -> bool:
    """Unlink ``path`` only while it is still the file ``held`` identifies; True when this call removed it.

    The check and the unlink happen in one open directory
    (:meth:`~sharedfs.fs.directory.Directory.unlink_if_same`), never by resolving the path twice.
    A name that is gone (or gone meanwhile) is not an error; any other failure (a sticky or
    read-only directory) is raised, so the caller learns the file stays.
    """
    try:
        where, name = Directory.containing(path)
    except FileNotFoundError:
        return False
    with where:
        return where.unlink_if_same(name, held)


def discard_if_same(path: str, held: Identity) -> None:
    """:func:`unlink_if_same` for clean-up paths: never raises, so the error being handled is the one reported."""
    try:
        unlink_if_same(path, held)
    except OSError:
        pass
