"""One download into the cache: written in ``tmp/<key>.<rand>/``, private to its process, fsynced, renamed in.

Across a quota realm (EXDEV) it is copied in through a :class:`~sharedfs.fs.publish.Publication` instead.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable

from sharedfs.cluster import teamfiles
from sharedfs.errors import UnsafeDirectoryError
from sharedfs.fs import stale
from sharedfs.fs.directory import Directory, Identity, identity
from sharedfs.fs.publish import Publication, Replaced
from sharedfs.fs.safefile import NOFOLLOW
from sharedfs.shardcache.heldtrees import empty as _empty
from sharedfs.shardcache.tree import _current

if TYPE_CHECKING:  # pragma: no cover
    from sharedfs.model.policy import Policy, TeamCache

Download = Callable[[str], None]
"""Writes the complete shard to the path it is given (in a private temp directory)."""


class _PrivateDir:
    """A directory only this process can write, for one download: ``tmp/<key>.<rand>``, mode 0700.

    The framework's downloader writes by *path* (``open(path, "wb")``, ``curl -o path``):
    in a group-writable directory a member could replace the file with a symlink to one of
    ours between our checks and its open.  Here nobody else can create an entry, and the
    path given out goes through our descriptor of the directory, which nobody can swap.
    It is made and removed through the descriptor of ``tmp/`` (``tmp``, the tree's own,
    :func:`~sharedfs.shardcache.tree.open_part`), never by a path a member could redirect.
    """

    def __init__(self, tmp: Directory, shard_key: str) -> None:
        self.tmp = tmp
        self.name = f"{shard_key}.{secrets.token_hex(4)}"
        self.path = tmp.join(self.name)
        try:
            os.mkdir(self.name, 0o700, dir_fd=tmp.fd)
            self.dir = tmp.subdirectory(self.name)
        except BaseException:
            tmp.close()
            raise
        st = self.dir.stat()
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            self.dir.close()
            tmp.close()
            raise UnsafeDirectoryError(f"{self.path} was replaced right after this process created it "
                                       f"(now owned by uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); "
                                       "someone with write access to the cache is interfering")
        self.fd = self.dir.fd
        self.made = identity(st)

    def file(self, name: str) -> str:
        proc = f"/proc/{os.getpid()}/fd/{self.fd}"
        return os.path.join(proc if os.path.isdir(proc) else self.path, name)

    def fsync(self, name: str) -> None:
        fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=self.fd)
        try:
            os.fsync(fd)  # data on disk before the name points at it
        finally:
            os.close(fd)

    def remove(self) -> None:
        try:
            _remove_private(self.tmp, self.name, self.dir, self.made)
        finally:
            self.dir.close()
            self.tmp.close()


def _remove_private(tmp: Directory, name: str, held: Directory, made: Identity) -> None:
    """Empty the download directory open as ``held`` through its descriptor; remove it while ``name`` still is it."""
    _empty(held.fd, "download", made[0])
    if tmp.names(name, made):
        try:
            os.rmdir(name, dir_fd=tmp.fd)  # only an empty directory can go
        except OSError:
            pass


_copied: set[str] = set()


def _publish(private: _PrivateDir, name: str, dest: str, cache: Directory, team: TeamCache | None = None) -> None:
    """Rename the finished download into ``cache`` (the cache's verified descriptor) as ``dest``'s name.

    Across quota realms (EXDEV) it is copied in first.  In a team cache the shard is the group's
    first, through a descriptor in the private directory (nobody else can swap it there): the
    downloader made it with its umask.
    """
    if team is not None:
        fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=private.fd)
        try:
            teamfiles.give_fd(fd, team)
        finally:
            os.close(fd)
    try:
        os.rename(name, os.path.basename(dest), src_dir_fd=private.fd, dst_dir_fd=cache.fd)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        # Same mount, yet "cross-device": CephFS quota realms, XFS/Lustre project quotas.
        _copy_in(private, name, dest, team)  # a durable publication: fsyncs the cache directory itself
        return
    try:
        os.fsync(cache.fd)
    except OSError:
        pass  # some network filesystems refuse fsync on directories; the rename is still atomic


def _copy_in(private: _PrivateDir, name: str, dest: str, team: TeamCache | None = None) -> None:
    directory = os.path.dirname(os.path.abspath(dest))
    if directory not in _copied:
        _copied.add(directory)
        from sharedfs.machinery.log import decision

        decision(f"shard cache {directory}: renaming a finished download into the cache fails with EXDEV (a quota "
                 "realm or project quota boundary), so each shard is copied in under a temporary name first",
                 level=logging.WARNING)
    src = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=private.fd)
    try:
        with _into_cache(dest, team, "sharedfs copied a shard into it") as out, \
                open(src, "rb", closefd=False) as reader:
            shutil.copyfileobj(reader, out.file, 1 << 20)
    finally:
        os.close(src)


@contextmanager
def _into_cache(dest: str, team: TeamCache | None, writing: str) -> Iterator[Publication]:
    """A publication of ``dest`` in the cache directory itself, committed when the block ends.

    Its temp name is hidden, like webdataset's own ``.temp`` files, and ends in ``.part``
    (:data:`~sharedfs.shardcache.tree.NOT_SHARDS`): eviction never takes it for a shard.  Its
    mode is what the framework's own ``open()`` would give the shard.  In a team cache the
    file is the group's before it gets its name.  ``writing`` says what filled it, for the
    error when someone swapped it meanwhile.
    """
    with Publication(dest, "wb", suffix=".part") as out:
        yield out
        if team is not None:
            teamfiles.give_fd(out.file.fileno(), team)
        try:
            out.commit()
        except Replaced:
            raise UnsafeDirectoryError(f"{out.temp} was replaced while {writing}") from None


def _remove_downloads(tmp: Directory, shard_key: str) -> None:
    """Remove this user's private download directories of ``shard_key`` from ``tmp`` (open).  Call holding its stripe.

    While the stripe is held nobody downloads a shard of it, so what is there was left by a
    process that died.  Other users' directories are private to them (their next evictor removes them).
    Each is entered and emptied by descriptor, and removed only while its name still is it.
    """
    try:
        entries = tmp.listing()
    except OSError as exc:
        if not stale.gone(exc):
            raise
        return  # tmp/ removed or replaced by another client: no download of ours is left in it
    for entry in entries:
        if not entry.name.startswith(shard_key + "."):
            continue
        try:
            st = tmp.lstat(entry.name)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            with tmp.subdirectory(entry.name, identity(st)) as held:
                _remove_private(tmp, entry.name, held, identity(st))
        except OSError:  # gone, or swapped since listed (Changed): nothing below it is touched
            continue


def download_atomic(dest: str, write: Download, policy: Policy | None = None) -> None:
    """Write ``dest`` through a unique temp file, fsync and rename: never a partial ``dest``.

    For callers without the per-shard protocol (webdataset's module-level ``download``).
    The temp file is created here (O_EXCL) and ``write`` gets a path through our
    descriptor, so a symlink planted at the temp name is never written through.  In a
    team cache the file is the group's before it gets its name.
    """
    directory = os.path.dirname(os.path.abspath(dest))
    team = teamfiles.team_of(directory, _current(policy))
    with _into_cache(dest, team, "a download was written to it") as out:
        proc = f"/proc/{os.getpid()}/fd/{out.file.fileno()}"
        write(proc if os.path.exists(proc) else out.temp)
