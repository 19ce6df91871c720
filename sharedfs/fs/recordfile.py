"""Record files: small files sharedfs writes whole into a directory others can write, and removes only if still its own.

Lock markers, shard-cache claims and in-use markers, torch's build batons and the temp
files of a publication all live in directories a group shares, or that a dead process
left behind.  Any member can rename such a file away and put another in its place, so
three rules hold for every one of them:

* it is created ``O_CREAT|O_EXCL|O_NOFOLLOW|O_NONBLOCK``
  (:func:`~sharedfs.fs.safefile.create_exclusive`: a planted name, symlink or not, makes
  the create fail instead of writing through it) and written through the descriptor that
  created it; one that cannot be written completely is removed at once, so nobody reads
  a half-written record as someone's;
* it is read with :func:`~sharedfs.fs.safefile.read_untrusted` (no symlink followed, no
  blocking open, a size cap);
* it is removed only while its name still is the file this process created or read
  (same ``st_dev`` and ``st_ino``): never a successor's, never a neighbour's swapped in.
"""

from __future__ import annotations

import os
from typing import Callable

from sharedfs.fs.safefile import create_exclusive, write_all

__all__ = ["Identity", "create_record", "discard_if_same", "identity", "same_file", "unlink_if_same"]

#: What tells one file from another: (st_dev, st_ino).
Identity = tuple[int, int]


def identity(of: int | os.stat_result) -> Identity:
    """The identity of an open descriptor, or of what a stat call returned."""
    st = os.fstat(of) if isinstance(of, int) else of
    return st.st_dev, st.st_ino


def same_file(path: str, fd: int) -> bool:
    """True while ``path`` names the file open as ``fd`` (False when either cannot be looked at)."""
    try:
        there, mine = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return identity(there) == identity(mine)


def create_record(path: str, data: bytes, mode: int, *, prepare: Callable[[int], None] | None = None) -> int:
    """Create ``path`` holding ``data`` and return its open descriptor; :class:`FileExistsError` if it exists.

    ``prepare(fd)`` runs before the write (permissions, group).  If anything fails after
    the create, the file is removed (if its name is still ours) and closed, and the error raised.
    """
    fd = create_exclusive(path, mode)
    try:
        if prepare is not None:
            prepare(fd)
        write_all(fd, data)
    except BaseException:
        discard_if_same(path, identity(fd))
        os.close(fd)
        raise
    return fd


def unlink_if_same(path: str, held: Identity) -> bool:
    """Unlink ``path`` only while it is still the file ``held`` identifies; True when this call removed it.

    A name that is gone (or gone meanwhile) is not an error; any other failure (a sticky or
    read-only directory) is raised, so the caller learns the file stays.
    """
    try:
        if identity(os.lstat(path)) != held:
            return False
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def discard_if_same(path: str, held: Identity) -> None:
    """:func:`unlink_if_same` for clean-up paths: never raises, so the error being handled is the one reported."""
    try:
        unlink_if_same(path, held)
    except OSError:
        pass
