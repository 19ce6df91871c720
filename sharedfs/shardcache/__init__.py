"""A shard cache that many processes on many nodes fill, read and evict at once.

Used by the webdataset and wids shims (and usable directly).  What goes wrong
without it: webdataset 1.0's ``FileCache`` has no lock, so every worker of
every node downloads the same shard, into a temp name ``dest + ".temp{pid}"``
that collides across nodes; its ``LRUCleanup`` runs in every process and
deletes files others are about to open.  wids' ``ULockFile`` unlinks its lock
file on release, which splits waiters across inodes and, on NFS/FUSE, raises
``FileNotFoundError: ....tar.lock`` (webdataset#386); it downloads straight to
the final name, so a killed download leaves a truncated shard that later
readers trust.

Layout
------
The cache directory holds the shards and nothing else, exactly what the stock
framework puts there: its own listing and size accounting (webdataset's
``LRUCleanup``, wids' ``keep_most_recent_files``) must not count sharedfs.  The
coordination files live in a hidden sibling, on the same filesystem so that
every node sees them::

    <parent>/<cache>/                        the shards, named by the framework
    <parent>/.<cache>.sharedfs/              coordination; same group and mode as <cache>
        stripes/<NNN>                        lock stripes: a shard's lock is the stripe its name hashes
                                             to (1024 files at most, however many shards come and go)
        claims/<key>                         "downloading" / "published" HolderRecord, created O_EXCL
        inuse/<key>.<pid>.<rand>             HolderRecord of a reader that has the shard open or is opening it
        tmp/<key>.<rand>/                    one download in progress: mode 0700, private to its process
        evict.lock                           one evictor per cache at a time

Why a sibling: it is the nearest place outside the cache that is on the same
mount (checked: a cache that is itself a mount point -- a bind mount, a
container volume -- has its parent on another filesystem), so other nodes see
the claims and locks, and a finished download is renamed into the cache
atomically (where a quota realm or project quota boundary still makes that
rename fail with EXDEV, the shard is copied in under a hidden temp name, like
webdataset's own ``.temp`` files, and that is said once).  Stripes instead of a
lock file per shard: a per-shard lock file outlives its shard (unlinking it is
unsafe while others may wait on it: webdataset#386), so the directory grew by
one file per shard ever cached.  Two shards on one stripe serialise their
downloads, which with 16 downloads in flight delays about 1.5 % of them.  A
claim lives as long as its shard, a marker as long as its reader, a private
download directory as long as its download.

The sibling is not used -- the same tree goes to ``<cache>/.sharedfs/``, and
this is said once per cache -- when this process cannot create entries in the
parent, when the cache is a mount point, or when the parent is writable by
every user (``/tmp``) and the sibling is not owned by the cache's owner (anyone
could have created it first).  Every operation looks for a usable sibling first
and then for an existing ``<cache>/.sharedfs/``, so processes that chose
differently at the same first moment agree again at their next operation.

Removing the cache but keeping the sibling is harmless: a claim counts only
while its shard is visible, :func:`evict` removes claims of shards that are
gone, and a process that used a cache removes its sibling at exit if the cache
no longer exists (a cache in a ``TemporaryDirectory`` leaves nothing behind).
A ``<cache>/.sharedfs/`` without ``stripes/`` was left by an earlier sharedfs
(a lock file per shard); it is ignored, and can be deleted once no job of that
version uses the cache -- processes of that version do not coordinate with
this layout.

Team caches
-----------
A cache in a directory a group shares (setgid and group-writable, a default ACL
for a group, or ``SHAREDFS_SHARED_GROUP``: see ``plugins/teamcache.py``) is filled
by several users, each with her own umask.  Under umask 022 the framework makes
the cache directory 2755 and the first user's coordination tree would copy that
mode, so the next member could neither publish a shard nor leave an in-use marker.
In a team cache every entry this module makes is the group's, whatever the umask:
the cache directory (if this user made it) and the coordination tree get the
group's bits (g+rwx, setgid) and group; records, and every published shard (made by
the framework's downloader, a Python ``open`` or ``curl``, in the private download
directory), get g+rw and the group through their descriptor before they are
renamed into place.  The private download directories stay 0700: they are what
keeps a member from swapping the file a downloader writes to.

Hostile neighbours
------------------
A cache shared by a group is group-writable, and so is its coordination tree:
any member can rename an entry or plant a symlink there.  So nothing here
follows a symlink or rewrites a file through a path: records are created
``O_EXCL|O_NOFOLLOW`` and changed only through the descriptor that created them,
read with :func:`sharedfs.fs.safefile.read_untrusted` (no symlinks, no FIFOs, a size
cap) and accepted only if they parse as a :class:`~sharedfs.model.records.HolderRecord`;
a download is written into a directory only its process can write, reached
through a descriptor (``/proc/<pid>/fd/<n>``) that nobody can swap.

Guarantees: a shard is downloaded at most once per cache while its first
download succeeds (the claim makes this hold even where a new file stays
invisible to other nodes for a while, like NFS's negative lookup cache); a
shard is published by atomic rename after fsync, so a reader never sees a
partial one; the evictor deletes a shard only while holding its lock and while
no live reader has an in-use marker for it.  A marker that cannot be read
(garbled, foreign, a writer killed halfway) keeps its shard for
:data:`GARBLED_GRACE` seconds, not forever, and a marker that could not be
written completely (ENOSPC) is removed at once and the error says so.
Non-guarantee: a reader whose marker the evictor cannot see yet (lagging
metadata) may lose the race for a *closed* shard; it then finds the name
missing and fetches it again under the lock -- a second download, never a
missing or truncated file.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Callable

from sharedfs.cluster import teamfiles
from sharedfs.errors import LockTimeout, UnsafeDirectoryError, WaitTimeout
from sharedfs.fs.publish import fsync_dir
from sharedfs.fs.safefile import NOFOLLOW, create_exclusive, read_untrusted, write_all
from sharedfs.model.records import HolderRecord
from sharedfs.model.structs import frozen

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self

    from sharedfs.model.policy import Policy, TeamCache

log = logging.getLogger("sharedfs")

#: The fallback place of the coordination tree, inside the cache (sharedfs 0.1 always used it).
META = ".sharedfs"
#: The sibling of ``<parent>/<cache>`` is ``<parent>/.<cache>.sharedfs``.
SIBLING_SUFFIX = ".sharedfs"
SUBDIRS = ("stripes", "claims", "inuse", "tmp")
#: Lock stripes per cache.  Part of the on-disk protocol: every process of a cache must agree.
STRIPES = 1024
#: A file published this long ago that is still invisible is gone, not lagging (NFS acdirmax is 60 s).
LAG_BOUND = 60.0
#: In-use markers of processes whose liveness nobody can tell (another node, no scheduler
#: plugin) count as alive for this long.
STALE_AFTER = 6 * 3600.0
#: A marker or claim that cannot be read as a record counts as alive this long after it last changed:
#: long enough for a writer on a lagging filesystem to finish, short enough that ENOSPC, a killed
#: writer or a planted file cannot pin a shard forever.
GARBLED_GRACE = LAG_BOUND
#: Records are readable by everyone who can see the cache, whatever the umask: an evictor that
#: cannot read a live reader's marker would take it for garbage once GARBLED_GRACE ran out.
RECORD_MODE = 0o644
#: Files in a cache directory that are never shards (wids' and webdataset's own bookkeeping).
NOT_SHARDS = (".lock", ".part", ".db", ".db-journal")
#: errnos of a full filesystem or an exhausted quota.
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})

#: What :func:`key` makes; names in the coordination tree that do not match were not made by sharedfs.
KEY_PATTERN = r"[A-Za-z0-9_-]{0,60}-[0-9a-f]{16}"  # for re.fullmatch (compiled on first use, then cached by re)

Download = Callable[[str], None]
"""Writes the complete shard to the path it is given (in a private temp directory)."""


def key(name: str) -> str:
    """A file-name-safe, length-bounded key for a shard's coordination files."""
    digest = hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    readable = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:60]
    return f"{readable}-{digest}"


def stripe(shard_key: str) -> str:
    """The lock stripe of a shard key (the key's hash, so it can be computed from a claim's name)."""
    return f"{int(shard_key.rsplit('-', 1)[-1][:8], 16) % STRIPES:03x}"


def _current(policy: Policy | None) -> Policy:
    if policy is not None:
        return policy
    from sharedfs.machinery.runtime import policy as current

    return current()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# -- where the coordination tree is ---------------------------------------------------------------


@frozen
class Layout:
    """Where one cache keeps its coordination files (see the module docstring)."""

    cache: str  # the cache directory, symlinks resolved
    root: str  # the coordination tree: the sibling, or <cache>/.sharedfs
    inside: bool  # True for the fallback inside the cache
    #: The cache is a team cache (a group shares it): what this module makes there is the group's.
    team: TeamCache | None = None

    def part(self, name: str) -> str:
        return os.path.join(self.root, name)

    def stripe_lock(self, shard_key: str) -> str:
        return os.path.join(self.root, "stripes", stripe(shard_key))

    def claim(self, shard_key: str) -> str:
        return os.path.join(self.root, "claims", shard_key)


_paths_of: dict[str, tuple[str, str, str]] = {}
#: Layouts on the sibling, by the cache path callers use: stable, so never looked at again.
_layouts: dict[str, Layout] = {}
_said: set[str] = set()


def layout(cache_dir: str, policy: Policy | None = None) -> Layout:
    """The coordination layout of ``cache_dir`` (created on first use, with the cache if missing).

    Free once the sibling is in use; in the fallback, one ``lstat`` per call looks for a
    sibling another process made meanwhile (see the module docstring for the rules).
    """
    absolute = os.path.abspath(cache_dir)
    known = _layouts.get(absolute)
    if known is not None:
        return known
    real, sibling, inside = _paths(absolute, policy)
    team = _team_cache(real, policy)
    for _ in range(4):  # created (or found invisible and waited for), then looked at again
        cache_st = os.stat(real)
        if _sibling_usable(sibling, real, cache_st):
            return _remember(absolute, Layout(real, sibling, False, team))
        if _is_dir(os.path.join(inside, "stripes")):
            _say_inside(real, f"it exists there already (made by a process that could not use {sibling})")
            return Layout(real, inside, True, team)
        refused = _sibling_refused(real, sibling, cache_st)
        if refused is None:
            try:
                _create_tree(sibling, cache_st, team)
                continue  # look again: someone may have won the race with a tree we must not trust
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                refused = f"this process may not create {sibling} ({exc.strerror})"
        if _create_tree(inside, cache_st, team):
            _say_inside(real, refused)
            return Layout(real, inside, True, team)
    raise WaitTimeout(f"the coordination directory of {real} exists on another node but never became visible "
                      f"here within {LAG_BOUND:g} s (looked for {sibling} and {inside})")


def forget(cache_dir: str) -> None:
    """Forget what is known about ``cache_dir``'s layout (after someone removed the cache or its tree)."""
    absolute = os.path.abspath(cache_dir)
    _layouts.pop(absolute, None)
    _paths_of.pop(absolute, None)


def _remember(absolute: str, lay: Layout) -> Layout:
    if not _layouts:
        atexit.register(_drop_orphans)
    _layouts[absolute] = lay
    return lay


def _drop_orphans() -> None:
    """At exit: remove the sibling of every cache this process used that no longer exists.

    A cache in a temporary directory (``tempfile.TemporaryDirectory``, a test's tmp dir) is
    removed with everything in it; its sibling would stay behind forever.  Nothing in it
    means anything without the cache (no shard to claim, mark or lock), and a process that
    makes the cache again makes a new tree (every use re-creates what is missing).
    """
    for lay in list(_layouts.values()):
        if not os.path.lexists(lay.cache) and _is_dir(lay.root):
            shutil.rmtree(lay.root, ignore_errors=True)  # never follows a symlink


def _team_cache(real: str, policy: Policy | None) -> TeamCache | None:
    """The cache's team, if a group shares it; the cache directory itself is given to the group if it is ours.

    The framework made it (webdataset's ``FileCache``, wids' ``ShardListDataset``), with the
    creator's umask: 2755 under 022 would keep every other member from publishing a shard.
    """
    team = teamfiles.team_of(real, _current(policy))
    if team is None:
        return None
    try:
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    except OSError:
        return team
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid():
            teamfiles.give_fd(fd, team, st)
    finally:
        os.close(fd)
    return team


def _paths(absolute: str, policy: Policy | None) -> tuple[str, str, str]:
    known = _paths_of.get(absolute)
    if known is None:
        if not os.path.isdir(absolute):
            from sharedfs.cluster.dirs import makedirs  # never FileExistsError on lagging storage (lingua#49)

            makedirs(absolute, timeout=_current(policy).wait_timeout)
        # Resolve symlinks: the sibling belongs beside the real directory, on its filesystem.
        real = os.path.realpath(absolute)
        name = os.path.basename(real) or "root"
        sibling = os.path.join(os.path.dirname(real), f".{name}{SIBLING_SUFFIX}")
        if len(os.path.basename(sibling)) > 240:  # NAME_MAX is 255 on every filesystem we meet
            sibling = os.path.join(os.path.dirname(real), f".{name[:160]}-{key(name)[-16:]}{SIBLING_SUFFIX}")
        known = _paths_of[absolute] = (real, sibling, os.path.join(real, META))
    return known


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _sibling_usable(sibling: str, real: str, cache_st: os.stat_result) -> bool:
    try:
        st = os.lstat(sibling)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False  # a symlink or a file: never followed; _sibling_refused says why
    return not _world_writable(os.path.dirname(real)) or st.st_uid == cache_st.st_uid


def _world_writable(directory: str) -> bool:
    try:
        return bool(os.stat(directory).st_mode & stat.S_IWOTH)
    except OSError:
        return False


def _sibling_refused(real: str, sibling: str, cache_st: os.stat_result) -> str | None:
    """Why the sibling cannot be (created and) used, or ``None`` when this process may create it."""
    parent = os.path.dirname(real)
    if parent == real:
        return "the cache is the root directory"
    if _is_mount_point(real):
        return (f"{real} is a mount point, so its parent {parent} is another filesystem, which other nodes "
                "may not share")
    try:
        st = os.lstat(sibling)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        return f"{sibling} exists and is not a directory (a symlink is never followed); remove it"
    if _world_writable(parent):
        if st is not None:
            return (f"{sibling} in {parent}, which every user may write, is owned by uid {st.st_uid}, "
                    f"not by the cache's owner (uid {cache_st.st_uid}); remove it if nobody should have made it")
        if os.geteuid() != cache_st.st_uid:
            return (f"{parent} is writable by every user and this process does not own {real}, so a "
                    "coordination directory it created there could not be told from a planted one")
    return None


def _is_mount_point(real: str) -> bool:
    if os.path.ismount(real):  # another device, or the same inode as the parent
        return True
    from sharedfs.model.fsinfo import mount_for  # a bind mount of the same filesystem keeps st_dev

    try:
        return mount_for(real).mount_point == real
    except OSError:
        return False


def _create_tree(target: str, cache_st: os.stat_result, team: TeamCache | None = None) -> bool:
    """Create the coordination tree ``target`` atomically, with the cache's group and mode (a team's: the group's).

    True when it exists (made here or by someone else, and visible); False when someone else
    made it and it is not visible here yet (the caller looks again).  Built in a staging
    directory and renamed into place, so nobody ever sees it half-made or with the wrong mode.
    """
    parent = os.path.dirname(target)
    staging = tempfile.mkdtemp(prefix=os.path.basename(target) + ".new-", dir=parent)
    try:
        for sub in SUBDIRS:
            os.mkdir(os.path.join(staging, sub), 0o700)
        for path in (*(os.path.join(staging, sub) for sub in SUBDIRS), staging):
            _mirror(path, cache_st, team)
        os.rename(staging, target)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        return _visible_within(target, LAG_BOUND)
    fsync_dir(parent)
    return True


def _mirror(path: str, cache_st: os.stat_result, team: TeamCache | None = None) -> None:
    """Give the directory ``path`` (just made by us) the cache's group and permissions.

    Whoever may fill the cache may coordinate.  In a team cache that is the whole group,
    whatever mode the cache directory got from its creator's umask: the team's group,
    g+rwx and setgid.  Through a descriptor, never by name: in a group-writable tree a
    member could swap the new directory for a symlink to one of ours between our mkdir
    and a chmod, which would then open up our own directory.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise UnsafeDirectoryError(f"{path} was replaced right after this process created it; "
                                       "someone with write access to the cache is interfering")
        try:
            os.fchown(fd, -1, team.gid if team is not None else cache_st.st_gid)
        except OSError:
            pass  # not a member of that group: the directory keeps ours
        # Never the sticky bit: evictors remove other users' stale markers and claims.
        mode = (stat.S_IMODE(cache_st.st_mode) & 0o2777) | 0o700
        os.fchmod(fd, teamfiles.group_mode(mode, True) if team is not None else mode)
    finally:
        os.close(fd)


def _visible_within(path: str, timeout: float) -> bool:
    from sharedfs.cluster.dirs import wait_for

    try:
        wait_for(path, timeout=timeout, what=f"coordination directory {path}")
    except WaitTimeout:
        return False
    return True


def _say_inside(real: str, why: str) -> None:
    if real in _said:
        return
    _said.add(real)
    from sharedfs.machinery.log import decision

    decision(f"shard cache {real}: coordination files go to {os.path.join(real, META)} (visible to tools that "
             f"list the cache) because {why}", level=logging.WARNING)


def _tree(cache_dir: str, name: str, policy: Policy | None) -> tuple[Layout, str]:
    """``cache_dir``'s layout and its subdirectory ``name``, re-created if someone removed either."""
    for attempt in range(2):
        lay = layout(cache_dir, policy)
        path = lay.part(name)
        if _is_dir(path):
            return lay, path
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            return lay, path
        except FileNotFoundError:
            if attempt:
                raise
            forget(cache_dir)  # the whole tree (or the cache) was removed: resolve it again
            continue
        _mirror(path, os.stat(lay.cache), lay.team)
        return lay, path
    raise AssertionError("unreachable")


# -- records ---------------------------------------------------------------------------------------


def _tag() -> str:
    return f"{os.getpid()}.{secrets.token_hex(6)}"


def _space_error(exc: OSError, what: str, path: str, cache: str) -> OSError:
    # OSError appends ``path`` (the file that could not be written) to the message.
    return OSError(exc.errno, f"{os.strerror(exc.errno or 0)}: sharedfs could not write {what}, so it was removed "
                              f"again; free space (or quota) on the filesystem of {cache} and retry (sharedfs "
                              "writes a few hundred bytes for each shard being read or downloaded)", path)


def _create_record(path: str, record: HolderRecord, what: str, cache: str, team: TeamCache | None = None) -> int:
    """Create ``path`` (O_EXCL, no symlink followed) holding ``record``; returns its open descriptor.

    A record that cannot be written completely is removed at once: an empty marker would
    otherwise keep its shard for GARBLED_GRACE, and say nothing about why.  In a team
    cache it is the group's (g+rw, the team's group).
    """
    try:
        fd = create_exclusive(path, RECORD_MODE)
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise _space_error(exc, what, path, cache) from exc
        raise
    try:
        os.fchmod(fd, RECORD_MODE)  # ignore a restrictive umask: evictors of other users must read it
        if team is not None:
            teamfiles.give_fd(fd, team)
        write_all(fd, record.to_bytes())
    except BaseException as exc:
        _unlink_if_same(path, fd)
        os.close(fd)
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            raise _space_error(exc, what, path, cache) from exc
        raise
    return fd


def _unlink_if_same(path: str, fd: int) -> None:
    """Unlink ``path`` if it still names the file open as ``fd`` (a group member may have swapped it)."""
    try:
        mine, there = os.fstat(fd), os.lstat(path)
    except OSError:
        return
    if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
        _unlink(path)


def _read_record(path: str) -> tuple[HolderRecord | None, float]:
    """The record at ``path`` (``None`` if it is not one we could have written) and when it last changed.

    Raises FileNotFoundError when ``path`` is gone.
    """
    got = read_untrusted(path)
    if got is not None:
        data, st = got
        return HolderRecord.parse(data), st.st_mtime
    return None, os.lstat(path).st_mtime  # a symlink, a FIFO, oversized or unreadable: its own age


def _alive(path: str, policy: Policy, *, now: float | None = None) -> bool:
    """Whether the process that wrote the record ``path`` may still be using its shard."""
    now = time.time() if now is None else now
    try:
        record, changed = _read_record(path)
    except FileNotFoundError:
        return False  # released while we looked
    if record is None:
        # Half-written or not visible yet, or garbled for good (ENOSPC, a killed writer, a
        # planted file): keep the shard for a bounded time only.
        return now - changed < GARBLED_GRACE
    from sharedfs.machinery.runtime import registry

    verdict = registry().holder_alive(record, policy)
    if verdict is not None:
        return verdict
    return now - record.acquired_at < STALE_AFTER


# -- in-use markers ---------------------------------------------------------------------------------


class InUse:
    """An in-use marker: while it exists, no sharedfs evictor deletes ``dest``."""

    def __init__(self, dest: str, policy: Policy | None = None) -> None:
        self.dest = dest
        self.path = ""
        current = _current(policy)
        record = HolderRecord.mine(current.node_id, "inuse")
        cache_dir = os.path.dirname(os.path.abspath(dest))
        name = f"{key(os.path.basename(dest))}.{_tag()}"
        for attempt in range(2):
            lay, directory = _tree(cache_dir, "inuse", current)
            path = os.path.join(directory, name)
            try:
                os.close(_create_record(path, record, f"the in-use marker of {dest}", lay.cache, lay.team))
            except FileNotFoundError:
                if attempt:
                    raise
                forget(cache_dir)  # removed between our look and our create: once more
                continue
            self.path = path
            return

    def release(self) -> None:
        if self.path:
            _unlink(self.path)
            self.path = ""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def readers(dest: str, policy: Policy | None = None) -> list[str]:
    """In-use markers of live readers of ``dest`` (dead ones are removed on the way)."""
    current = _current(policy)
    lay = layout(os.path.dirname(os.path.abspath(dest)), current)
    directory = lay.part("inuse")
    prefix = key(os.path.basename(dest)) + "."
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
    except FileNotFoundError:
        return []
    live = []
    for name in names:
        path = os.path.join(directory, name)
        if _alive(path, current):
            live.append(path)
        else:
            _unlink(path)
    return live


# -- fetching ---------------------------------------------------------------------------------------


def shard_lock(dest: str, timeout: float = -1, policy: Policy | None = None):  # -> sharedfs.locks.SharedFSLock
    """The lock that serialises downloading, opening-after-download and evicting ``dest``.

    The lock of ``dest``'s stripe.  Waits without limit by default, as webdataset and
    wids do: the holder may be downloading a large shard over a slow link, and a waiter
    that gave up after ``SHAREDFS_WAIT_TIMEOUT`` would fail a healthy job.  A waiter says
    every few minutes whom it waits for, and a dead holder's lock is released by the
    kernel (flock/posix) or broken when a plugin proves it dead (soft).
    """
    from sharedfs.locks import lock

    current = _current(policy)
    # The stripe directory must exist before acquiring: a lock file that cannot be created
    # looks like contention to the lock, which would wait for it forever.
    lay, _ = _tree(os.path.dirname(os.path.abspath(dest)), "stripes", current)
    return lock(lay.stripe_lock(key(os.path.basename(dest))), timeout=timeout, policy=current)


def open_shard(dest: str, download: Download, *, mode: str = "rb", validate: Callable[[str], None] | None = None,
               policy: Policy | None = None) -> tuple[IO, InUse]:
    """Open ``dest``, downloading it first (once per cache) if it is missing.

    Returns the open file and the in-use marker; release the marker when done
    with the shard.  ``download(path)`` must write the whole shard to ``path``;
    ``validate(path)`` may raise to reject a download before it is published.
    """
    current = _current(policy)
    marker = InUse(dest, current)
    try:
        try:  # fast path: a published shard is complete (atomic rename), just open it
            return open(dest, mode), marker
        except FileNotFoundError:
            pass
        # One process per node goes for the shard lock; the node's others wait their turn on
        # node-local storage and then find the shard there, without passing through the lock
        # one by one (the shared filesystem sees nodes, not ranks).  Never taken while holding a
        # shard lock, so it cannot deadlock with one.
        from sharedfs.cluster import gates
        with gates.turn(f"shard:{os.path.abspath(dest)}"):
            try:
                return open(dest, mode), marker
            except FileNotFoundError:
                pass
            with shard_lock(dest, policy=current):
                ensure(dest, download, validate=validate, policy=current)
                return open(dest, mode), marker
    except BaseException:
        marker.release()
        raise


class _Claim:
    """The claim of one download: created O_EXCL, changed only through the descriptor that created it.

    A group member can rename the claim away or put a symlink in its place meanwhile;
    writing through the descriptor then changes our own (now nameless) file, never theirs.
    """

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd: int | None = fd

    @classmethod
    def take(cls, path: str, record: HolderRecord, cache: str, team: TeamCache | None = None) -> _Claim:
        """Raises FileExistsError when someone else claimed it first."""
        return cls(path, _create_record(path, record, f"the download claim {os.path.basename(path)}", cache, team))

    def publish(self, record: HolderRecord) -> None:
        assert self.fd is not None
        data = record.to_bytes()
        # Overwrite, then cut: no moment without allocated blocks, so a full disk cannot fail it halfway.
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))
        os.fsync(self.fd)  # the claim promises a shard: the promise must not outlive a crash half-written
        os.close(self.fd)
        self.fd = None

    def abandon(self) -> None:
        if self.fd is not None:
            _unlink_if_same(self.path, self.fd)
            os.close(self.fd)
            self.fd = None


class _PrivateDir:
    """A directory only this process can write, for one download: ``tmp/<key>.<rand>``, mode 0700.

    The framework's downloader writes by *path* (``open(path, "wb")``, ``curl -o path``):
    in a group-writable directory a member could replace the file with a symlink to one of
    ours between our checks and its open.  Here nobody else can create an entry, and the
    path given out goes through our descriptor of the directory, which nobody can swap.
    """

    def __init__(self, tmp_dir: str, shard_key: str) -> None:
        self.path = tempfile.mkdtemp(prefix=shard_key + ".", dir=tmp_dir)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
        st = os.fstat(self.fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            os.close(self.fd)
            raise UnsafeDirectoryError(f"{self.path} was replaced right after this process created it "
                                       f"(now owned by uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); "
                                       "someone with write access to the cache is interfering")

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
        os.close(self.fd)
        shutil.rmtree(self.path, ignore_errors=True)  # rmtree never follows symlinks


def ensure(dest: str, download: Download, *, validate: Callable[[str], None] | None = None,
           policy: Policy | None = None) -> bool:
    """Make ``dest`` exist.  Call with the shard lock held.  True when this call downloaded it."""
    if os.path.exists(dest):
        return False
    current = _current(policy)
    cache_dir = os.path.dirname(os.path.abspath(dest))
    if not os.path.isdir(cache_dir):
        forget(cache_dir)  # the cache was removed while this process used it: make it (and its tree) again
    lay, claims = _tree(cache_dir, "claims", current)
    name = os.path.basename(dest)
    shard_key = key(name)
    claim_path = os.path.join(claims, shard_key)
    record = HolderRecord.mine(current.node_id, "downloading")
    try:
        claim = _Claim.take(claim_path, record, lay.cache, lay.team)
    except FileExistsError:
        # Someone claimed this shard before us and has released the lock since: it either
        # published it (and the name is not visible here yet: lagging metadata) or died
        # mid-download.  Only the claim, created O_EXCL, can tell us which.
        seen = _claim_state(claim_path)
        if seen is not None and seen.kind == "published" and _published_visible(dest, seen, current):
            return False
        _remove_downloads(lay, shard_key)  # holding the lock: any partial of this shard is a dead one's
        _unlink(claim_path)
        claim = _Claim.take(claim_path, record, lay.cache, lay.team)
    private = None
    try:
        private = _PrivateDir(_tree(cache_dir, "tmp", current)[1], shard_key)
        download(private.file(name))
        private.fsync(name)
        if validate is not None:
            validate(private.file(name))
        _publish(private, name, dest, lay.team)
        claim.publish(HolderRecord.mine(current.node_id, "published"))
    except BaseException:
        claim.abandon()
        raise
    finally:
        if private is not None:
            private.remove()
    return True


_copied: set[str] = set()


def _publish(private: _PrivateDir, name: str, dest: str, team: TeamCache | None = None) -> None:
    """Rename the finished download to ``dest``; across quota realms (EXDEV) copy it in first.

    In a team cache the shard is the group's first, through a descriptor in the private
    directory (nobody else can swap it there): the downloader made it with its umask.
    """
    if team is not None:
        fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=private.fd)
        try:
            teamfiles.give_fd(fd, team)
        finally:
            os.close(fd)
    try:
        os.rename(name, dest, src_dir_fd=private.fd)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        # Same mount, yet "cross-device": CephFS quota realms, XFS/Lustre project quotas.
        _copy_in(private, name, dest, team)
    fsync_dir(os.path.dirname(os.path.abspath(dest)))


def _copy_in(private: _PrivateDir, name: str, dest: str, team: TeamCache | None = None) -> None:
    directory = os.path.dirname(os.path.abspath(dest))
    if directory not in _copied:
        _copied.add(directory)
        from sharedfs.machinery.log import decision

        decision(f"shard cache {directory}: renaming a finished download into the cache fails with EXDEV (a quota "
                 "realm or project quota boundary), so each shard is copied in under a temporary name first",
                 level=logging.WARNING)
    temp = os.path.join(directory, f".{os.path.basename(dest)}.{_tag()}.part")
    src = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=private.fd)
    try:
        out = create_exclusive(temp, 0o666)  # the mode the framework's own open() would give the shard
        try:
            with open(src, "rb", closefd=False) as reader, open(out, "wb", closefd=False) as writer:
                shutil.copyfileobj(reader, writer, 1 << 20)
            os.fsync(out)
            if team is not None:
                teamfiles.give_fd(out, team)
            if not _same_file(temp, out):
                raise UnsafeDirectoryError(f"{temp} was replaced while sharedfs copied a shard into it")
            os.rename(temp, dest)
        except BaseException:
            _unlink_if_same(temp, out)
            raise
        finally:
            os.close(out)
    finally:
        os.close(src)


def _same_file(path: str, fd: int) -> bool:
    try:
        there, mine = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


def _remove_downloads(lay: Layout, shard_key: str) -> None:
    """Remove this user's private download directories of ``shard_key``.  Call holding its stripe.

    While the stripe is held nobody downloads a shard of it, so what is there was left by a
    process that died.  Other users' directories are private to them (their next evictor removes them).
    """
    directory = lay.part("tmp")
    try:
        names = [n for n in os.listdir(directory) if n.startswith(shard_key + ".")]
    except FileNotFoundError:
        return
    for entry in names:
        path = os.path.join(directory, entry)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)


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


def _published_visible(dest: str, record: HolderRecord, policy: Policy) -> bool:
    """Wait (bounded) for a shard another node published to become visible here."""
    from sharedfs.cluster.dirs import wait_for

    remaining = LAG_BOUND - (time.time() - record.acquired_at)
    # Lagging metadata hides other nodes' new files, never this node's own: a shard published
    # here and missing now was removed (the cache deleted and made again, say), so do not wait.
    if remaining <= 0 or (record.node == policy.node_id and policy.node_id_trusted):
        return os.path.exists(dest)
    try:
        wait_for(dest, timeout=remaining, what=f"shard {dest}")
    except WaitTimeout:
        return False
    return True


def download_atomic(dest: str, write: Download, policy: Policy | None = None) -> None:
    """Write ``dest`` through a unique temp file, fsync and rename: never a partial ``dest``.

    For callers without the per-shard protocol (webdataset's module-level ``download``).
    The temp file is created here (O_EXCL) and ``write`` gets a path through our
    descriptor, so a symlink planted at the temp name is never written through.  In a
    team cache the file is the group's before it gets its name.
    """
    directory = os.path.dirname(os.path.abspath(dest))
    temp = os.path.join(directory, f".{os.path.basename(dest)}.{_tag()}.part")
    team = teamfiles.team_of(directory, _current(policy))
    fd = create_exclusive(temp, 0o666)
    try:
        proc = f"/proc/{os.getpid()}/fd/{fd}"
        write(proc if os.path.exists(proc) else temp)
        os.fsync(fd)
        if team is not None:
            teamfiles.give_fd(fd, team)
        if not _same_file(temp, fd):
            raise UnsafeDirectoryError(f"{temp} was replaced while a download was written to it")
        os.rename(temp, dest)
    except BaseException:
        _unlink_if_same(temp, fd)
        raise
    finally:
        os.close(fd)


# -- eviction ---------------------------------------------------------------------------------------


def _shards(cache_dir: str) -> Iterator[tuple[str, os.stat_result]]:
    for dirpath, dirnames, filenames in os.walk(cache_dir):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or name.endswith(NOT_SHARDS):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            yield path, st


@contextmanager
def evictor(cache_dir: str, policy: Policy | None = None) -> Iterator[bool]:
    """Hold ``cache_dir``'s evictor lock if nobody else does: yields True if this process may evict now.

    Also sweeps what dead processes left (markers, claims, private downloads) before yielding.
    """
    from sharedfs.locks import lock

    current = _current(policy)
    lay = layout(cache_dir, current)
    guard = lock(lay.part("evict.lock"), timeout=0, policy=current)
    try:
        guard.acquire()
    except LockTimeout:
        yield False  # another process is evicting this cache right now
        return
    try:
        _sweep(lay, current)
        yield True
    finally:
        guard.release()


_last_run: dict[str, float] = {}


def evict(cache_dir: str, max_bytes: float, *, interval: float | None = None,
          policy: Policy | None = None) -> list[str]:
    """Delete least recently used shards until ``cache_dir`` holds at most ``max_bytes``.

    Runs in one process per cache at a time (the others skip it), deletes a
    shard only under its lock and with no live reader, and removes temp files,
    markers and claims left by dead processes.  Returns the deleted paths.
    """
    now = time.time()
    if interval is not None and now - _last_run.get(cache_dir, 0.0) < interval:
        return []
    _last_run[cache_dir] = now
    if not os.path.isdir(cache_dir):
        return []
    current = _current(policy)
    with evictor(cache_dir, current) as mine:
        if not mine:
            return []
        shards = list(_shards(cache_dir))
        total = sum(st.st_size for _, st in shards)
        deleted: list[str] = []
        # Least recently used first: readers' opens update atime only under strictatime, so
        # take the later of access and modification (download) time.
        for path, st in sorted(shards, key=lambda item: max(item[1].st_atime, item[1].st_mtime)):
            if total <= max_bytes:
                break
            if try_evict(path, current):
                total -= st.st_size
                deleted.append(path)
        if deleted:
            log.debug("evicted %d shard(s) from %s", len(deleted), cache_dir)
        return deleted


def try_evict(path: str, policy: Policy | None = None) -> bool:
    """Delete the shard ``path`` unless a live reader has it or its lock is held.  True if deleted."""
    current = _current(policy)
    if readers(path, current):
        return False
    guard = shard_lock(path, policy=current)
    try:
        guard.acquire(timeout=0)
    except LockTimeout:
        return False  # being downloaded or opened right now (or another shard of its stripe is)
    try:
        if readers(path, current):  # re-check under the lock: a reader may have arrived
            return False
        # Claim first, then the shard: a crash in between leaves a shard without a claim,
        # which readers simply use; the other order would leave a claim promising a shard.
        lay = layout(os.path.dirname(os.path.abspath(path)), current)
        _unlink(lay.claim(key(os.path.basename(path))))
        _unlink(path)
        return True
    finally:
        guard.release()


def _sweep(lay: Layout, policy: Policy) -> None:
    """Remove what dead processes left: in-use markers, claims of shards no longer cached, partials."""
    now = time.time()
    directory = lay.part("inuse")
    for name in _listdir(directory):
        path = os.path.join(directory, name)
        if not _alive(path, policy, now=now):
            _unlink(path)
    # Only claims of shards that are gone are looked at (a claim of a cached shard goes when it is
    # evicted): one read per orphan, not one per cached shard.
    present = {key(name) for name in _listdir(lay.cache)}
    stale: dict[str, set[str]] = {}
    for name in _listdir(lay.part("claims")):
        if name not in present:
            stale.setdefault(name, set()).add("claim")
    for name in _listdir(lay.part("tmp")):
        if _owned_dir(os.path.join(lay.part("tmp"), name)):  # others' partials are private to them
            stale.setdefault(name.rsplit(".", 1)[0], set()).add("tmp")
    for shard_key, what in stale.items():
        if re.fullmatch(KEY_PATTERN, shard_key):
            _sweep_shard(lay, shard_key, what, policy, now)


def _listdir(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def _owned_dir(path: str) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _sweep_shard(lay: Layout, shard_key: str, what: set[str], policy: Policy, now: float) -> None:
    """Under ``shard_key``'s stripe (never waiting for it), remove its stale claim and dead partials.

    Holding the stripe, nobody downloads a shard of it: a "downloading" claim or a private
    download directory is a dead process's.
    """
    from sharedfs.locks import lock

    guard = lock(lay.stripe_lock(shard_key), timeout=0, policy=policy)
    try:
        guard.acquire()
    except LockTimeout:
        return  # someone downloads or evicts a shard of this stripe: next time
    try:
        if "tmp" in what:
            _remove_downloads(lay, shard_key)
        if "claim" in what:
            _sweep_claim(lay.claim(shard_key), now)
    finally:
        guard.release()


def _sweep_claim(path: str, now: float) -> None:
    try:
        record, changed = _read_record(path)
    except FileNotFoundError:
        return
    if record is None:
        if now - changed > GARBLED_GRACE:
            _unlink(path)  # not a record (ENOSPC, a killed writer, a planted file)
    elif record.kind != "published":
        _unlink(path)  # "downloading" while we hold its stripe: its downloader is gone
    elif now - record.acquired_at > LAG_BOUND:
        # Its shard was not in the cache when we listed it (removed by another tool or by
        # hand), and lagging metadata can no longer hide it: the claim promises nothing.
        # A shard published again since is younger than LAG_BOUND and keeps its claim.
        _unlink(path)


__all__ = ["InUse", "Layout", "download_atomic", "ensure", "evict", "evictor", "forget", "key", "layout",
           "open_shard", "readers", "shard_lock", "stripe", "try_evict"]
