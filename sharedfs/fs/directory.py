"""A directory held open: every name in it is looked at, read, created and removed through its descriptor.

So a check and the removal it guards concern the same file, even if a directory on the path is swapped.
"""

from __future__ import annotations

import errno
import os
import stat
from types import TracebackType

from sharedfs.fs import stale
from sharedfs.fs.safefile import NOFOLLOW, RECORD_LIMIT, create_exclusive, read_untrusted

__all__ = ["Changed", "Directory", "Identity", "identity", "owner_may_remove"]

#: What tells one file from another: (st_dev, st_ino).
Identity = tuple[int, int]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def identity(of: int | os.stat_result) -> Identity:
    """The identity of an open descriptor, or of what a stat call returned."""
    st = os.fstat(of) if isinstance(of, int) else of
    return st.st_dev, st.st_ino


def owner_may_remove(directory: os.stat_result, file: os.stat_result) -> bool:
    """Whether ``file``'s owner may remove it from ``directory``: write and search permission there.

    Root may remove any file anywhere; a tool that acts for a file's owner (``sharedfs locks
    --clear-dead`` run by root, clearing a dead holder's lock) asks this first, so that a file
    planted where its owner could never have written is not removed for her.  By the mode bits
    only (an ACL that grants more reads as "no": the file stays, and the caller says why).
    """
    uid = file.st_uid
    if uid == 0:
        return True
    if uid == directory.st_uid:
        need = stat.S_IWUSR | stat.S_IXUSR
    elif directory.st_gid in _groups(uid):
        need = stat.S_IWGRP | stat.S_IXGRP
    else:
        need = stat.S_IWOTH | stat.S_IXOTH
    return directory.st_mode & need == need


def _groups(uid: int) -> set[int]:
    """The groups of ``uid`` (none known for a uid without a passwd entry)."""
    import pwd

    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return set()
    return set(os.getgrouplist(entry.pw_name, entry.pw_gid))


class Changed(OSError):
    """A directory entry is no longer the directory it was when its parent was listed (a symlink now, or
    another directory renamed into its place): nothing below it is touched."""


class Directory:
    """An open directory; ``path`` is for messages only, never resolved again."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open(cls, path: str) -> Directory:
        """``path`` as it resolves now, symlinks on the way followed (the caller's own choice of path).

        A directory another client removed or replaced (ESTALE, asked again through the name while it
        lasts) raises :class:`FileNotFoundError`.
        """
        try:
            return cls(stale.retry(lambda: os.open(path or ".", _DIR_FLAGS)), path)
        except OSError as exc:
            raise stale.vanished(exc, path) from None

    @classmethod
    def containing(cls, path: str) -> tuple[Directory, str]:
        """The directory that holds ``path``, open, and the name of ``path`` in it."""
        head, name = os.path.split(path)
        return cls.open(head or "."), name

    def subdirectory(self, name: str, expect: Identity | None = None) -> Directory:
        """The directory ``name`` in this one, never through a symlink.

        Raises :class:`Changed` when ``name`` is not a directory any more (a symlink or a file swapped
        in: ``O_NOFOLLOW|O_DIRECTORY`` refuses it), or is another directory than ``expect``.
        """
        try:
            fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Changed(exc.errno, "no longer a directory (a symlink or a file now)",
                              os.path.join(self.path, name)) from None
            raise
        if expect is not None and identity(fd) != expect:
            os.close(fd)
            raise Changed(errno.ESTALE, "another directory took its place", os.path.join(self.path, name))
        return Directory(fd, os.path.join(self.path, name))

    def join(self, name: str) -> str:
        """The path of ``name`` here, for messages."""
        return os.path.join(self.path, name)

    # -- looking ------------------------------------------------------------------------------------

    def stat(self) -> os.stat_result:
        return os.fstat(self.fd)

    def lstat(self, name: str) -> os.stat_result:
        """``name``'s own stat (a symlink is not followed).

        ESTALE (another client removed or replaced the file a cached lookup named) is asked again
        through the name; while it lasts, it raises :class:`FileNotFoundError`, as a vanished file does.
        """
        try:
            return stale.retry(lambda: os.stat(name, dir_fd=self.fd, follow_symlinks=False))
        except OSError as exc:
            raise stale.vanished(exc, self.join(name)) from None

    def lexists(self, name: str) -> bool:
        try:
            self.lstat(name)
        except FileNotFoundError:
            return False
        return True

    def names(self, name: str, file: Identity) -> bool:
        """Whether ``name`` still is ``file`` (False when it cannot even be looked at)."""
        try:
            return identity(self.lstat(name)) == file
        except OSError:
            return False

    def listing(self) -> list[os.DirEntry[str]]:
        """Every entry (``entry.path`` is the bare name; ``entry.stat()`` asks relative to this directory)."""
        with os.scandir(self.fd) as it:
            return list(it)

    def read_untrusted(self, name: str, limit: int = RECORD_LIMIT) -> tuple[bytes, os.stat_result] | None:
        """:func:`~sharedfs.fs.safefile.read_untrusted` of ``name`` here."""
        return read_untrusted(name, limit, dir_fd=self.fd)

    def open_file(self, name: str, flags: int) -> int:
        """Open ``name`` here with ``flags`` plus ``O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC``."""
        return os.open(name, flags | NOFOLLOW, dir_fd=self.fd)

    # -- changing -----------------------------------------------------------------------------------

    def create_exclusive(self, name: str, mode: int) -> int:
        """:func:`~sharedfs.fs.safefile.create_exclusive` of ``name`` here."""
        return create_exclusive(name, mode, dir_fd=self.fd)

    def link(self, source: str, name: str) -> None:
        """Hard-link ``source`` (never through a symlink) to ``name``, both in this directory."""
        os.link(source, name, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)

    def unlink_if_same(self, name: str, held: Identity) -> bool:
        """Unlink ``name`` only while it is still the file ``held`` identifies; True when this call removed it.

        A name that is gone (or gone meanwhile) is not an error; any other failure (a sticky or
        read-only directory) is raised, so the caller learns the file stays.
        """
        try:
            st = self.lstat(name)
            if identity(st) != held or stat.S_ISDIR(st.st_mode):
                return False
            os.unlink(name, dir_fd=self.fd)
        except OSError as exc:
            if stale.gone(exc):  # ESTALE: another client removed or replaced it meanwhile
                return False
            raise
        return True

    def discard_if_same(self, name: str, held: Identity) -> None:
        """:meth:`unlink_if_same` for clean-up paths: never raises, so the error being handled is the one reported."""
        try:
            self.unlink_if_same(name, held)
        except OSError:
            pass

    def unlink_quietly(self, name: str) -> None:
        """Unlink ``name`` here without looking first; never raises (a file only this process ever names)."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError:
            pass

    # -- lifetime -----------------------------------------------------------------------------------

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
