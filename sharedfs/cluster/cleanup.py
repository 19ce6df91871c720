"""Job-scoped cleanup of node-local directories (``<root>/sharedfs-<uid>/job-<ID>/``), when the job is over.

Root's epilog walks by descriptor as the user's uid, so at worst it removes what she could remove herself.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pwd
import select
import signal
import stat
import time
from pathlib import Path
from typing import Any

from sharedfs.cluster.nodelocal import DIR_FLAGS, Root, at, open_private, open_root, root_of, user_dir_name
from sharedfs.errors import UnsafeDirectoryError, WaitTimeout
from sharedfs.fs.oslocks import lock_by
from sharedfs.fs.safefile import create_exclusive, read_untrusted, write_all
from sharedfs.machinery import runtime
from sharedfs.model.policy import Policy
from sharedfs.model.records import HolderRecord

__all__ = ["JobCleanupError", "cleanup_job", "enter_job", "live_users"]

LIVE_DIR = ".sharedfs-live"
#: Directories deeper than this are left in place (and reported): each level holds one descriptor.
MAX_DEPTH = 256
#: How long cleanup waits for the job's lock (held by a process of the job that is creating or leaving).
LOCK_WAIT = 10.0
#: How long root waits for the child that cleans as the user before killing it (a hung filesystem).
CHILD_TIMEOUT = 300.0
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: (root, job) this process has registered in: one marker and one exit handler each.  A forked child
#: inherits the set but not the registration (its exit handler checks the pid).
_registered: set[tuple[str, str]] = set()


class JobCleanupError(RuntimeError):
    """A job's directory could not be removed safely; the message says why and what to do."""


# -- lock and markers -------------------------------------------------------------------------------


def _open_lock(user_fd: int, job: str, shown: str) -> int:
    """The job's lock file in the (checked) user directory, created by whoever runs this: never root for a user."""
    fd = os.open(f"{job}.lock", _LOCK_FLAGS, 0o600, dir_fd=user_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise UnsafeDirectoryError(f"{shown}/{job}.lock is not a regular file of uid {os.geteuid()}; remove it")
    return fd


def _flock(fd: int, timeout: float, shown: str) -> None:
    """``flock`` with a deadline: root must never block forever on a lock a user process can hold."""
    if not lock_by(fd, time.monotonic() + timeout):
        raise JobCleanupError(f"{shown} stayed locked for {timeout:g} s by a process of the job "
                              f"({shown}.lock); try again when it has exited")


def _policy_or_none() -> Policy | None:
    try:
        return runtime.policy()
    except Exception:  # noqa: BLE001 - a broken setting must not break exit or cleanup: liveness "cannot tell"
        return None


def enter_job(root: str, user_fd: int, job: str, policy: Policy) -> int:
    """Open (creating) ``job`` in the user directory ``user_fd`` under the job's lock; register this process.

    Used by :func:`sharedfs.node_local_dir`; returns the job directory's descriptor.  The
    marker is in place before the lock is released, so a process leaving at the same moment
    sees this one as alive and does not remove the directory.
    """
    shown = f"{root}/{user_dir_name(os.getuid())}"
    lock_fd = _open_lock(user_fd, job, shown)
    try:
        try:
            _flock(lock_fd, max(policy.wait_timeout, LOCK_WAIT), f"{shown}/{job}")
        except JobCleanupError as exc:
            raise WaitTimeout(f"waited for the lock of the job's node-local directory: {exc}") from None
        job_fd = open_private(user_fd, job, shown=f"{shown}/{job}")
        try:
            if (root, job) not in _registered:
                _add_marker(job_fd, f"{shown}/{job}", policy)
                _registered.add((root, job))
                atexit.register(_leave_at_exit, root, os.getpid(), job, _marker_name(policy))
        except BaseException:
            os.close(job_fd)
            raise
        return job_fd
    finally:
        os.close(lock_fd)  # closing drops the flock


def _marker_name(policy: Policy) -> str:
    return f"{policy.node_id}-{os.getpid()}"


def _add_marker(job_fd: int, shown: str, policy: Policy) -> None:
    live_fd = open_private(job_fd, LIVE_DIR, shown=f"{shown}/{LIVE_DIR}")
    try:
        name = _marker_name(policy)
        record = HolderRecord.mine(policy.node_id, "user").to_bytes()
        try:
            fd = create_exclusive(at(live_fd, name), 0o600)
        except FileExistsError:
            # A marker of a dead process that had our pid (this process registers once): ours now.
            os.unlink(name, dir_fd=live_fd)
            fd = create_exclusive(at(live_fd, name), 0o600)
        try:
            write_all(fd, record)
        finally:
            os.close(fd)
    finally:
        os.close(live_fd)


def _leave_at_exit(root: str, pid: int, job: str, marker: str) -> None:
    """Remove this process's marker; outside Slurm, the run's last process also removes the job directory."""
    if os.getpid() != pid:
        return  # a forked child that exits through Python's shutdown is not the registered process
    try:
        root_fd = open_root(Root(root, "node-local root"))
        try:
            user_fd = open_private(root_fd, user_dir_name(os.getuid()), shown=f"{root}/sharedfs-{os.getuid()}",
                                   create=False)
        finally:
            os.close(root_fd)
        try:
            shown = f"{root}/{user_dir_name(os.getuid())}"
            lock_fd = _open_lock(user_fd, job, shown)
            try:
                _flock(lock_fd, LOCK_WAIT, f"{shown}/{job}")
                job_fd = os.open(job, DIR_FLAGS, dir_fd=user_fd)
                try:
                    _remove_marker(job_fd, marker)
                    # Under Slurm another step of this job may come: the epilog removes the directory.
                    if os.environ.get("SLURM_JOB_ID") or _live_markers(job_fd, _policy_or_none()):
                        return
                    _remove_contents(job_fd, os.fstat(job_fd).st_dev, [], f"{shown}/{job}")
                finally:
                    os.close(job_fd)
                os.rmdir(job, dir_fd=user_fd)
                _unlink_quietly(user_fd, f"{job}.lock")
            finally:
                os.close(lock_fd)
        finally:
            os.close(user_fd)
    except (OSError, JobCleanupError):
        pass  # at exit nothing may raise; the epilog (`sharedfs cleanup`) catches what is left


def _remove_marker(job_fd: int, marker: str) -> None:
    try:
        live_fd = os.open(LIVE_DIR, DIR_FLAGS, dir_fd=job_fd)
    except FileNotFoundError:
        return
    try:
        _unlink_quietly(live_fd, marker)
    finally:
        os.close(live_fd)


def _live_markers(job_fd: int, policy: Policy | None) -> list[str]:
    """Markers in the job directory held as ``job_fd`` that may name a live process."""
    try:
        live_fd = os.open(LIVE_DIR, DIR_FLAGS, dir_fd=job_fd)
    except FileNotFoundError:
        return []
    except OSError:
        return [f"{LIVE_DIR} (not a directory we can read)"]  # cannot tell: fail closed, keep the directory
    try:
        alive = []
        for name in sorted(os.listdir(live_fd)):
            try:
                got = read_untrusted(at(live_fd, name))
            except FileNotFoundError:
                continue  # left while we looked
            record = HolderRecord.parse(got[0]) if got else None
            if record is None or policy is None or _holder_alive(record, policy) is not False:
                alive.append(name)
        return alive
    finally:
        os.close(live_fd)


def _holder_alive(record: HolderRecord, policy: Policy) -> bool | None:
    try:
        return runtime.registry().holder_alive(record, policy)
    except Exception:  # noqa: BLE001 - a broken liveness plugin means "cannot tell", never "dead"
        return None


def live_users(job_dir: Path) -> list[str]:
    """Markers in ``job_dir`` that may name a live process (dead only when the liveness hook says so)."""
    try:
        fd = os.open(job_dir, DIR_FLAGS)
    except FileNotFoundError:
        return []
    try:
        return _live_markers(fd, _policy_or_none())
    finally:
        os.close(fd)


# -- removal by descriptor --------------------------------------------------------------------------


def _remove_contents(dir_fd: int, dev: int, left: list[str], shown: str, depth: int = 0) -> None:
    """Empty the directory held as ``dir_fd``, never following a symlink and never leaving its filesystem.

    Entries are removed relative to ``dir_fd``; a subdirectory is opened ``O_NOFOLLOW|O_DIRECTORY``
    relative to it, so a name swapped for a symlink is unlinked (the link, not its target).  What
    cannot be removed (another mount, too deep, permission) is appended to ``left``.
    """
    for name in os.listdir(dir_fd):
        try:
            os.unlink(name, dir_fd=dir_fd)
            continue
        except FileNotFoundError:
            continue
        except IsADirectoryError:
            pass  # a directory (Linux unlink answers EISDIR): empty it, then rmdir
        except OSError as exc:
            left.append(f"{shown}/{name}: {exc.strerror}")
            continue
        if depth >= MAX_DEPTH:
            left.append(f"{shown}/{name}: deeper than {MAX_DEPTH} levels")
            continue
        try:
            sub = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        except NotADirectoryError:
            _unlink_quietly(dir_fd, name)  # swapped for a non-directory since: remove that name
            continue
        except FileNotFoundError:
            continue
        except OSError as exc:
            left.append(f"{shown}/{name}: {exc.strerror}")
            continue
        try:
            if os.fstat(sub).st_dev != dev:
                left.append(f"{shown}/{name}: another filesystem is mounted there")
                continue
            _remove_contents(sub, dev, left, f"{shown}/{name}", depth + 1)
        finally:
            os.close(sub)
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            left.append(f"{shown}/{name}: {exc.strerror}")


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


# -- sharedfs cleanup --job -------------------------------------------------------------------------


def _normalise_job(job: str) -> str:
    job = str(job).strip()
    name = job if job.startswith("job-") else f"job-{job}"
    body = name[len("job-"):]
    if not body or "/" in body or body in (".", "..") or "\0" in body or len(body) > 128:
        raise JobCleanupError(f"invalid job id {job!r}: give the scheduler's job id, e.g. --job 12345")
    return name


def _epilog_of(job: str) -> bool:
    """Whether this is Slurm's epilog of ``job`` on this node: the job's processes here are gone by now."""
    return (os.environ.get("SLURM_SCRIPT_CONTEXT") == "epilog_slurmd"
            and f"job-{os.environ.get('SLURM_JOB_ID', '').strip()}" == job)


def cleanup_job(job: str, *, uid: int | None = None, root: str | None = None, force: bool = False,
                timeout: float = CHILD_TIMEOUT) -> dict[str, Any]:
    """Remove ``<root>/sharedfs-<uid>/job-<job>`` on this node; returns what was done.

    ``uid`` defaults to ``$SLURM_JOB_UID`` (set in Slurm epilogs) else the
    caller's; ``root`` to the node-local root in force
    (:func:`sharedfs.cluster.dirs.node_local_root`).  A user directory that is a
    symlink or owned by someone else is refused (:class:`JobCleanupError`).
    While a process of the job on this node may still be alive nothing is
    removed unless ``force`` (in Slurm's epilog of that job, none is).  Run by
    root for another user, everything inside her directory is done by a child
    process running as her (docs/security.md says why).
    """
    name = _normalise_job(job)
    if uid is None:
        env_uid = os.environ.get("SLURM_JOB_UID", "").strip()
        uid = int(env_uid) if env_uid.isdigit() else os.getuid()
    if os.geteuid() not in (0, uid):
        raise JobCleanupError(f"only root or uid {uid} may clean uid {uid}'s directories (you are uid {os.geteuid()})")
    root = root or root_of().path
    user_dir = f"{root}/{user_dir_name(uid)}"
    report: dict[str, Any] = {"job": name, "uid": uid, "path": f"{user_dir}/{name}", "removed": [], "live": [],
                              "left": [], "skipped": None}
    try:
        # The root is the site's (or the user's own) choice: a symlink to it is followed.
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        report["skipped"] = f"{root} does not exist: nothing to clean"
        return report
    except OSError as exc:
        raise JobCleanupError(f"cannot open the node-local root {root}: {exc.strerror}") from None
    try:
        user_fd = _open_user_dir(root_fd, uid, user_dir)
    finally:
        os.close(root_fd)
    if user_fd is None:
        report["skipped"] = f"{user_dir} does not exist: nothing to clean"
        return report
    try:
        policy = _policy_or_none()
        if policy is not None:
            runtime.registry()  # plugins load now, as root: the child may not be able to read them
        args = (user_fd, name, user_dir, uid, force, _epilog_of(name), policy)
        if os.geteuid() == 0 and uid != 0:
            done = _as_user(uid, _gid_of(uid, user_fd), args, timeout)
        else:
            done = _clean(*args)
    finally:
        os.close(user_fd)
    report.update(done)
    return report


def _open_user_dir(root_fd: int, uid: int, shown: str) -> int | None:
    try:
        fd = os.open(user_dir_name(uid), DIR_FLAGS, dir_fd=root_fd)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise JobCleanupError(f"{shown} is not a plain directory (a symlink?); refusing to clean under it. "
                              "Remove it by hand after checking where it points.") from None
    except OSError as exc:
        raise JobCleanupError(f"cannot open {shown}: {exc.strerror}") from None
    st = os.fstat(fd)
    if st.st_uid != uid:
        os.close(fd)
        raise JobCleanupError(f"{shown} is owned by uid {st.st_uid}, not uid {uid}: it is not that user's "
                              "sharedfs directory; refusing to touch it.")
    return fd


def _clean(user_fd: int, name: str, shown: str, uid: int, force: bool, job_over: bool,
           policy: Policy | None) -> dict[str, Any]:
    """The cleanup proper, as the directory's owner (or root for root's own directories)."""
    target = f"{shown}/{name}"
    done: dict[str, Any] = {"removed": [], "live": [], "left": [], "skipped": None}
    try:
        lock_fd = _open_lock(user_fd, name, shown)
    except (OSError, UnsafeDirectoryError) as exc:
        raise JobCleanupError(f"cannot take the lock of {target}: {exc}") from None
    try:
        _flock(lock_fd, LOCK_WAIT, target)
        try:
            job_fd = os.open(name, DIR_FLAGS, dir_fd=user_fd)
        except FileNotFoundError:
            job_fd = None
            done["skipped"] = f"{target} does not exist: nothing to clean"
        except NotADirectoryError:
            # A symlink (or file) where the job directory should be: remove the name, never its target.
            os.unlink(name, dir_fd=user_fd)
            done["removed"].append(target)
            job_fd = None
        if job_fd is not None:
            try:
                st = os.fstat(job_fd)
                if st.st_uid != uid:
                    raise JobCleanupError(f"{target} is owned by uid {st.st_uid}, not uid {uid}; refusing to touch it")
                live = [] if job_over else _live_markers(job_fd, policy)
                done["live"] = live
                if live and not force:
                    done["skipped"] = (f"{len(live)} process(es) of the job may still use {target} on this node "
                                       f"({', '.join(live)}); pass --force to remove it anyway")
                    return done
                _remove_contents(job_fd, st.st_dev, done["left"], target)
            finally:
                os.close(job_fd)
            if done["left"]:
                shown_left = "; ".join(done["left"][:3]) + ("; ..." if len(done["left"]) > 3 else "")
                done["skipped"] = (f"{len(done['left'])} entries could not be removed as uid {uid} ({shown_left}); "
                                   "they stay, with the job directory")
                return done
            os.rmdir(name, dir_fd=user_fd)
            done["removed"].append(target)
        # The job is over here (or never was): its lock file goes too (it is ours: we just opened it).
        _unlink_quietly(user_fd, f"{name}.lock")
        if done["removed"]:
            done["removed"].append(f"{target}.lock")
    except OSError as exc:
        raise JobCleanupError(f"cleaning {target} failed: {exc}") from None
    finally:
        os.close(lock_fd)
    return done


def _gid_of(uid: int, user_fd: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return os.fstat(user_fd).st_gid  # a group the user chose for her own directory (she is a member)


def _as_user(uid: int, gid: int, args: tuple[Any, ...], timeout: float) -> dict[str, Any]:
    """Run :func:`_clean` in a forked child that has irrevocably become ``uid``; its result comes back as JSON."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
                raise JobCleanupError(f"could not become uid {uid}")
            os.umask(0o077)
            try:
                answer: dict[str, Any] = {"done": _clean(*args)}
            except JobCleanupError as exc:
                answer = {"error": str(exc)}
            write_all(write_end, json.dumps(answer).encode())
            code = 0
        except BaseException as exc:  # noqa: BLE001 - report anything, then leave without running the caller's code
            with contextlib.suppress(BaseException):  # the parent then reports "died without an answer"
                write_all(write_end, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        data = _read_until(read_end, time.monotonic() + timeout)
    finally:
        os.close(read_end)
    if data is None:
        os.kill(pid, signal.SIGKILL)
        _reap(pid, 5.0)  # a child stuck in the kernel (a hard NFS mount) may not die: do not wait for it forever
        raise JobCleanupError(f"cleaning as uid {uid} did not finish within {timeout:g} s (a filesystem not "
                              "answering?); it was stopped, nothing more was removed")
    os.waitpid(pid, 0)
    try:
        answer = json.loads(data)
    except ValueError:
        raise JobCleanupError(f"the cleanup process running as uid {uid} died without an answer") from None
    if "error" in answer:
        raise JobCleanupError(answer["error"])
    return answer["done"]


def _reap(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)


def _read_until(fd: int, deadline: float) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)

