"""Job-scoped cleanup of node-local directories (``<root>/sharedfs-<uid>/job-<ID>/``).

Node-local caches made for a job (:func:`sharedfs.node_local_dir`) would fill
the node's disk job after job.  Two ways remove them, and both remove exactly
one job's directory of one user, never anything else:

* **at exit, by the last process of the job on the node.**  Each process that
  creates or uses the job's directory leaves a marker
  ``<job dir>/.sharedfs-live/<node>-<pid>`` (holding its process start time,
  so a reused pid is not mistaken for it).  At exit a process removes its own
  marker and, when no marker names a live process, removes the job directory.
  Markers and removal happen under a node-local ``flock`` on
  ``<root>/sharedfs-<uid>/job-<ID>.lock`` so a process that is just creating
  the directory is never pulled out from under.  Markers of another node
  (a "node-local" root that is in fact shared) always count as alive.
  Trade-off: a job that runs several ``srun`` steps in sequence loses its
  node-local cache between steps on a node where no sharedfs process
  survives the step; the cache is rebuilt, never wrong.
* **by the epilog**: ``sharedfs cleanup --job $SLURM_JOB_ID --uid $SLURM_JOB_UID``
  (Slurm runs epilogs as root after killing the job's processes).  A process
  killed by the job's end (SIGKILL runs no ``atexit``) leaves its directory to it.

Jobs without a scope (``nojob``: no Slurm job, no torchrun run) are never
removed automatically: that cache belongs to the user's session.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import UnsafeDirectoryError

__all__ = ["JobCleanupError", "cleanup_job", "job_scope", "live_users"]

LIVE_DIR = ".sharedfs-live"
_registered: set[str] = set()


class JobCleanupError(RuntimeError):
    """A job's directory could not be removed safely; the message says why and what to do."""


def _node() -> str:
    from . import runtime

    try:
        return runtime.policy().node_id
    except Exception:  # noqa: BLE001 - a broken setting must not break exit or cleanup
        import socket

        return socket.gethostname()


def _lock_path(job_dir: Path) -> Path:
    return job_dir.parent / f"{job_dir.name}.lock"


@contextlib.contextmanager
def _locked(job_dir: Path) -> Iterator[None]:
    """A node-local flock serialising creation, registration and removal of ``job_dir``."""
    fd = os.open(_lock_path(job_dir), os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


@contextlib.contextmanager
def job_scope(job_dir: Path) -> Iterator[None]:
    """Create ``job_dir`` (and what the body creates) under the job's lock, then count this process as a user.

    Used by :func:`sharedfs.node_local_dir`.  The caller checks and creates the
    user level (``sharedfs-<uid>``) inside the body; this only needs its parent
    to be creatable.  Outside a job scope (``nojob``) it does nothing.
    """
    if not job_dir.name.startswith("job-"):
        yield
        return
    from .dirs import _make_private

    _make_private(job_dir.parent)  # the lock file lives in the checked, private user directory
    with _locked(job_dir):
        yield
        _add_marker(job_dir)


def _add_marker(job_dir: Path) -> None:
    from .locks import process_start_time

    live = job_dir / LIVE_DIR
    try:
        os.mkdir(live, 0o700)
    except FileExistsError:
        pass
    marker = live / f"{_node()}-{os.getpid()}"
    marker.write_text(process_start_time(os.getpid()) or "")
    key = str(job_dir)
    if key not in _registered:
        _registered.add(key)
        atexit.register(_release_at_exit, job_dir, os.getpid(), marker)


def _release_at_exit(job_dir: Path, pid: int, marker: Path) -> None:
    if os.getpid() != pid:
        return  # a forked child that exits through Python's shutdown is not the registered process
    try:
        with _locked(job_dir):
            with contextlib.suppress(FileNotFoundError):
                marker.unlink()
            if not live_users(job_dir):
                _remove_tree(job_dir)
    except OSError:
        pass  # at exit nothing may raise; the epilog (`sharedfs cleanup`) catches what is left


def live_users(job_dir: Path) -> list[str]:
    """Markers in ``job_dir`` that name a live process (or a process on another node, which we cannot check)."""
    from .locks import process_start_time

    node = _node()
    alive = []
    try:
        names = os.listdir(job_dir / LIVE_DIR)
    except FileNotFoundError:
        return []
    for name in names:
        owner, _, pid_text = name.rpartition("-")
        if owner != node or not pid_text.isdigit():
            alive.append(name)
            continue
        pid = int(pid_text)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        try:
            recorded = (job_dir / LIVE_DIR / name).read_text().strip()
        except OSError:
            recorded = ""
        started = process_start_time(pid)
        if recorded and started and recorded != started:
            continue  # the pid now belongs to another process
        alive.append(name)
    return alive


def _remove_tree(path: Path) -> None:
    # rmtree works on directory fds on Linux (shutil.rmtree.avoids_symlink_attacks): a symlink
    # planted inside is removed, never followed.
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        os.unlink(path)
        return
    shutil.rmtree(path)


def _normalise_job(job: str) -> str:
    job = str(job).strip()
    name = job if job.startswith("job-") else f"job-{job}"
    body = name[len("job-"):]
    if not body or "/" in body or body in (".", "..") or "\0" in body:
        raise JobCleanupError(f"invalid job id {job!r}: give the scheduler's job id, e.g. --job 12345")
    return name


def cleanup_job(job: str, *, uid: int | None = None, root: str | None = None, force: bool = False) -> dict[str, Any]:
    """Remove ``<root>/sharedfs-<uid>/job-<job>`` on this node; returns what was done.

    ``uid`` defaults to ``$SLURM_JOB_UID`` (set in Slurm epilogs) else the
    caller's; ``root`` to the node-local root in force
    (:func:`sharedfs.dirs.node_local_root`).  A user directory that is a
    symlink or owned by someone else is refused (:class:`JobCleanupError`).
    While a process of the job on this node is still alive nothing is removed
    unless ``force``.
    """
    from .dirs import node_local_root

    name = _normalise_job(job)
    if uid is None:
        env_uid = os.environ.get("SLURM_JOB_UID", "").strip()
        uid = int(env_uid) if env_uid.isdigit() else os.getuid()
    root = root or node_local_root()
    user_dir = Path(root, f"sharedfs-{uid}")
    target = user_dir / name
    report: dict[str, Any] = {"job": name, "uid": uid, "path": str(target), "removed": [], "live": [],
                              "skipped": None}
    try:
        st = os.lstat(user_dir)
    except FileNotFoundError:
        report["skipped"] = f"{user_dir} does not exist: nothing to clean"
        return report
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise JobCleanupError(f"{user_dir} is not a plain directory (a symlink?); refusing to clean under it. "
                              "Remove it by hand after checking where it points.")
    if st.st_uid != uid:
        raise JobCleanupError(f"{user_dir} is owned by uid {st.st_uid}, not uid {uid}: it is not that user's "
                              "sharedfs directory; refusing to touch it.")
    if not os.path.lexists(target):
        report["skipped"] = f"{target} does not exist: nothing to clean"
    else:
        try:
            with _locked(target):
                live = live_users(target)
                report["live"] = live
                if live and not force:
                    report["skipped"] = (f"{len(live)} process(es) of the job still use {target} on this node "
                                         f"({', '.join(sorted(live))}); pass --force to remove it anyway")
                    return report
                _remove_tree(target)
                report["removed"].append(str(target))
        except UnsafeDirectoryError as exc:
            raise JobCleanupError(str(exc)) from None
    # The job is over (the epilog runs after it) or nothing is there: its lock file can go too.
    lock = _lock_path(target)
    try:
        os.unlink(lock)
        report["removed"].append(str(lock))
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
    return report
