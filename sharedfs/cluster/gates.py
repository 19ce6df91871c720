"""Node gates: while many ranks of one node wait for the same thing, one of them asks the shared filesystem.

An economy, never a safety mechanism: without a safe gate directory a node simply polls ungated.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sharedfs.cluster.nodelocal import open_private, open_root, root_of, user_dir_name
from sharedfs.errors import UnsafeDirectoryError
from sharedfs.fs import oslocks
from sharedfs.fs.safefile import NOFOLLOW
from sharedfs.machinery import choices

log = logging.getLogger("sharedfs")

_dirs: dict[str, int] = {}
_dirs_lock = threading.Lock()
_said: set[str] = set()
#: Descriptors holding a gate in this process: a forked child drops its copies (see _forget_in_child).
_held: set[int] = set()


def _gate_dir() -> int | None:
    """A descriptor of this user's private gate directory on node-local storage, or ``None``."""
    root = root_of()
    key = f"{os.getuid()}:{root.path}"
    with _dirs_lock:
        fd = _dirs.get(key)
        if fd is not None:
            return fd
        if _on_shared_storage(root.path):
            _say_once(key, f"the node-local root {root.path} ({root.origin}) is on a shared filesystem")
            return None
        try:
            root_fd = open_root(root)
            try:
                user_fd = open_private(root_fd, user_dir_name(os.getuid()), shown=f"{root.path}/sharedfs-{os.getuid()}")
            finally:
                os.close(root_fd)
            try:
                fd = open_private(user_fd, "gates", shown=f"{root.path}/sharedfs-{os.getuid()}/gates")
            finally:
                os.close(user_fd)
        except (UnsafeDirectoryError, OSError) as exc:
            _say_once(key, str(exc))
            return None
        _dirs[key] = fd
        return fd


def _on_shared_storage(path: str) -> bool:
    try:
        return choices.filesystem(path).shared
    except OSError:
        return False  # opening it will tell


def _say_once(key: str, why: str) -> None:
    if key not in _said:
        _said.add(key)
        log.info("no node gate directory (%s): waiting ranks of this node each poll the shared filesystem", why)


def _open(key: str) -> int | None:
    """A descriptor of ``key``'s gate file (not locked yet); ``None`` when gates are unavailable here."""
    directory = _gate_dir()
    if directory is None:
        return None
    name = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:40]
    try:
        return os.open(name, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600, dir_fd=directory)
    except OSError:
        return None


def try_enter(key: str) -> int | None:
    """Try to become this node's representative for ``key``, without waiting.

    A descriptor holding the gate (give it back with :func:`leave`); ``None`` while another
    process of this node holds it; ``-1`` when gates are unavailable here, which makes every
    caller its own representative (and :func:`leave` of it a no-op).
    """
    fd = _open(key)
    if fd is None:
        return -1
    state, _ = oslocks.try_lock(fd, "flock")
    if state == "held":
        _held.add(fd)
        return fd
    os.close(fd)
    return -1 if state == "failed" else None


@contextmanager
def turn(key: str) -> Iterator[None]:
    """Hold ``key``'s gate for the block, waiting (node-locally, without limit) while another process has it.

    For work that one process per node should do first, the others after it (who then usually
    find it done); a process that dies in its turn hands it on (the kernel drops its flock).
    """
    fd = _open(key)
    if fd is not None:
        try:
            oslocks.lock(fd, "flock", blocking=True)
        except OSError:
            os.close(fd)  # flock refused here: everyone takes their turn at once, as without gates
            fd = None
    if fd is not None:
        _held.add(fd)
    try:
        yield
    finally:
        if fd is not None:
            leave(fd)


def leave(fd: int) -> None:
    """Give the gate up (closing the descriptor drops its flock)."""
    if fd in _held:  # not a gate of this process (-1, or one a fork dropped): its number may be reused
        _held.discard(fd)
        os.close(fd)


def _forget_in_child() -> None:
    """A forked child represents nobody: it drops its copies of the parent's gates (the parent keeps them)."""
    for fd in list(_held):
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)
