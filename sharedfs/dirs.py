"""Directories on shared filesystems: create without races, wait until visible, node-local roots.

Two field failures live here.  ``os.makedirs(p, exist_ok=True)`` raises
``FileExistsError`` on NFS/BeeGFS when another rank won the race: ``mkdir``
answers EEXIST, then ``isdir`` is asked of a stale attribute cache and says no
(lingua#49, prime-rl#2699, Automodel#3686).  And a rank that waits a fixed 10 s
for a directory another node made times out because attribute and
negative-lookup caches hide it for longer (OLMo#829).
"""

from __future__ import annotations

import errno
import os
import random
import time
from pathlib import Path
from typing import Callable, Union

from . import choices, dist, runtime
from ._policy import Policy
from .cleanup import enter_job
from .errors import WaitTimeout
from .nodelocal import job_id, node_local_root, open_private, open_root, root_of, user_dir_name

__all__ = ["job_id", "makedirs", "node_local_dir", "node_local_root", "wait_for"]

PathLike = Union[str, "os.PathLike[str]"]

#: Polling backs off from FIRST_POLL to MAX_POLL; jitter keeps many ranks out of step.
FIRST_POLL = 0.01
MAX_POLL = 1.0


def wait_for(target: PathLike | Callable[[], bool], timeout: float | None = None, *,
             what: str | None = None) -> None:
    """Wait until ``target`` (a path, or a predicate) exists / is true.

    Non-collective.  Backs off with jitter, never sleeps past the deadline, and
    before each look at a path re-lists its parent, which makes NFS revalidate
    the directory instead of answering from its negative-lookup cache.
    ``timeout`` defaults to ``SHAREDFS_WAIT_TIMEOUT``; on timeout
    :class:`sharedfs.WaitTimeout` says what was awaited, from where, on which
    filesystem, and what to change.
    """
    if timeout is None:
        timeout = runtime.policy().wait_timeout
    if callable(target):
        check, path = target, None
    else:
        path = os.path.abspath(os.fspath(target))
        check = lambda: _visible(path)
    start = time.monotonic()
    deadline = start + timeout
    delay = FIRST_POLL
    while not check():
        now = time.monotonic()
        if now >= deadline:
            raise WaitTimeout(_wait_message(path, what or getattr(target, "__name__", repr(target)), now - start))
        time.sleep(min(delay * random.uniform(0.5, 1.5), deadline - now))
        delay = min(delay * 2, MAX_POLL)


def _visible(path: str) -> bool:
    parent = os.path.dirname(path)
    try:
        # Reading the directory refreshes the client's view of it (close-to-open and
        # readdir revalidation on NFS, a fresh LOOKUP on Lustre); a bare stat may be
        # answered from a cached "does not exist".
        os.listdir(parent)
    except OSError:
        return False
    return os.path.lexists(path)


def _wait_message(path: str | None, what: str, waited: float) -> str:
    ident = runtime.identity()
    where = f"node {ident.node_id}, rank {ident.rank} of {ident.world_size}"
    if path is None:
        return (f"waited {waited:.1f} s for {what} on {where} and it never became true. "
                "Raise SHAREDFS_WAIT_TIMEOUT if the producer is just slow.")
    fs = choices.filesystem(path)
    return (
        f"waited {waited:.1f} s for {path} to appear on {where}; it is on {fs.kind} "
        f"({fs.mount.fstype} {fs.mount.mount_point}, options {fs.mount.raw_options or 'none'}). "
        "Either the process that should create it failed or is still running (check its log), or "
        "this filesystem shows new entries to other nodes late: raise SHAREDFS_WAIT_TIMEOUT "
        "(NFS: lower actimeo/lookupcache on the mount; see `sharedfs doctor " + os.path.dirname(path) + "`)."
    )


def makedirs(path: PathLike, mode: int = 0o777, *, timeout: float | None = None, barrier: bool = False) -> Path:
    """Create ``path`` and its parents; never raise FileExistsError for an existing directory.

    Non-collective by default: every caller creates what is missing (EEXIST is
    success), then waits until it can see the directory itself.  With
    ``barrier=True`` it is a *collective*: every rank must call it; one process
    per filesystem domain creates (the global leader for shared paths, each node's
    leader for node-local ones), all ranks pass a barrier, then each verifies.
    """
    target = os.path.abspath(os.fspath(path))
    if barrier:
        fs = choices.filesystem(target)
        ident = runtime.identity()
        creator = ident.is_leader if fs.shared else ident.is_node_leader
        if creator:
            _create_tree(target, mode, timeout)
        dist.barrier()
    else:
        _create_tree(target, mode, timeout)
    wait_for(target, timeout, what=f"directory {target}")
    if not os.path.isdir(target):
        raise FileExistsError(errno.EEXIST, "exists and is not a directory", target)
    return Path(target)


def _create_tree(target: str, mode: int, timeout: float | None) -> None:
    missing = []
    head = target
    while head and not os.path.isdir(head):
        missing.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            pass  # someone else made it (or a file is there: reported after the wait)
        except FileNotFoundError:
            # The parent was made by another node and is not visible here yet.
            wait_for(os.path.dirname(directory), timeout, what=f"parent of {directory}")
            try:
                os.mkdir(directory, mode)
            except FileExistsError:
                pass


def node_local_dir(name: str, *, policy: Policy | None = None, create: bool = True) -> Path:
    """A per-user, per-job directory ``<root>/sharedfs-<uid>/<job>/<name>`` on node-local storage.

    Every level sharedfs creates is mode 0700.  An existing level that is a
    symlink, owned by another user, or writable by others is refused with
    :class:`sharedfs.UnsafeDirectoryError` (a predictable ``/tmp`` path lets
    another user plant cache content); so is a root that
    is missing, not a directory, writable by others without the sticky bit, or
    owned by another user (the message names the variable the root came from).
    Each level is opened by descriptor relative to the one above and checked on
    that descriptor (:mod:`sharedfs.nodelocal`).
    """
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"node_local_dir name must be one path component, got {name!r}")
    if policy is None:
        policy = runtime.policy()
    root = root_of(policy)
    job = job_id()
    user = user_dir_name(os.getuid())
    path = Path(root.path, user, job, name)
    if not create:
        return path
    fds = [open_root(root)]
    try:
        fds.append(open_private(fds[-1], user, shown=str(path.parents[1])))
        if job.startswith("job-"):
            # Under the job's node-local lock, and counted as a user of the job's directory until this
            # process exits (sharedfs.cleanup says who removes it, and when).
            fds.append(enter_job(root.path, fds[-1], job, policy))
        else:
            fds.append(open_private(fds[-1], job, shown=str(path.parent)))
        fds.append(open_private(fds[-1], name, shown=str(path)))
    finally:
        for fd in fds:
            os.close(fd)
    return path
