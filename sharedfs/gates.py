"""Node gates: while many ranks of one node wait for the same thing, one of them asks the shared filesystem.

512 ranks polling one marker on Lustre are 512 clients hammering one metadata
server; 64 nodes x 8 ranks should cost what 64 clients cost.  A gate is a
``flock`` on a small file in this user's private node-local directory
(``<node-local root>/sharedfs-<uid>/gates/``), which is exact within a node:
the process that holds a thing's gate is the node's one representative for it
(it polls the shared filesystem, and keeps the gate while it holds the lock it
waited for); the other ranks of the node wait on the gate, which costs the
shared filesystem nothing.  The shared filesystem's load while waiting then
grows with the number of nodes, not ranks.

Gates are an economy, never a safety mechanism: a node whose gate directory
cannot be had (an unsafe node-local root) simply polls ungated, and says so
once.  Gate files are never unlinked (an unlinked lock file splits its waiters
across inodes: webdataset#386); there is one per contended thing, and the
node-local root is per job under Slurm.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading

from . import oslocks
from .errors import UnsafeDirectoryError
from .nodelocal import open_private, open_root, root_of, user_dir_name
from .safefile import NOFOLLOW

log = logging.getLogger("sharedfs")

_dirs: dict[str, int] = {}
_dirs_lock = threading.Lock()
_said: set[str] = set()


def _gate_dir() -> int | None:
    """A descriptor of this user's private gate directory on node-local storage, or ``None``."""
    root = root_of()
    key = f"{os.getuid()}:{root.path}"
    with _dirs_lock:
        fd = _dirs.get(key)
        if fd is not None:
            return fd
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
            if key not in _said:
                _said.add(key)
                log.info("no node gate directory (%s): waiting ranks of this node each poll the shared filesystem", exc)
            return None
        _dirs[key] = fd
        return fd


def try_enter(key: str) -> int | None:
    """Try to become this node's representative for ``key``, without waiting.

    A descriptor holding the gate (give it back with :func:`leave`); ``None`` while another
    process of this node holds it; ``-1`` when gates are unavailable here, which makes every
    caller its own representative (and :func:`leave` of it a no-op).
    """
    directory = _gate_dir()
    if directory is None:
        return -1
    name = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:40]
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600, dir_fd=directory)
    except OSError:
        return -1
    state, _ = oslocks.try_lock(fd, "flock")
    if state == "held":
        return fd
    os.close(fd)
    return -1 if state == "failed" else None


def leave(fd: int) -> None:
    """Give the gate up (closing the descriptor drops its flock)."""
    if fd >= 0:
        os.close(fd)
