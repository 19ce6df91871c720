"""Where a shard cache keeps things: its coordination tree found, made, entered and re-made by descriptor.

Every other module asks :func:`layout`; the tree's drawing and why it is a sibling: :mod:`sharedfs.shardcache`.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
from typing import TYPE_CHECKING

from sharedfs.cluster import teamfiles
from sharedfs.errors import WaitTimeout
from sharedfs.fs import stale, trustedpath
from sharedfs.fs.directory import Changed, Directory, identity
from sharedfs.fs.safefile import NOFOLLOW
from sharedfs.model.records import user_name
from sharedfs.shardcache.heldtrees import DIR_FLAGS, drop_orphans, held_trees, hold
from sharedfs.shardcache.maketree import (
    create_tree,
    is_dir,
    mirror_fd,
    opened_at,
    sibling_refused,
    sibling_usable,
    what_is,
)
from sharedfs.shardcache.treenames import (
    KEY_PATTERN,
    LAG_BOUND,
    META,
    NOT_SHARDS,
    SIBLING_SUFFIX,
    STRIPES,
    SUBDIRS,
    Layout,
    key,
    stripe,
)
from sharedfs.shardcache.treenames import sibling as sibling_basename

if TYPE_CHECKING:  # pragma: no cover
    from sharedfs.model.policy import Policy, TeamCache

__all__ = ["KEY_PATTERN", "LAG_BOUND", "META", "NOT_SHARDS", "SIBLING_SUFFIX", "STRIPES", "SUBDIRS", "Layout",
           "Swapped", "forget", "key", "layout", "open_cache", "open_part", "stripe"]


def _current(policy: Policy | None) -> Policy:
    if policy is not None:
        return policy
    from sharedfs.machinery.runtime import policy as current

    return current()


_paths_of: dict[str, tuple[str, str, str, str | None]] = {}
#: Layouts on the sibling, by the cache path callers use: stable, so never looked at again.
_layouts: dict[str, Layout] = {}
_said: set[str] = set()


def layout(cache_dir: str, policy: Policy | None = None) -> Layout:
    """The coordination layout of ``cache_dir`` (created on first use, with the cache if missing).

    Free once the sibling is in use; in the fallback, one ``lstat`` per call looks for a
    sibling another process made meanwhile (the rules: :mod:`sharedfs.shardcache`).
    """
    absolute = os.path.abspath(cache_dir)
    known = _layouts.get(absolute)
    if known is not None:
        return known
    real, sibling, inside, planted = _paths(absolute, policy)
    team = _team_cache(real, policy) if planted is None else None
    for _ in range(4):  # created (or found invisible and waited for), then looked at again
        cache_st = os.stat(real)
        if sibling_usable(sibling, real, cache_st):
            return _remember(absolute, Layout(real, sibling, False, team))
        if is_dir(os.path.join(inside, "stripes")):
            _say_inside(real, f"it exists there already (made by a process that could not use {sibling})")
            return Layout(real, inside, True, team)
        # Reached through a symlink someone else may have planted: nothing is created beside where it
        # points (that could be any directory of ours); the tree goes inside the cache, which the
        # framework fills through the same symlink anyway.
        refused = planted or sibling_refused(real, sibling, cache_st)
        if refused is None:
            try:
                create_tree(sibling, cache_st, team)
                continue  # look again: someone may have won the race with a tree we must not trust
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                refused = f"this process may not create {sibling} ({exc.strerror})"
        if create_tree(inside, cache_st, team):
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


def _drop_orphans() -> None:
    drop_orphans(list(_layouts.values()))


def _remember(absolute: str, lay: Layout) -> Layout:
    if not _layouts:
        atexit.register(_drop_orphans)
    hold(lay.root)
    _layouts[absolute] = lay
    return lay


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
        if st.st_uid == os.geteuid() and opened_at(fd, real):
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
        sibling = os.path.join(os.path.dirname(real), sibling_basename(name))
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
        fd = os.open(real, DIR_FLAGS)
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
        fd = stale.retry(lambda: os.open(real, DIR_FLAGS))
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Swapped(f"{real} is now {what_is(real)}, not the directory this process used as the cache") from None
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
    held = None if lay.inside else held_trees.get(lay.root)
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
    held = None if lay.inside else held_trees.get(lay.root)
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
                mirror_fd(part, tree.stat(), lay.team)  # the tree has the cache's group and mode already
            except BaseException:
                part.close()
                raise
            return part
    finally:
        if cache is not None:
            cache.close()
