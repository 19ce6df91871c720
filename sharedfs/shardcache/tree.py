"""Where a shard cache keeps things: the shards, and the coordination tree beside them.

The module docstring of :mod:`sharedfs.shardcache` draws the tree and says why it is a
hidden sibling of the cache (``<parent>/.<cache>.sharedfs``) and when it falls back to
``<cache>/.sharedfs``.  Here: the names (a shard's key and lock stripe), finding or
creating the tree (atomically, with the cache's group and mode, a team's in a team
cache), and re-creating a part of it someone removed.  Changes to where anything lives
go here; every other module asks :func:`layout`.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import logging
import os
import re
import secrets
import stat
from typing import TYPE_CHECKING

from sharedfs.cluster import teamfiles
from sharedfs.errors import UnsafeDirectoryError, WaitTimeout
from sharedfs.fs import stale, trustedpath
from sharedfs.fs.directory import Changed, Directory, identity
from sharedfs.fs.safefile import NOFOLLOW
from sharedfs.model.records import user_name
from sharedfs.model.structs import frozen

if TYPE_CHECKING:  # pragma: no cover
    from sharedfs.model.policy import Policy, TeamCache

#: The fallback place of the coordination tree, inside the cache (sharedfs 0.1 always used it).
META = ".sharedfs"
#: The sibling of ``<parent>/<cache>`` is ``<parent>/.<cache>.sharedfs``.
SIBLING_SUFFIX = ".sharedfs"
SUBDIRS = ("stripes", "claims", "inuse", "tmp")
#: Lock stripes per cache.  Part of the on-disk protocol: every process of a cache must agree.
STRIPES = 1024
#: A file published this long ago that is still invisible is gone, not lagging (NFS acdirmax is 60 s).
LAG_BOUND = 60.0
#: Files in a cache directory that are never shards (wids' and webdataset's own bookkeeping).
NOT_SHARDS = (".lock", ".part", ".db", ".db-journal")

#: What :func:`key` makes; names in the coordination tree that do not match were not made by sharedfs.
KEY_PATTERN = r"[A-Za-z0-9_-]{0,60}-[0-9a-f]{16}"  # for re.fullmatch (compiled on first use, then cached by re)


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


_paths_of: dict[str, tuple[str, str, str, str | None]] = {}
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
    real, sibling, inside, planted = _paths(absolute, policy)
    team = _team_cache(real, policy) if planted is None else None
    for _ in range(4):  # created (or found invisible and waited for), then looked at again
        cache_st = os.stat(real)
        if _sibling_usable(sibling, real, cache_st):
            return _remember(absolute, Layout(real, sibling, False, team))
        if _is_dir(os.path.join(inside, "stripes")):
            _say_inside(real, f"it exists there already (made by a process that could not use {sibling})")
            return Layout(real, inside, True, team)
        # Reached through a symlink someone else may have planted: nothing is created beside where it
        # points (that could be any directory of ours); the tree goes inside the cache, which the
        # framework fills through the same symlink anyway.
        refused = planted or _sibling_refused(real, sibling, cache_st)
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
    """Forget what is known about ``cache_dir``'s layout (after someone removed the cache or its tree).

    Not the identity of the directory this process used there (:func:`open_cache`): only a cache
    directory this process makes again replaces it, never one it merely finds at that name.
    """
    absolute = os.path.abspath(cache_dir)
    _layouts.pop(absolute, None)
    _paths_of.pop(absolute, None)


def _remember(absolute: str, lay: Layout) -> Layout:
    if not _layouts:
        atexit.register(_drop_orphans)
    _hold(lay.root)
    _layouts[absolute] = lay
    return lay


#: The sibling trees this process uses, held open from first use: path -> (descriptor, st_dev, st_ino).
_held: dict[str, tuple[int, int, int]] = {}
#: Opening a directory a group member may have swapped: never a symlink, never blocking, never inherited by exec.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW


def _hold(root: str) -> None:
    """Keep a descriptor of the coordination tree this process uses: at exit, only that very tree may go."""
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError:
        return  # gone again already: nothing of ours will be removed at exit
    st = os.fstat(fd)
    old = _held.pop(root, None)
    if old is not None:
        os.close(old[0])  # the tree was made again (after forget): the new one is what this process uses
    _held[root] = (fd, st.st_dev, st.st_ino)


def _drop_orphans() -> None:
    """At exit: remove the sibling of every cache this process used that no longer exists.

    A cache in a temporary directory (``tempfile.TemporaryDirectory``, a test's tmp dir) is
    removed with everything in it; its sibling would stay behind forever.  Nothing in it
    means anything without the cache (no shard to claim, mark or lock), and a process that
    makes the cache again makes a new tree (every use re-creates what is missing).

    In a group-writable parent any member may rename the cache and its tree away and put
    one of *our* directories (which she cannot delete) at the sibling's name; removing by
    path would then delete our own files for her.  So only the very tree this process
    held open goes (same device and inode at that name, looked up in the parent, never
    through a symlink), emptied through descriptors, and only of the names sharedfs makes
    there; anything else stays, with one line saying so.
    """
    for lay in list(_layouts.values()):
        held = _held.get(lay.root)
        if held is not None and not lay.inside and not os.path.lexists(lay.cache):
            _drop_tree(lay, *held)


def _drop_tree(lay: Layout, fd: int, dev: int, ino: int) -> None:
    parent, name = os.path.split(lay.root)
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        try:
            st = stale.retry(lambda: os.stat(name, dir_fd=parent_fd, follow_symlinks=False))
        except OSError as exc:
            if stale.gone(exc):  # removed or moved away (or stale every time: cannot tell): nothing is removed
                return
            raise
        if (st.st_dev, st.st_ino) != (dev, ino):
            _say_left(lay.root, f"it is not the coordination directory this process used for {lay.cache} (that "
                                "was moved away, and something else was put at its name)")
            return
        left = _empty(fd, "top", dev)
        if left:
            _say_left(lay.root, f"it holds {', '.join(sorted(left)[:3])}, which sharedfs does not make there")
            return
        try:
            os.rmdir(name, dir_fd=parent_fd)  # fails on anything not empty: only an empty directory can go
        except OSError:
            pass
    finally:
        os.close(parent_fd)


#: What sharedfs makes in a coordination tree, per directory: name pattern -> what it is ("file", or the
#: directory's own rules).  A download directory (tmp/<key>.<rand>) holds whatever the framework wrote.
_NAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "top": tuple((re.escape(sub), sub) for sub in SUBDIRS) + ((r"evict\.lock(\..*)?", "file"),),
    "stripes": ((r"[0-9a-f]{3}(\..*)?", "file"),),
    "claims": ((KEY_PATTERN + r"(\..*)?", "file"),),
    "inuse": ((KEY_PATTERN + r"\..+", "file"),),
    "tmp": ((KEY_PATTERN + r"\..+", "download"),),
    "download": ((r".*", "file"), (r".*", "download")),
}


#: How deep :func:`_empty` descends (a download directory holds what a framework wrote: a file, seldom a tree).
EMPTY_DEPTH = 16


def _empty(dir_fd: int, rules: str, dev: int, depth: int = 0) -> list[str]:
    """Remove, through the directory open as ``dir_fd``, what sharedfs makes there; the names left behind.

    Never follows a symlink (a symlink is removed as the name it is, if its name is one of ours),
    never enters another filesystem, never descends more than :data:`EMPTY_DEPTH` levels.
    """
    left: list[str] = []
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return ["(unreadable)"]
    for name in names:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        except OSError:
            left.append(name)
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        kinds = [kind for pattern, kind in _NAMES[rules] if re.fullmatch(pattern, name)]
        kind = next((k for k in kinds if (k != "file") == is_dir), None)
        if kind is None or (is_dir and (st.st_dev != dev or depth >= EMPTY_DEPTH)):
            left.append(name)
            continue
        try:
            if not is_dir:
                os.unlink(name, dir_fd=dir_fd)
                continue
            sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            try:
                if (os.fstat(sub).st_ino, os.fstat(sub).st_dev) != (st.st_ino, st.st_dev):
                    left.append(name)  # swapped between the look and the open
                    continue
                left.extend(f"{name}/{inner}" for inner in _empty(sub, kind, dev, depth + 1))
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=dir_fd)
        except FileNotFoundError:
            continue
        except OSError:
            left.append(name)
    return left


def _say_left(root: str, why: str) -> None:
    from sharedfs.machinery.log import decision

    decision(f"{root} was left in place at exit: {why}", level=logging.WARNING, every_rank=True)


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
        # Opened by name: a directory on the way may have been swapped for a symlink since it was resolved.
        if st.st_uid == os.geteuid() and _opened_at(fd, real):
            teamfiles.give_fd(fd, team, st)
    finally:
        os.close(fd)
    return team


def _paths(absolute: str, policy: Policy | None) -> tuple[str, str, str, str | None]:
    """The cache's real path, its sibling, its inside tree, and why the sibling must not be made (a planted link)."""
    known = _paths_of.get(absolute)
    if known is None:
        made = not os.path.isdir(absolute)
        if made:
            from sharedfs.cluster.dirs import makedirs  # never FileExistsError on lagging storage (lingua#49)

            makedirs(absolute, timeout=_current(policy).wait_timeout)
        # Resolve symlinks: the sibling belongs beside the real directory, on its filesystem -- unless a
        # symlink on the way is not the user's own choice (sharedfs.fs.trustedpath).
        resolved = trustedpath.resolve(absolute)
        real = resolved.real
        planted = None
        if resolved.planted is not None:
            teamfiles.refuse(absolute, resolved, _current(policy))
            link = resolved.planted
            planted = f"{absolute} is reached through the symlink {link.link}, made by {link.who()}, and {link.why()}"
        name = os.path.basename(real) or "root"
        sibling = os.path.join(os.path.dirname(real), f".{name}{SIBLING_SUFFIX}")
        if len(os.path.basename(sibling)) > 240:  # NAME_MAX is 255 on every filesystem we meet
            sibling = os.path.join(os.path.dirname(real), f".{name[:160]}-{key(name)[-16:]}{SIBLING_SUFFIX}")
        known = _paths_of[absolute] = (real, sibling, os.path.join(real, META), planted)
        if made or absolute not in _cache_ids:
            _note_cache(absolute, real)
    return known


#: The cache directory each cache path led to when this process first used it (or made it again):
#: (st_dev, st_ino, st_uid).  What eviction removes shards from; never re-read from a name it finds later.
_cache_ids: dict[str, tuple[int, int, int]] = {}


class Swapped(Exception):
    """A cache directory's name no longer leads to the directory this process used there: nothing in it is removed."""


def _note_cache(absolute: str, real: str) -> None:
    try:
        fd = os.open(real, _DIR_FLAGS)
    except OSError:
        _cache_ids.pop(absolute, None)  # not a directory now: nothing can be proven, nothing will be removed
        return
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    _cache_ids[absolute] = (st.st_dev, st.st_ino, st.st_uid)


def open_cache(cache_dir: str, policy: Policy | None = None, *, evicting: bool = True) -> Directory:
    """``cache_dir`` open by descriptor, proven to be the directory this process first used (or made) there.

    Shards are looked at and removed only through it.  Raises :class:`Swapped`, saying why, when its
    name is a symlink now (``O_NOFOLLOW``) or another directory (device, inode, owner) took its place;
    when ``evicting``, also when the cache is reached through a symlink someone else may have planted
    (:mod:`sharedfs.fs.trustedpath`): the job may still read and write the path it was given, as the
    stock framework does, but nothing there is removed to fit a size.  :class:`FileNotFoundError`
    when it is gone.
    """
    absolute = os.path.abspath(cache_dir)
    real, _, _, planted = _paths(absolute, policy)
    if planted is not None and evicting:
        raise Swapped(planted)
    held = _cache_ids.get(absolute)
    try:
        fd = stale.retry(lambda: os.open(real, _DIR_FLAGS))
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Swapped(f"{real} is now {_what_is(real)}, not the directory this process used as the cache") from None
        raise stale.vanished(exc, real) from None  # replaced by another client every time we asked: gone here
    st = os.fstat(fd)
    if held != (st.st_dev, st.st_ino, st.st_uid):
        os.close(fd)
        was = f"inode {held[1]}, owner {user_name(held[2])}" if held else "unknown"
        raise Swapped(f"{real} is another directory (inode {st.st_ino}, owner {user_name(st.st_uid)}) than "
                      f"the one this process used as the cache ({was})")
    return Directory(fd, real)


def open_part(lay: Layout, name: str, cache: Directory | None = None) -> Directory:
    """The part ``name`` (``inuse``, ``claims``...) of ``lay``'s coordination tree, open by descriptor.

    In a team cache the tree is group-writable: a member may replace a part, or the sibling itself
    (its parent is writable too), with a symlink to any directory of ours.  So the tree is entered
    by name from its parent's descriptor, never through a symlink, and must be the tree this
    process holds open (device and inode); the inside tree from ``cache``'s descriptor when given.
    Raises :class:`~sharedfs.fs.directory.Changed` when something else is there now, and
    :class:`FileNotFoundError` when it is missing.
    """
    with _open_tree(lay, cache) as tree:
        return _subdirectory(tree, name)


def _open_tree(lay: Layout, cache: Directory | None) -> Directory:
    if lay.inside and cache is not None:
        return _subdirectory(cache, META)
    parent, name = os.path.split(lay.root)
    held = None if lay.inside else _held.get(lay.root)
    with Directory.open(parent) as up:
        return _subdirectory(up, name, (held[1], held[2]) if held is not None else None)


def _subdirectory(where: Directory, name: str, expect: tuple[int, int] | None = None) -> Directory:
    """``where.subdirectory``, asked again through the name on ESTALE; stale every time, :class:`FileNotFoundError`.

    A directory another client removed or replaced is missing here, and the caller makes it again.
    """
    try:
        return stale.retry(lambda: where.subdirectory(name, expect))
    except Changed:
        raise  # not the directory expected (its errno is ESTALE too): never taken for a vanished one
    except OSError as exc:
        raise stale.vanished(exc, where.join(name)) from None


def _held_tree(lay: Layout) -> Directory | None:
    """The sibling tree this process holds open since first use (its own, wherever a member renamed it), or None.

    What is written through it stays in sharedfs's own tree; a tree removed meanwhile refuses new
    entries (ENOENT), and the caller makes it again.
    """
    held = None if lay.inside else _held.get(lay.root)
    if held is None:
        return None
    try:
        tree = Directory(os.dup(held[0]), lay.root)
    except OSError:
        return None  # closed by someone (a forked child that closed its fds): entered by name, identity checked
    try:
        same = identity(tree.fd) == held[1:]  # closed and the number reused: likewise
    except OSError as exc:
        if not stale.is_stale(exc):
            tree.close()
            raise
        same = False  # removed by another client: entered by name, and made again if missing
    if not same:
        tree.close()
        return None
    return tree


def _what_is(path: str) -> str:
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return f"a symlink to {os.readlink(path)} (made by {user_name(st.st_uid)})"
    except OSError:
        pass
    return "not a directory"


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _sibling_usable(sibling: str, real: str, cache_st: os.stat_result) -> bool:
    try:
        st = stale.retry(lambda: os.lstat(sibling))
    except OSError as exc:
        if stale.gone(exc):
            return False
        raise
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
        st = stale.retry(lambda: os.lstat(sibling))
    except OSError as exc:
        if not stale.gone(exc):
            raise
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        return f"{sibling} exists and is not a directory (a symlink is never followed); remove it"
    if _world_writable(parent):
        # The cache owner's sibling, missing a moment ago here (another node's shows late): use it, not the fallback.
        if st is not None and st.st_uid != cache_st.st_uid:
            return (f"{sibling} in {parent}, which every user may write, is owned by uid {st.st_uid}, "
                    f"not by the cache's owner (uid {cache_st.st_uid}); remove it if nobody should have made it")
        if st is None and os.geteuid() != cache_st.st_uid:
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
    The staging directory is made, filled and removed through descriptors: a member who renames
    it away and puts a directory of ours at its name gets nothing made in, or removed from, that.
    """
    parent, base = os.path.split(target)
    with Directory.open(parent) as up:
        name = f"{base}.new-{secrets.token_hex(4)}"
        os.mkdir(name, 0o700, dir_fd=up.fd)
        staging = up.subdirectory(name)  # never through a symlink swapped in since
        try:
            made = identity(staging.fd)
            try:
                if staging.stat().st_uid != os.geteuid() or staging.listing():
                    raise UnsafeDirectoryError(f"{staging.path} was replaced right after this process created it; "
                                               "someone with write access to the cache is interfering")
                for sub in SUBDIRS:
                    os.mkdir(sub, 0o700, dir_fd=staging.fd)
                    with staging.subdirectory(sub) as part:
                        _mirror_fd(part, cache_st, team)
                _mirror_fd(staging, cache_st, team)
                if not up.names(name, made):
                    raise UnsafeDirectoryError(f"{staging.path} was renamed away while this process built it; "
                                               "someone with write access to the cache is interfering")
                os.rename(name, base, src_dir_fd=up.fd, dst_dir_fd=up.fd)
            except OSError as exc:
                _remove_staging(up, name, staging, made)
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or isinstance(exc, UnsafeDirectoryError):
                    raise
                return _visible_within(target, LAG_BOUND)
        finally:
            staging.close()
        try:
            os.fsync(up.fd)
        except OSError:
            pass  # some network filesystems refuse fsync on directories; the rename is still atomic
    return True


def _remove_staging(up: Directory, name: str, staging: Directory, made: tuple[int, int]) -> None:
    """Remove the empty parts made in ``staging``, then ``staging`` itself only while ``name`` still is it."""
    for sub in SUBDIRS:
        try:
            os.rmdir(sub, dir_fd=staging.fd)  # only an empty directory goes: nothing else was made there
        except OSError:
            pass
    if up.names(name, made):
        try:
            os.rmdir(name, dir_fd=up.fd)
        except OSError:
            pass


def _mirror_fd(made: Directory, cache_st: os.stat_result, team: TeamCache | None = None) -> None:
    """Give the directory open as ``made`` (just made by us) the cache's group and permissions.

    Whoever may fill the cache may coordinate.  In a team cache that is the whole group,
    whatever mode the cache directory got from its creator's umask: the team's group,
    g+rwx and setgid.  Through a descriptor, never by name: in a group-writable tree a
    member could swap the new directory for a symlink to one of ours between our mkdir
    and a chmod, which would then open up our own directory.
    """
    try:
        owner = made.stat().st_uid
    except OSError as exc:
        raise stale.vanished(exc, made.path) from None  # removed by another client since: made again by the caller
    if owner != os.geteuid():
        raise UnsafeDirectoryError(f"{made.path} was replaced right after this process created it; "
                                   "someone with write access to the cache is interfering")
    try:
        os.fchown(made.fd, -1, team.gid if team is not None else cache_st.st_gid)
    except OSError:
        pass  # not a member of that group: the directory keeps ours
    # Never the sticky bit: evictors remove other users' stale markers and claims.
    mode = (stat.S_IMODE(cache_st.st_mode) & 0o2777) | 0o700
    try:
        os.fchmod(made.fd, teamfiles.group_mode(mode, True) if team is not None else mode)
    except OSError as exc:
        raise stale.vanished(exc, made.path) from None


def _opened_at(fd: int, path: str) -> bool:
    """Whether the directory open as ``fd`` is really at ``path`` (a real path): nothing on the way was swapped.

    ``O_NOFOLLOW`` guards only the last component; this checks all of them, after the open,
    on the descriptor that is then used.  Without ``/proc`` it cannot be proven: no.
    """
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == path
    except OSError:
        return False


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


def _tree(cache_dir: str, name: str, policy: Policy | None) -> tuple[Layout, Directory]:
    """``cache_dir``'s layout and its part ``name`` open by descriptor, re-created if someone removed either.

    The part is made and entered through the tree's descriptor (:func:`open_part`; the inside
    tree through the cache's, :func:`open_cache`), so a member who replaced the tree or the part
    with a symlink, or another directory, gets nothing written there: :class:`Swapped` says so.
    """
    for attempt in range(2):
        lay = layout(cache_dir, policy)
        try:
            return lay, _enter(lay, cache_dir, name, policy)
        except FileNotFoundError:
            if attempt:
                raise
            forget(cache_dir)  # the whole tree (or the cache) was removed: resolve it again
        except Changed as exc:
            raise Swapped(f"{exc.filename} is {exc.strerror}, not the coordination directory this process "
                          "uses") from None
    raise AssertionError("unreachable")


def _enter(lay: Layout, cache_dir: str, name: str, policy: Policy | None) -> Directory:
    cache = open_cache(cache_dir, policy, evicting=False) if lay.inside else None
    try:
        with _held_tree(lay) or _open_tree(lay, cache) as tree:
            try:
                return _subdirectory(tree, name)
            except FileNotFoundError:
                pass
            try:
                os.mkdir(name, 0o700, dir_fd=tree.fd)
            except FileExistsError:
                return _subdirectory(tree, name)
            part = _subdirectory(tree, name)
            try:
                _mirror_fd(part, tree.stat(), lay.team)  # the tree has the cache's group and mode already
            except BaseException:
                part.close()
                raise
            return part
    finally:
        if cache is not None:
            cache.close()
