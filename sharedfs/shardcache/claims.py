"""The records in a cache's coordination tree: download claims and in-use markers.

:func:`_alive` is the one place that decides whether a record's writer may still use its shard."""

from __future__ import annotations

import errno
import logging
import os
import secrets
import time
from typing import TYPE_CHECKING

from sharedfs.cluster import teamfiles
from sharedfs.errors import WaitTimeout
from sharedfs.fs import stale
from sharedfs.fs.directory import Changed, Directory, Identity
from sharedfs.fs.recordfile import create_record_in, identity
from sharedfs.fs.safefile import read_untrusted
from sharedfs.model.records import HolderRecord
from sharedfs.shardcache.tree import (
    LAG_BOUND,
    Layout,
    Swapped,
    _current,
    _held_tree,
    _tree,
    forget,
    key,
    layout,
    open_cache,
    open_part,
)

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self

    from sharedfs.model.policy import Policy, TeamCache

#: A marker or claim that cannot be read as a record counts as alive this long after it last changed:
#: long enough for a writer on a lagging filesystem to finish, short enough that ENOSPC, a killed
#: writer or a planted file cannot pin a shard forever.
GARBLED_GRACE = LAG_BOUND
#: Records are readable by everyone who can see the cache, whatever the umask: an evictor that
#: cannot read a live reader's marker would take it for garbage once GARBLED_GRACE ran out.
RECORD_MODE = 0o644
#: errnos of a full filesystem or an exhausted quota.
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def _tag() -> str:
    return f"{os.getpid()}.{secrets.token_hex(6)}"


def _space_error(exc: OSError, what: str, path: str, cache: str) -> OSError:
    # OSError appends ``path`` (the file that could not be written) to the message.
    return OSError(exc.errno, f"{os.strerror(exc.errno or 0)}: sharedfs could not write {what}, so it was removed "
                              f"again; free space (or quota) on the filesystem of {cache} and retry (sharedfs "
                              "writes a few hundred bytes for each shard being read or downloaded)", path)


def _create_record(where: Directory, name: str, record: HolderRecord, what: str, cache: str,
                   team: TeamCache | None = None) -> int:
    """Create ``name`` in ``where`` (O_EXCL, no symlink followed) holding ``record``; returns its open descriptor.

    A record that cannot be written completely is removed at once: an empty marker would
    otherwise keep its shard for GARBLED_GRACE, and say nothing about why.  In a team
    cache it is the group's (g+rw, the team's group).
    """

    def readable_by_all(fd: int) -> None:
        os.fchmod(fd, RECORD_MODE)  # ignore a restrictive umask: evictors of other users must read it
        if team is not None:
            teamfiles.give_fd(fd, team)

    try:
        return create_record_in(where, name, record.to_bytes(), RECORD_MODE, prepare=readable_by_all)
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise _space_error(exc, what, where.join(name), cache) from exc
        raise


def _read_record(path: str, *, dir_fd: int | None = None) -> tuple[HolderRecord | None, float]:
    """The record at ``path`` (``None`` if it is not one we could have written) and when it last changed.

    Raises FileNotFoundError when ``path`` is gone, and ESTALE when the name stays stale through
    :func:`~sharedfs.fs.stale.retry` ("cannot tell").  With ``dir_fd``, ``path`` is a name in that directory.
    """
    got = read_untrusted(path, dir_fd=dir_fd)
    if got is not None:
        data, st = got
        return HolderRecord.parse(data), st.st_mtime
    # A symlink, a FIFO, oversized or unreadable: its own age.
    return None, stale.retry(lambda: os.stat(path, dir_fd=dir_fd, follow_symlinks=False)).st_mtime


def _alive(path: str, policy: Policy, *, now: float | None = None, dir_fd: int | None = None) -> bool:
    """Whether the process that wrote the record ``path`` (a name in ``dir_fd``) may still be using its shard."""
    now = time.time() if now is None else now
    try:
        record, changed = _read_record(path, dir_fd=dir_fd)
    except FileNotFoundError:
        return False  # released while we looked
    except OSError as exc:
        if stale.is_stale(exc):
            return True  # stale through every retry: cannot tell, so the shard is kept
        raise
    if record is None:
        # Half-written or not visible yet, or garbled for good (ENOSPC, a killed writer, a
        # planted file): keep the shard for a bounded time only.
        return now - changed < GARBLED_GRACE
    from sharedfs.machinery.runtime import registry

    # The one rule for "holder gone" (plugins/liveness.py gives a record nobody can vouch for a
    # lifetime); "cannot tell" keeps the shard.
    return registry().holder_alive(record, policy) is not False


# -- in-use markers ---------------------------------------------------------------------------------


class InUse:
    """An in-use marker: while it exists, no sharedfs evictor deletes ``dest``.

    Created and removed through the descriptor of the tree's ``inuse/`` (entered never through a
    symlink, and only while it is the tree this process uses), and removed only while its name is
    still the marker written.  When a member replaced ``inuse/`` (a symlink to another directory,
    say), no marker is written, and that is said once: every evictor keeps every shard of the cache
    while it is so (:func:`readers`), and a member could remove a marker from the shared ``inuse/``
    anyway, so the marker is no protection against her.
    """

    def __init__(self, dest: str, policy: Policy | None = None) -> None:
        self.dest = dest
        self.path = ""
        self._lay: Layout | None = None
        self._held: Identity = (-1, -1)
        current = _current(policy)
        record = HolderRecord.mine(current.node_id, "inuse")
        cache_dir = os.path.dirname(os.path.abspath(dest))
        name = f"{key(os.path.basename(dest))}.{_tag()}"
        for attempt in range(2):
            try:
                lay, inuse = _tree(cache_dir, "inuse", current)
            except Swapped as why:
                _unmarked(cache_dir, why)
                return
            with inuse:
                try:
                    fd = _create_record(inuse, name, record, f"the in-use marker of {dest}", lay.cache, lay.team)
                except FileNotFoundError:
                    if attempt:
                        raise
                    forget(cache_dir)  # removed between our look and our create: once more
                    continue
                self._held = identity(fd)
                stale.close(fd)
                self._lay, self.path = lay, inuse.join(name)
                return

    def release(self) -> None:
        if self.path and self._lay is not None:
            lay, name, self.path = self._lay, os.path.basename(self.path), ""
            try:
                with _release_part(lay) as inuse:
                    inuse.unlink_if_same(name, self._held)
            except OSError:
                pass  # inuse/ gone or replaced since: the marker cannot be reached, an evictor's sweep removes it

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _release_part(lay: Layout) -> Directory:
    """``inuse/`` open by descriptor: from the sibling tree this process holds, or the verified cache's inside tree."""
    tree = _held_tree(lay)
    if tree is not None:
        with tree:
            return tree.subdirectory("inuse")
    if not lay.inside:
        return open_part(lay, "inuse")
    try:
        cache = open_cache(lay.cache, evicting=False)
    except Swapped as why:
        raise Changed(errno.ESTALE, str(why), lay.cache) from None
    with cache:
        return open_part(lay, "inuse", cache)


_said_unmarked: set[str] = set()


def _unmarked(cache_dir: str, why: Swapped) -> None:
    if cache_dir in _said_unmarked:
        return
    _said_unmarked.add(cache_dir)
    from sharedfs.machinery.log import decision

    decision(f"shard cache {cache_dir}: in-use markers not written, nothing written there: {why}; someone with "
             "write access to the cache's coordination tree may have replaced it (eviction keeps every shard "
             "while it is so): remove it and sharedfs makes it again", level=logging.WARNING, every_rank=True)


def readers(dest: str, policy: Policy | None = None) -> list[str]:
    """In-use markers of live readers of ``dest`` (dead ones are removed on the way, by descriptor).

    When ``inuse/`` is not sharedfs's directory any more (a member swapped it), nobody can tell:
    the directory itself is returned, which keeps the shard.
    """
    current = _current(policy)
    lay = layout(os.path.dirname(os.path.abspath(dest)), current)
    prefix = key(os.path.basename(dest)) + "."
    try:
        inuse = open_part(lay, "inuse")
    except FileNotFoundError:
        return []
    except Changed:
        return [lay.part("inuse")]
    with inuse:
        return [inuse.join(name) for name in live_markers(inuse, current, prefix)]


def live_markers(inuse: Directory, policy: Policy, prefix: str = "", now: float | None = None) -> list[str]:
    """The names in ``inuse`` (starting with ``prefix``) of markers whose readers may be alive; dead ones removed.

    Each is judged and removed relative to ``inuse``'s descriptor, and only while its name is
    still the file that was judged.
    """
    live = []
    for entry in inuse.listing():
        name = entry.name
        if not name.startswith(prefix):
            continue
        try:
            judged = identity(inuse.lstat(name))
        except FileNotFoundError:
            continue
        if _alive(name, policy, now=now, dir_fd=inuse.fd):
            live.append(name)
        else:
            inuse.unlink_if_same(name, judged)
    return live


class _Claim:
    """The claim of one download: created O_EXCL, changed only through the descriptor that created it.

    A group member can rename the claim away or put a symlink in its place meanwhile;
    writing through the descriptor then changes our own (now nameless) file, never theirs.
    It is removed through the descriptor of the ``claims/`` it was made in, held until then.
    """

    def __init__(self, where: Directory, name: str, fd: int) -> None:
        self.where = where
        self.name = name
        self.path = where.join(name)
        self.fd: int | None = fd

    @classmethod
    def take(cls, claims: Directory, name: str, record: HolderRecord, cache: str,
             team: TeamCache | None = None) -> _Claim:
        """Raises FileExistsError when someone else claimed it first."""
        fd = _create_record(claims, name, record, f"the download claim {name}", cache, team)
        return cls(Directory(os.dup(claims.fd), claims.path), name, fd)

    def publish(self, record: HolderRecord) -> None:
        assert self.fd is not None
        data = record.to_bytes()
        # Overwrite, then cut: no moment without allocated blocks, so a full disk cannot fail it halfway.
        try:
            os.pwrite(self.fd, data, 0)
            os.ftruncate(self.fd, len(data))
            os.fsync(self.fd)  # the claim promises a shard: the promise must not outlive a crash half-written
        except OSError as exc:
            if not stale.is_stale(exc):
                raise  # the caller abandons the claim: removed, as a claim that cannot be written is
            # Another client removed or replaced the claim: the shard is in place already, nothing left to promise.
        fd, self.fd = self.fd, None
        stale.close(fd)
        self.where.close()

    def abandon(self) -> None:
        if self.fd is not None:
            try:
                held = identity(self.fd)
            except OSError as exc:
                if not stale.is_stale(exc):
                    raise
                held = None  # another client removed or replaced it: no name of ours is left to remove
            if held is not None:
                self.where.discard_if_same(self.name, held)
            stale.close(self.fd)
            self.fd = None
        self.where.close()


def _claim_state(claim: str) -> HolderRecord | None:
    """The claim's record, once visible here; None if it vanished, never shows, or is not a claim."""
    from sharedfs.cluster.dirs import wait_for

    try:
        wait_for(claim, timeout=LAG_BOUND, what=f"download record {claim}")
        record, _ = _read_record(claim)
    except (WaitTimeout, OSError):
        return None
    if record is None or record.kind not in ("downloading", "published"):
        return None
    return record
