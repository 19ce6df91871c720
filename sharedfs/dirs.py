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
import stat
import time
from pathlib import Path
from typing import Callable, Union

from .errors import UnsafeDirectoryError, WaitTimeout
from ._policy import Policy

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
    from . import runtime

    if timeout is None:
        timeout = runtime.policy().wait_timeout
    if callable(target):
        check, path = target, None
    else:
        path = os.path.abspath(os.fspath(target))
        check = lambda: _visible(path)  # noqa: E731
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
    from . import runtime

    ident = runtime.identity()
    where = f"node {ident.node_id}, rank {ident.rank} of {ident.world_size}"
    if path is None:
        return (f"waited {waited:.1f} s for {what} on {where} and it never became true. "
                "Raise SHAREDFS_WAIT_TIMEOUT if the producer is just slow.")
    fs = runtime.describe_filesystem(path)
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
        from . import dist, runtime

        fs = runtime.describe_filesystem(target)
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


def node_local_root(policy: Policy | None = None) -> str:
    """The node-local storage root: ``SHAREDFS_CACHE_ROOT``, ``$SLURM_TMPDIR``, ``$TMPDIR``, ``/tmp``."""
    if policy is None:
        from . import runtime

        policy = runtime.policy()
    for candidate in (policy.cache_root, os.environ.get("SLURM_TMPDIR"), os.environ.get("TMPDIR")):
        if candidate:
            return candidate
    return "/tmp"


def job_id() -> str:
    """The scope of job-scoped directories: the Slurm job, else the torchrun run, else this user session."""
    for name in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(name, "").strip()
        if value and "/" not in value:
            return f"job-{value}"
    return "nojob"


def node_local_dir(name: str, *, policy: Policy | None = None, create: bool = True) -> Path:
    """A per-user, per-job directory ``<root>/sharedfs-<uid>/<job>/<name>`` on node-local storage.

    Every level sharedfs creates is mode 0700.  An existing level that is a
    symlink, owned by another user, or writable by others is refused with
    :class:`sharedfs.UnsafeDirectoryError` (a predictable ``/tmp`` path lets
    another user plant cache content; failures.md section 5); so is a
    world-writable root without the sticky bit.
    """
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"node_local_dir name must be one path component, got {name!r}")
    root = node_local_root(policy)
    _check_root(root)
    path = Path(root, f"sharedfs-{os.getuid()}", job_id(), name)
    if create:
        from .cleanup import job_scope

        # Under the job's node-local lock, and counted as a user of the job's directory: the job's
        # last process on this node removes it at exit (sharedfs.cleanup).
        with job_scope(path.parent):
            for level in (path.parents[1], path.parent, path):
                _make_private(level)
    return path


def _check_root(root: str) -> None:
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise UnsafeDirectoryError(
            f"node-local root {root} does not exist; set SHAREDFS_CACHE_ROOT to a local directory"
        ) from None
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UnsafeDirectoryError(
            f"node-local root {root} is world-writable without the sticky bit, so another user could "
            f"replace sharedfs's directories; fix it with `chmod +t {root}` or set SHAREDFS_CACHE_ROOT"
        )


def _make_private(path: Path) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UnsafeDirectoryError(f"{path} vanished while being created; is another process deleting it?") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectoryError(
            f"{path} is a symlink (to {os.readlink(path)}); sharedfs will not follow it because another user "
            f"could point it anywhere. Remove it if you created it, else report it to your admins."
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectoryError(f"{path} exists and is not a directory; remove it or set SHAREDFS_CACHE_ROOT")
    if st.st_uid != os.getuid():
        raise UnsafeDirectoryError(
            f"{path} is owned by uid {st.st_uid}, not you (uid {os.getuid()}); someone created it first. "
            f"Set SHAREDFS_CACHE_ROOT to a directory of your own, or ask its owner to remove it."
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirectoryError(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"run `chmod 700 {path}` or remove it"
        )
