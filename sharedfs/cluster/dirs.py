"""Directories on shared filesystems: create without races, wait until visible, node-local roots.

Waiting costs the shared filesystem per node, not per rank: one waiter per node looks (:mod:`.gates`).
"""

from __future__ import annotations

import errno
import os
import random
import time
from pathlib import Path
from typing import Callable, Union

from sharedfs.cluster import dist, gates
from sharedfs.cluster.cleanup import enter_job
from sharedfs.cluster.nodelocal import job_id, node_local_root, open_private, open_root, root_of, user_dir_name
from sharedfs.errors import WaitTimeout
from sharedfs.machinery import choices, runtime
from sharedfs.model.policy import Policy

__all__ = ["job_id", "makedirs", "node_local_dir", "node_local_root", "wait_for"]

PathLike = Union[str, "os.PathLike[str]"]

#: A representative's looks back off from FIRST_POLL, doubling up to the ``poll_interval`` setting, with
#: +-JITTER: a path that appears is seen within (1 + JITTER) poll intervals, and waiters released by one
#: event do not hit the metadata server in step.
FIRST_POLL = 0.01
JITTER = 0.25
#: How often a waiter that is not its node's representative tries the gate: node-local, free for the
#: shared filesystem; it bounds how long the node's other waiters take to notice, after the
#: representative saw the path, roughly GATE_POLL times the harmonic number of their count.
GATE_POLL = 0.05


def wait_for(target: PathLike | Callable[[], bool], timeout: float | None = None, *,
             what: str | None = None) -> None:
    """Wait until ``target`` (a path, or a predicate) exists / is true.

    Non-collective.  Backs off with jitter up to ``SHAREDFS_POLL_INTERVAL``, never
    sleeps past the deadline, and before each look at a path re-lists its parent,
    which makes NFS revalidate the directory instead of answering from its
    negative-lookup cache.  On a shared filesystem one waiter per node looks (see
    docs/scale.md).  ``timeout`` defaults to ``SHAREDFS_WAIT_TIMEOUT``; on timeout
    :class:`sharedfs.WaitTimeout` says what was awaited, from where, on which
    filesystem, and what to change.
    """
    policy = runtime.policy()
    if timeout is None:
        timeout = policy.wait_timeout
    if callable(target):
        check, path, key = target, None, None
    else:
        path = os.path.abspath(os.fspath(target))
        check, key = (lambda: _visible(path)), _gate_key(path)
    start = time.monotonic()
    if check():
        return
    waiter = _Waiter(check, key, policy.poll_interval, start + timeout)
    try:
        if waiter.wait():
            return
    finally:
        waiter.leave()
    raise WaitTimeout(_wait_message(path, str(what or getattr(target, "__name__", repr(target))),
                                    time.monotonic() - start))


def _gate_key(path: str) -> str | None:
    """The node gate of waiting for ``path``; ``None`` (everyone looks) where looking costs no shared server."""
    try:
        shared = choices.filesystem(path).shared
    except OSError:
        shared = True  # cannot tell: economise, the gate never changes an answer
    return f"wait_for:{path}" if shared else None


class _Waiter:
    """One wait: this node's representative looks, backing off; the others wait on the node gate.

    Gates are an economy, never a reason to fail: every waiter looks once itself at
    the deadline before giving up (a representative may be stopped, or have left).
    """

    def __init__(self, check: Callable[[], bool], key: str | None, ceiling: float, deadline: float) -> None:
        self.check, self.key, self.ceiling, self.deadline = check, key, ceiling, deadline
        self.gate: int | None = -1 if key is None else None  # -1: look for ourselves; fd: representative
        self.queued = False  # found the gate taken at least once
        self.delay = FIRST_POLL
        self.due = time.monotonic() + self._pause()

    def wait(self) -> bool:
        """True once the target is there; False at the deadline."""
        while True:
            now = time.monotonic()
            if now >= self.deadline:
                return self.check()
            if self.gate is None:
                self._try_gate(now)
            if self.gate is None:
                wake = now + GATE_POLL * random.uniform(1 - JITTER, 1 + JITTER)
            elif now >= self.due:
                if self.check():
                    return True
                wake = self.due = time.monotonic() + self._pause()
            else:
                wake = self.due
            time.sleep(max(0.0, min(wake, self.deadline) - time.monotonic()))

    def _try_gate(self, now: float) -> None:
        assert self.key is not None
        self.gate = gates.try_enter(self.key)
        if self.gate is None:
            self.queued = True
        elif self.queued:
            # A successor looks at once: the representative left because it saw the target (then this
            # look succeeds: each of the node's waiters looks once more, in turn) or its own wait ended
            # (then the target is late: carry on at the poll interval, without a fresh burst of looks).
            self.due, self.delay = now, self.ceiling

    def _pause(self) -> float:
        pause = self.delay * random.uniform(1 - JITTER, 1 + JITTER)
        self.delay = min(self.delay * 2, self.ceiling)
        return pause

    def leave(self) -> None:
        if self.gate is not None:
            gates.leave(self.gate)
            self.gate = None


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
        "(NFS: lower actimeo/lookupcache on the mount; see `sharedfs doctor " + _existing_parent(path) + "`)."
    )


def _existing_parent(path: str) -> str:
    """The nearest directory above ``path`` that this node sees: what ``sharedfs doctor`` can probe.

    The path waited for is missing by definition, and so may be its parent (a checkpoint's
    ``step-100/model``): a doctor command naming a missing directory only fails.
    """
    current = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(current) and current != os.path.dirname(current):
        current = os.path.dirname(current)
    return current


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
    that descriptor (:mod:`sharedfs.cluster.nodelocal`).

    This is the one check of every node-local path sharedfs hands out: a shim's cache, the
    placed-cache table's exports and ``sharedfs env`` all get their path from here with
    ``create=True``.  ``create=False`` (``sharedfs status``) makes nothing and checks the levels
    that exist: a missing one has nothing in it yet, anyone else's would be refused.
    """
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"node_local_dir name must be one path component, got {name!r}")
    if policy is None:
        policy = runtime.policy()
    root = root_of(policy)
    job = job_id()
    user = user_dir_name(os.getuid())
    path = Path(root.path, user, job, name)
    fds = [open_root(root)]
    try:
        fds.append(open_private(fds[-1], user, shown=str(path.parents[1]), create=create))
        if create and job.startswith("job-"):
            # Under the job's node-local lock, and counted as a user of the job's directory until this
            # process exits (sharedfs.cluster.cleanup says who removes it, and when).
            fds.append(enter_job(root.path, fds[-1], job, policy))
        else:
            fds.append(open_private(fds[-1], job, shown=str(path.parent), create=create))
        fds.append(open_private(fds[-1], name, shown=str(path), create=create))
    except FileNotFoundError:
        if create:
            raise
    finally:
        for fd in fds:
            os.close(fd)
    return path
