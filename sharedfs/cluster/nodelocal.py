"""Node-local directories, the low layer: the root, the job scope, and private directories opened by descriptor.

Each level is opened ``O_NOFOLLOW`` from the one above and checked on that descriptor: ``/tmp`` is everyone's.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import NamedTuple

from sharedfs.errors import UnsafeDirectoryError
from sharedfs.machinery import runtime
from sharedfs.model.policy import Policy

__all__ = ["DIR_FLAGS", "Root", "at", "job_id", "made_for_uid", "node_local_root", "open_private", "open_root",
           "root_of", "user_dir_name"]

#: Opening a directory someone else may have replaced: never follow a symlink, never block (a FIFO answers
#: ENOTDIR at once), never leak into a child program.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: What to tell users whose node-local root is wrong.
_FIX_ROOT = "point SHAREDFS_CACHE_ROOT at a local directory of your own (or $SLURM_TMPDIR, /tmp)"


class Root(NamedTuple):
    """The node-local root and where it came from (a variable, a TOML key, an argument, or the default)."""

    path: str
    origin: str


def root_of(policy: Policy | None = None) -> Root:
    """The node-local root: ``SHAREDFS_CACHE_ROOT`` (or its TOML key), ``$SLURM_TMPDIR``, ``$TMPDIR``, ``/tmp``."""
    if policy is None:
        policy = runtime.policy()
    if policy.cache_root:
        source = policy.source("cache_root")
        return Root(policy.cache_root, "SHAREDFS_CACHE_ROOT" if source == "default" else source)
    for variable in ("SLURM_TMPDIR", "TMPDIR"):
        value = os.environ.get(variable, "").strip()
        if value:
            return Root(value, variable)
    return Root("/tmp", "the default node-local root")


def node_local_root(policy: Policy | None = None) -> str:
    """The node-local storage root: ``SHAREDFS_CACHE_ROOT``, ``$SLURM_TMPDIR``, ``$TMPDIR``, ``/tmp``."""
    return root_of(policy).path


def job_id() -> str:
    """The scope of job-scoped directories: the Slurm job, else the torchrun run, else this user session."""
    for name in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(name, "").strip()
        if value and "/" not in value and "\0" not in value and value not in (".", "..") and len(value) <= 128:
            return f"job-{value}"
    return "nojob"


def user_dir_name(uid: int) -> str:
    return f"sharedfs-{uid}"


def made_for_uid(path: str) -> int | None:
    """The uid whose ``<root>/sharedfs-<uid>/<job>/<name>`` ``path`` is, or None for a path of another layout.

    A process that runs as another user (``su``, ``setpriv``, ``subprocess.run(user=...)``) inherits
    the variables its parent exported for its own node-local directories, which are 0700: the child
    must not take them for the user's own setting (:mod:`sharedfs.startup.placedcaches`).
    """
    parts = os.path.normpath(path).split(os.sep)
    found = re.fullmatch(r"sharedfs-([0-9]+)", parts[-3]) if len(parts) >= 4 and os.path.isabs(path) else None
    return int(found.group(1)) if found else None


def at(fd: int, name: str) -> str:
    """A path naming ``name`` inside the directory held open as ``fd``, for APIs that take only paths.

    ``/proc/self/fd/N`` resolves to exactly the directory the descriptor holds, wherever it has been
    moved, so the path is as anchored as ``dir_fd=`` would be; ``O_NOFOLLOW`` still applies to ``name``.
    """
    return f"/proc/self/fd/{fd}/{name}"


def open_root(root: Root) -> int:
    """Open the node-local root and check that other users cannot replace what sharedfs makes in it.

    The root was named by the user or the site, so a symlink *to* it is followed.  Refused with
    :class:`~sharedfs.UnsafeDirectoryError` naming where the root came from: a missing path, a
    non-directory, a directory writable by others without the sticky bit (they could rename our
    directory away and put theirs in its place), or one owned by a user other than us and root.
    """
    path, origin = root
    if not os.path.isabs(path):  # $TMPDIR=tmp would mean a different directory in every working directory
        raise UnsafeDirectoryError(f"{origin}={path}: the node-local root must be an absolute path; {_FIX_ROOT}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UnsafeDirectoryError(
            f"{origin}={path}: the node-local root does not exist on this node; create it on every node "
            f"or {_FIX_ROOT}") from None
    except NotADirectoryError:
        raise UnsafeDirectoryError(
            f"{origin}={path}: the node-local root is not a directory ({_describe(path)}); {_FIX_ROOT}") from None
    except OSError as exc:
        raise UnsafeDirectoryError(
            f"{origin}={path}: the node-local root cannot be opened ({exc.strerror}); {_FIX_ROOT}") from None
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if mode & (stat.S_IWOTH | stat.S_IWGRP) and not mode & stat.S_ISVTX:
            who = "every user" if mode & stat.S_IWOTH else f"every member of group {st.st_gid}"
            raise UnsafeDirectoryError(
                f"{origin}={path}: the node-local root is writable by {who} without the sticky bit (mode {mode:o}), "
                f"so another user could replace sharedfs's directories in it; fix it with `chmod +t {path}` "
                f"or {_FIX_ROOT}")
        if st.st_uid not in (0, os.geteuid()):
            raise UnsafeDirectoryError(
                f"{origin}={path}: the node-local root is owned by uid {st.st_uid} (neither you nor root), who can "
                f"replace sharedfs's directories in it; {_FIX_ROOT}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(parent_fd: int, name: str, *, shown: str, uid: int | None = None, create: bool = True) -> int:
    """Open (creating it mode 0700 if ``create``) the directory ``name`` in ``parent_fd``, checked private.

    Returns its descriptor.  Refused with :class:`~sharedfs.UnsafeDirectoryError`: a symlink (never
    followed), a non-directory, a directory owned by anyone but ``uid`` (default: us), or one that
    group or others may write.  ``shown`` is the path quoted in messages.  Raises
    :class:`FileNotFoundError` when it does not exist and ``create`` is false.
    """
    expected = os.getuid() if uid is None else uid
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass  # ours from before, or planted: the checks below tell
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except NotADirectoryError:  # O_NOFOLLOW|O_DIRECTORY answers ENOTDIR for a symlink too
        raise UnsafeDirectoryError(_not_a_directory(parent_fd, name, shown)) from None
    except FileNotFoundError:
        if not create:
            raise
        raise UnsafeDirectoryError(f"{shown} vanished while being created; is another process deleting it?") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != expected:
            whose = "not you" if uid is None else "not its user"
            raise UnsafeDirectoryError(
                f"{shown} is owned by uid {st.st_uid}, {whose} (uid {expected}); someone created it first. "
                f"Set SHAREDFS_CACHE_ROOT to a directory of your own, or ask its owner to remove it.")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafeDirectoryError(
                f"{shown} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                f"run `chmod 700 {shown}` or remove it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_a_directory(parent_fd: int, name: str, shown: str) -> str:
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return f"{shown} changed while being opened; is another process replacing it?"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(name, dir_fd=parent_fd)
        except OSError:
            target = "?"
        return (f"{shown} is a symlink (to {target}); sharedfs will not follow it because another user could point "
                "it anywhere. Remove it if you created it, else report it to your admins.")
    return f"{shown} exists and is not a directory; remove it or set SHAREDFS_CACHE_ROOT"


def _describe(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    if stat.S_ISREG(st.st_mode):
        return "a regular file"
    if stat.S_ISFIFO(st.st_mode):
        return "a FIFO"
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return "a device"
    return f"mode {st.st_mode:o}"
