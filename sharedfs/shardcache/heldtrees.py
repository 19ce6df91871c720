"""The coordination trees this process uses, held open from first use; at exit, the trees of caches gone are removed."""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterable

from sharedfs.fs import stale
from sharedfs.fs.safefile import NOFOLLOW
from sharedfs.shardcache.treenames import KEY_PATTERN, SUBDIRS, Layout

#: The sibling trees this process uses, held open from first use: path -> (descriptor, st_dev, st_ino).
held_trees: dict[str, tuple[int, int, int]] = {}
#: Opening a directory a group member may have swapped: never a symlink, never blocking, never inherited by exec.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW


def hold(root: str) -> None:
    """Keep a descriptor of the coordination tree this process uses: at exit, only that very tree may go."""
    try:
        fd = os.open(root, DIR_FLAGS)
    except OSError:
        return  # gone again already: nothing of ours will be removed at exit
    st = os.fstat(fd)
    old = held_trees.pop(root, None)
    if old is not None:
        os.close(old[0])  # the tree was made again (after forget): the new one is what this process uses
    held_trees[root] = (fd, st.st_dev, st.st_ino)


def drop_orphans(layouts: Iterable[Layout]) -> None:
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
    for lay in layouts:
        held = held_trees.get(lay.root)
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
        left = empty(fd, "top", dev)
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


#: How deep :func:`empty` descends (a download directory holds what a framework wrote: a file, seldom a tree).
EMPTY_DEPTH = 16


def empty(dir_fd: int, rules: str, dev: int, depth: int = 0) -> list[str]:
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
            sub = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
            try:
                if (os.fstat(sub).st_ino, os.fstat(sub).st_dev) != (st.st_ino, st.st_dev):
                    left.append(name)  # swapped between the look and the open
                    continue
                left.extend(f"{name}/{inner}" for inner in empty(sub, kind, dev, depth + 1))
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

