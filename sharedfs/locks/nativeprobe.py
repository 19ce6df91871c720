"""Native lock files (flock, POSIX) probed without blocking: held here (/proc/locks), elsewhere, or free."""

from __future__ import annotations

import fcntl
import os
import stat
import struct
from typing import Any

from sharedfs.fs import oslocks
from sharedfs.fs.directory import Directory
from sharedfs.locks.rows import FREE, HELD, NATIVE, UNKNOWN, Looker, Row
from sharedfs.model.records import user_name

__all__ = ["NATIVE_SUFFIX", "native_row", "posix_holder", "probe", "try_shared_flock"]

#: What a native lock file is called by the frameworks: filelock/datasets/hub ``*.lock``, torch's ``lock``.
NATIVE_SUFFIX = ".lock"
#: struct flock (Linux, 64-bit off_t): l_type, l_whence, l_start, l_len, l_pid (+ padding the kernel writes).
_FLOCK = "hhqqi"
_FLOCK_SIZE = 32


def native_row(where: Directory, name: str, walk: Looker, entry: os.DirEntry[str]) -> Row | None:
    path = lock = where.join(name)
    try:
        if entry.is_symlink():
            return Row(lock, NATIVE, UNKNOWN, "a symlink where a lock file should be: not followed (a planted "
                       "link would make every locker lock another file)", path)
        if not entry.is_file(follow_symlinks=False):
            return Row(lock, NATIVE, UNKNOWN, "not a regular file where a lock file should be (a FIFO, socket or "
                       "device: not opened)", path)
    except OSError:
        return None
    walk.call(2)  # open, fstat
    try:
        fd = where.open_file(name, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Row(lock, NATIVE, UNKNOWN, f"cannot open it to probe ({exc.strerror}): whether it is locked "
                   "cannot be told from here", path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Row(lock, NATIVE, UNKNOWN, "not a regular file where a lock file should be", path,
                       owner=st.st_uid)
        return probe(fd, st, lock, path, walk)
    finally:
        walk.call()
        os.close(fd)


def probe(fd: int, st: os.stat_result, lock: str, path: str, walk: Looker) -> Row:
    """Is the native lock on ``fd`` held?  Never blocks, never keeps a lock."""
    here = walk.proc_locks().get((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    if here:
        how, pid = here[0]
        return Row(lock, NATIVE, HELD, f"a {how} lock held by pid {pid} on this node (/proc/locks); the kernel "
                   "drops it when that process ends", path, owner=st.st_uid,
                   native_holder=_local_holder(pid, how))
    walk.call(2)
    if try_shared_flock(fd) == "blocked":
        return Row(lock, NATIVE, HELD, "flock held by a process on another node (a non-blocking probe from here "
                   "was refused); its node's kernel or lock manager drops it when that process ends", path,
                   owner=st.st_uid, changed=st.st_mtime)
    walk.call()
    posix_pid = posix_holder(fd)
    if posix_pid is not None:
        where = f"pid {posix_pid} (as the lock manager names it)" if posix_pid > 0 else "a process"
        return Row(lock, NATIVE, HELD, f"a POSIX lock held by {where} on another node (F_GETLK from here); "
                   "released when that process ends", path, owner=st.st_uid, changed=st.st_mtime)
    return Row(lock, NATIVE, FREE, "a lock file nobody holds (flock and POSIX probes from here); lock files "
               "stay after release, as filelock leaves them", path, owner=st.st_uid, changed=st.st_mtime)


def try_shared_flock(fd: int) -> str:
    """``blocked`` when someone holds flock on ``fd``'s file; a shared lock taken for a moment otherwise."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return "blocked" if exc.errno in oslocks.CONTENTION else "failed"
    fcntl.flock(fd, fcntl.LOCK_UN)
    return "free"


def posix_holder(fd: int) -> int | None:
    """The pid of a POSIX lock holder on ``fd``'s file (0 when the lock manager gives none), or ``None``."""
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0).ljust(_FLOCK_SIZE, b"\0")
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        l_type, _, _, _, pid = struct.unpack(_FLOCK, answer[:struct.calcsize(_FLOCK)])
    except (OSError, struct.error):
        return None  # no POSIX locks on this filesystem (ENOLCK, ENOSYS): nobody holds one
    return None if l_type == fcntl.F_UNLCK else max(pid, 0)


def _local_holder(pid: int, how: str) -> dict[str, Any]:
    try:
        uid: int | None = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        uid = None
    from sharedfs.machinery import runtime

    return {"user": user_name(uid) if uid is not None else None, "uid": uid, "node": runtime.policy().node_id,
            "host": os.uname().nodename, "pid": pid, "boot": None, "job": None, "step": None, "since": None,
            "lock_kind": how.lower()}

