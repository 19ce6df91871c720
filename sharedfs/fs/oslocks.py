"""One whole-file lock call of either native kind -- BSD ``flock`` or POSIX ``lockf`` -- and what its errno means.

The lock kinds and both probes lock through here, so they agree on "held", "held by another" and "no such lock".
"""

from __future__ import annotations

import errno
import fcntl
import time

__all__ = ["CONTENTION", "NO_LOCKS", "UNLOCK_UNCERTAIN", "errno_name", "held_here", "lock", "lock_by", "try_lock",
           "unlock"]

#: A non-blocking attempt on a lock someone else holds (lockf may say EACCES or EAGAIN: POSIX allows both).
CONTENTION = frozenset({errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK})
#: This filesystem has no such lock: Lustre without -o flock (ENOSYS), NFS without lockd (ENOLCK).
NO_LOCKS = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP})


def lock(fd: int, kind: str, *, blocking: bool = False, shared: bool = False) -> None:
    """An exclusive (or ``shared``) ``kind`` (``"flock"`` or ``"posix"``) lock on the whole file; raises OSError."""
    op = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    if not blocking:
        op |= fcntl.LOCK_NB
    (fcntl.flock if kind == "flock" else fcntl.lockf)(fd, op)


#: What NFS answers to an unlock it could not confirm: ENOLCK when the lock manager is overwhelmed (many
#: ranks starting at once), ESTALE when the file handle went stale.  The caller closes the descriptor next,
#: which releases the lock in any case: as far as this process can tell, it is released.
UNLOCK_UNCERTAIN = frozenset({errno.ENOLCK, errno.ESTALE})


def unlock(fd: int, kind: str) -> str | None:
    """Release ``fd``'s ``kind`` lock; the errno name when the filesystem answered :data:`UNLOCK_UNCERTAIN`.

    Any other error is raised.  An uncertain answer is returned, not raised: the descriptor's close,
    which always follows, lets go of the lock, and a framework must not fail its release for it.
    """
    try:
        (fcntl.flock if kind == "flock" else fcntl.lockf)(fd, fcntl.LOCK_UN)
    except OSError as exc:
        if exc.errno not in UNLOCK_UNCERTAIN:
            raise
        return errno_name(exc)
    return None


def lock_by(fd: int, deadline: float, kind: str = "flock", *, max_pause: float = 0.5) -> bool:
    """Take ``fd``'s exclusive ``kind`` lock by ``deadline`` (``time.monotonic()``), polling, never blocking.

    Polls from every 10 ms, doubling up to ``max_pause``.  False at the deadline; any error but
    contention is raised.  For sharedfs's own private lock files
    (a node's job directory, the scheduler cache), whose holder may be a user's process: root must not
    block on it forever.
    """
    pause = 0.01
    while True:
        try:
            lock(fd, kind)
            return True
        except OSError as exc:
            if exc.errno not in CONTENTION:
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, max_pause)


def try_lock(fd: int, kind: str) -> tuple[str, str | None]:
    """One non-blocking attempt: ``("held", None)``, ``("blocked", None)`` or ``("failed", errno name)``."""
    try:
        lock(fd, kind)
    except OSError as exc:
        if exc.errno in CONTENTION:
            return "blocked", None
        return "failed", errno_name(exc)
    return "held", None


def errno_name(exc: OSError) -> str | None:
    return errno.errorcode.get(exc.errno) if exc.errno else None


def held_here() -> dict[tuple[int, int, int], list[tuple[str, int]]]:
    """This node's kernel locks, from ``/proc/locks``: (major, minor, inode) -> [(``FLOCK``/``POSIX``/..., pid)].

    Waiters (``->`` lines) are left out.  Empty when ``/proc/locks`` cannot be read.  What
    ``lslocks`` shows, for naming the pid that holds a lock on this node.
    """
    table: dict[tuple[int, int, int], list[tuple[str, int]]] = {}
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return table
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[1] == "->":  # "->": a waiter blocked on that lock
            continue
        try:
            major, minor, inode = parts[5].split(":")
            table.setdefault((int(major, 16), int(minor, 16), int(inode)), []).append((parts[1], int(parts[4])))
        except ValueError:
            continue
    return table
