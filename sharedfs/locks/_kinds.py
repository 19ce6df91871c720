"""The four lock kinds in two small classes -- :class:`Native` (``flock``, ``posix``) and
:class:`Existence` (``soft``, ``lease``) -- each making one non-blocking attempt per call
(docs/architecture.md, "Locks")."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import threading
from dataclasses import field
from fcntl import LOCK_EX, LOCK_NB
from typing import Any, Callable

from sharedfs.fs import oslocks, stale
from sharedfs.fs.safefile import NOFOLLOW
from sharedfs.locks import _marker
from sharedfs.model.policy import LockChoice, Policy, TeamCache
from sharedfs.model.records import HolderRecord, user_name
from sharedfs.model.structs import mutable

log = logging.getLogger("sharedfs")

LOCK_EX_NB = LOCK_EX | LOCK_NB
#: How a native lock file is opened (created if missing), as _open_lock_file does in the common case.
_LOCK_FILE_FLAGS = os.O_RDWR | os.O_CREAT | NOFOLLOW

#: The mode filelock >= 4 uses when none is given: 0o666 filtered by the umask (and default ACLs).
DEFAULT_MODE = 0o666

#: This process's id, kept current across forks (os.register_at_fork): what a new hold records as
#: its taker.  os.getpid() is a system call (~0.25 us on a VM); a cycle asked it three times, and
#: now once, when releasing: that check stays a system call so that it holds even in a child forked
#: without Python's fork hooks (a child that kept a stale PID then fails closed: it leaves its own
#: locks to the close of their descriptors, and never unlocks a parent's).
PID = os.getpid()


def _new_pid_in_child() -> None:
    global PID
    PID = os.getpid()


os.register_at_fork(after_in_child=_new_pid_in_child)


class NativeLockRefused(OSError):
    """The filesystem refused a native lock (ENOSYS, ENOLCK): its classification was wrong, or lockd died."""

    def __init__(self, kind: str, cause: OSError) -> None:
        super().__init__(cause.errno, f"{kind} failed with {errno.errorcode.get(cause.errno or 0, cause.errno)}")
        self.kind = kind


@mutable
class Target:
    """What a kind needs to know about the lock it implements."""

    lock_file: str
    mode: int
    policy: Policy
    choice: LockChoice
    #: The lock's directory is shared by a group (sharedfs_team_cache): files made there are the group's.
    team: TeamCache | None = None
    #: A mode the caller asked for (``mode=0o664``): like filelock, files created get exactly it.
    explicit_mode: int | None = None
    #: How long this waiter has seen the current marker unchanged (leases, empty markers).
    watch: _marker.Watch = field(default_factory=_marker.Watch)
    #: The lock hands its descriptor to a callback (filelock's ``on_acquired``), which may write through it.
    callback: bool = False
    #: This taker's own record file that another process removed or replaced before the link, on the last
    #: attempt (``None`` once an attempt was not tampered with): what a timeout then names.
    tampered: str | None = None

    @property
    def marker(self) -> str:
        return _marker.marker_path(self.lock_file)


class Hold:
    """One held lock: the descriptor filelock's context keeps, and what releasing it needs.

    A plain class with slots, not a dataclass: one is made for every acquisition.
    """

    __slots__ = ("fd", "kind", "pid", "marker_fd", "lease", "thread_lock", "gate", "identity")

    def __init__(self, fd: int, kind: Any, marker_fd: int | None = None, lease: Any = None,
                 thread_lock: threading.Lock | None = None, identity: tuple[int, int] | None = None) -> None:
        self.fd = fd
        self.kind = kind  # the Kind instance that took it (a run-time fallback may change the lock's kind)
        self.pid = PID
        self.marker_fd = marker_fd
        self.lease = lease
        self.thread_lock = thread_lock
        #: The node gate this process held while it waited (sharedfs.cluster.gates), kept until release.
        self.gate: int | None = None
        #: (st_dev, st_ino) of ``fd`` when the kind already knows it (filelock's descriptor tracking).
        self.identity = identity


# -- the marker, shared by every kind -----------------------------------------------------------

_said: set[str] = set()


#: ``registry.holder_alive``: (record, policy, seconds watched unchanged or None) -> alive, gone, or None.
HolderAlive = Callable[[HolderRecord, Policy, "float | None"], "bool | None"]

def _say_once(key: str, message: str, *args: object) -> None:
    if key not in _said:
        _said.add(key)
        log.warning(message, *args)


def take_marker(target: Target, *, native_held: bool,
                holder_alive: HolderAlive) -> tuple[int, Any] | None:
    """Create the marker with this process's record; (fd, lease) or ``None`` while someone else holds it."""
    kind = target.choice.kind
    lease_seconds = target.policy.lease_seconds if kind == "lease" else None
    record = HolderRecord.mine(target.policy.node_id, kind, lease_seconds=lease_seconds)
    try:
        return _take_marker(target, record, lease_seconds, native_held, holder_alive)
    except OSError as exc:
        if not stale.is_stale(exc):
            raise
        # Another client removed or replaced the marker (or its directory) under this attempt: contention for
        # this attempt, never "dead" nor a crash; the next poll asks again through the names.
        return None


def _take_marker(target: Target, record: HolderRecord, lease_seconds: float | None, native_held: bool,
                 holder_alive: HolderAlive) -> tuple[int, Any] | None:
    for _ in range(2):  # a second try right after breaking a dead holder's marker
        try:
            fd = _marker.create(target.marker, record, target.mode)
        except _marker.Tampered as exc:
            # Someone else changes files in the lock directory under this taker: contention for this attempt
            # (the next one uses a fresh own name), never an error out of acquire() nor a broken marker.
            target.tampered = exc.filename
            _say_once(target.marker + ":tampered", "%s was removed or replaced before it could be linked to the "
                      "lock marker %s: another process is changing files in %s. The lock counts as held for this "
                      "attempt and is tried again.", exc.filename, target.marker, os.path.dirname(target.marker))
            return None
        except FileExistsError:
            if not _break_if_dead(target, native_held, holder_alive):
                # Waiting: now and then, clear what takers killed before their link left (never a live one's).
                _marker.collect_leftovers(target.marker, _dead_by(target, holder_alive))
                return None
            continue
        target.tampered = None
        _settle_or_undo(fd, target, target.marker)
        lease = _marker.start_lease(fd, target.marker, lease_seconds) if lease_seconds else None
        return fd, lease
    return None


def _break_if_dead(target: Target, native_held: bool,
                   holder_alive: HolderAlive) -> bool:
    """True when the marker is gone now (released, or broken here because its holder is gone)."""
    seen = _marker.read(target.marker)
    if seen is None:
        return True
    if not seen.readable:
        _say_once(target.marker, "%s is not a lock marker sharedfs wrote (a symlink, FIFO, directory or oversized "
                  "file): the lock counts as held (see: sharedfs locks %s). Remove it if nobody uses the lock: "
                  "rm -f %s", target.marker, target.lock_file, target.marker)
        return False
    record = seen.record
    if record is None:
        if seen.data:
            _say_once(target.marker, "%s holds no holder record sharedfs can read: the lock counts as held (see: "
                      "sharedfs locks %s). Remove it if nobody uses the lock: rm -f %s", target.marker,
                      target.lock_file, target.marker)
            return False
        dead = target.watch.unchanged_for(seen) >= _marker.EMPTY_GRACE
    elif native_held and record.kind in ("flock", "posix"):
        dead = True  # that holder would still hold the native lock we now hold (the protocol, not liveness)
    else:  # the one rule for "holder gone", a lease's expiry included (plugins/liveness.py)
        dead = holder_alive(record, target.policy, target.watch.unchanged_for(seen)) is False
    if not dead:
        return False
    try:
        breaker = HolderRecord.mine(target.policy.node_id, "break")
        broken = _marker.break_stale(target.marker, seen, breaker,
                                     lambda other: holder_alive(other, target.policy, None) is False)
    except _marker.NotAllowed:
        _say_once(target.marker + ":owner",
                  "%s was left by %s, whose process is gone (%s), but %s does not let you remove another user's "
                  "file (a sticky or read-only directory). Ask them or an administrator to run "
                  "`sharedfs locks --clear-dead %s` (it checks that the holder is gone first), or to run: rm -f %s",
                  target.marker, _user(seen.owner), record.describe() if record else "it never wrote its record",
                  os.path.dirname(target.marker), target.lock_file, target.marker)
        return False
    if broken:
        from sharedfs.machinery.log import decision

        # Its holder died (a job killed): takers of that job killed before their link left own names too.
        _marker.collect_leftovers(target.marker, _dead_by(target, holder_alive), force=True)

        holder = record.describe() if record else "a holder that never wrote its record"
        decision(f"broke the lock {target.lock_file}: its holder ({holder}) is gone", every_rank=True)
        return True
    return False


def _dead_by(target: Target, holder_alive: HolderAlive) -> Callable[[HolderRecord], bool]:
    """The one rule for "holder gone" (``sharedfs_holder_alive``), for records nobody watched change."""
    return lambda record: holder_alive(record, target.policy, None) is False


def _user(uid: int) -> str:
    name = user_name(uid)
    return f"{name} (uid {uid})" if name != str(uid) else f"uid {uid}"


def drop_marker(hold: Hold, target: Target) -> None:
    """Remove the marker (while it is still this hold's) and close it."""
    unlink_marker(hold, target)
    close_marker(hold)


def unlink_marker(hold: Hold, target: Target) -> None:
    """Free the lock for others: the marker's name goes, its descriptor stays open.  Safe to repeat."""
    fd = hold.marker_fd
    if fd is None:
        return
    if hold.lease is not None:
        _marker.stop_lease(hold.lease)
    if hold.pid == os.getpid():  # a forked child never removes its parent's marker
        try:
            st = os.fstat(fd)
        except OSError as exc:  # ESTALE: another client removed our marker (taken over): no name of ours to free
            if not stale.gone(exc):
                raise
            return
        _marker._unlink_if_same(target.marker, st)


def close_marker(hold: Hold) -> None:
    # Forgotten before it is closed: a release an interrupt cut short may leak the number, never close it twice
    # (by then it may be another file's).
    fd, hold.marker_fd = hold.marker_fd, None
    if fd is not None:
        stale.close(fd)  # ESTALE: the marker is gone already (broken by a waiter, or replaced elsewhere)


# -- native kinds ---------------------------------------------------------------------------------


class _InProcess:
    """POSIX record locks belong to the process: a second descriptor in the same process "gets" the
    lock too, and closing any descriptor of the file drops it.  A threading lock per file restores
    exclusion between threads (filelock's thread-local default expects it)."""

    _locks: dict[tuple[int, int], threading.Lock] = {}
    _table = threading.Lock()

    @classmethod
    def for_file(cls, st: os.stat_result) -> threading.Lock:
        with cls._table:
            return cls._locks.setdefault((st.st_dev, st.st_ino), threading.Lock())


def settle(fd: int, target: Target) -> None:
    r"""A file this lock just created gets the team's mode and group, or the mode the caller asked for.

    filelock ``fchmod``\ s a lock file to an explicit ``mode`` whatever the umask (the hub asks for
    0o664 so that users sharing a cache can wait on each other's locks); so does sharedfs.
    """
    if target.team is not None:
        share(fd, target.team)
    elif target.explicit_mode is not None:
        try:
            os.fchmod(fd, target.explicit_mode)
        except PermissionError:
            pass  # as filelock: the file keeps the umask's mode; any other error fails the acquire


def _settle_or_undo(fd: int, target: Target, marker: str | None) -> None:
    """:func:`settle` a file this call created; if that fails, close it (and remove a marker) before raising.

    A lock file stays, as filelock leaves its lock files: another process may be locking it already.
    """
    try:
        settle(fd, target)
    except BaseException:
        try:
            if marker is not None:
                _marker._unlink_if_same(marker, os.fstat(fd))
        finally:
            stale.close(fd)
        raise


def share(fd: int, team: TeamCache | None) -> None:
    """Give a file sharedfs just created in a team cache the group's mode and group, whatever the umask."""
    if team is None:
        return
    try:
        st = os.fstat(fd)
        if st.st_gid != team.gid:
            os.fchown(fd, -1, team.gid)  # a member may give her file to her group
        if stat.S_IMODE(st.st_mode) != team.file_mode:
            os.fchmod(fd, team.file_mode)
    except OSError:
        pass  # the owner sees it as before; members who cannot write it still wait on it read-only


def _open_lock_file(target: Target) -> tuple[int, bool] | None:
    """Open (creating) the native lock file: (descriptor, opened read-only); ``None`` when it vanished meanwhile."""
    path, mode = target.lock_file, target.mode
    flags = os.O_RDWR | os.O_CREAT | NOFOLLOW
    try:
        if target.team is not None or target.explicit_mode is not None:
            try:  # only a file this call creates gets a mode or group of sharedfs's choosing
                fd = os.open(path, flags | os.O_EXCL, mode)
            except FileExistsError:
                pass
            else:
                _settle_or_undo(fd, target, None)
                return fd, False
        return os.open(path, flags, mode), False
    except FileNotFoundError:
        if not os.path.isdir(os.path.dirname(path) or "."):
            raise  # the directory itself is missing: the caller creates it once, or fails the wait
        return None  # FUSE/NFS: a concurrent unlink between LOOKUP and CREATE (webdataset#386)
    except FileExistsError:
        # EEXIST without O_EXCL: a FUSE client (MooseFS) answered the create from its stale negative entry
        # while another node had made the file. Contention: the next poll opens it once the entry expires.
        return None
    except BlockingIOError:
        # Another process holds a lease on the file (F_SETLEASE; a Samba or NFS server's delegation):
        # the open asked the kernel to break it, and is contention until then, as for filelock.
        return None
    except PermissionError:
        # Another user created the lock file without group write (their umask): it is locked through
        # a descriptor opened for reading (Native.try_acquire), never chmod-ed or replaced.
        try:
            return os.open(path, os.O_RDONLY | NOFOLLOW), True
        except FileNotFoundError:
            pass
        except BlockingIOError:
            return None  # leased (the kernel checks permission before the lease): contention
        directory = os.path.dirname(path) or "."
        if not os.path.lexists(path) and not os.access(directory, os.W_OK | os.X_OK):
            # No lock file, and this user may not create one: waiting would wait forever.
            raise _cannot_create(path, directory) from None
        return None  # it was there, unwritable, and went away meanwhile: contention


def _refuse_if_removable(path: str, st: os.stat_result) -> None:
    """Fail closed on a lock file another user may remove while this process holds it.

    In a sticky directory (``/tmp``) only a file's owner, the directory's owner or root removes
    it: a lock file of a third user is hers to remove mid-hold, after which the next process
    creates and locks a new file of that name, and two hold the lock.  filelock >= 4.2.12
    refuses such a file for this reason, and so does the kernel's ``fs.protected_regular``
    for ``O_CREAT`` (which the read-only fallback would otherwise step around).  Without the
    sticky bit anyone who may create the file may also remove it, so refusing there would
    change nothing.  Team caches are exempt: a lock file there belongs to whichever member
    came first (docs/security.md says what members can do to each other).
    """
    directory = os.path.dirname(path) or "."
    parent = os.stat(directory)  # an error here fails the acquire: cannot tell is not "safe"
    if parent.st_mode & stat.S_ISVTX and st.st_uid != parent.st_uid:
        owner = _user(st.st_uid)
        raise PermissionError(errno.EACCES, f"Permission denied: the lock file belongs to {owner}, who may remove "
                                            f"it while you hold the lock ({directory} is sticky, so only a file's "
                                            f"owner may), and the next process would then lock a new file of that "
                                            f"name alongside you. Lock a file in a directory of your own, or ask "
                                            f"{owner} or an administrator to run: rm -f {path}", path)


def _refuse_if_linked(path: str, st: os.stat_result) -> None:
    """Fail closed on a lock file with another hard link, before a callback is handed its descriptor.

    Where another account may add names to the directory, it may have linked the lock file's name to
    any file it can read and the victim can write (``fs.protected_hardlinks`` aside): a callback
    writing holder metadata through the descriptor would overwrite that file.  filelock >= 4.3
    refuses such a file for ``on_acquired`` (tox-dev/filelock#1118), and so does sharedfs, on every
    filelock release that has the callback.  Without a callback nothing writes through the
    descriptor, and hard-linked names keep sharing the lock.
    """
    directory = os.path.dirname(path) or "."
    parent = os.stat(directory)  # an error here fails the acquire: cannot tell is not "safe"
    if parent.st_uid not in (os.geteuid(), 0) or parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(errno.EACCES, f"Permission denied: the lock file has another hard link ({st.st_nlink} "
                                            f"names) and other accounts can write {directory}: one of them may "
                                            f"point at a file of yours, which on_acquired would then write to. "
                                            f"Remove the extra name, or lock a file in a directory only you can "
                                            f"write", path)


def _cannot_create(path: str, directory: str) -> PermissionError:
    try:
        st = os.stat(directory)
        whose = f"owned by {_user(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):o}"
    except OSError:
        whose = "not readable"
    return PermissionError(errno.EACCES, f"Permission denied: cannot create the lock file there: {directory} "
                                         f"({whose}) does not let you create files. Its owner or an administrator "
                                         f"can let the group in with: chmod g+ws {directory} (`sharedfs doctor "
                                         f"{directory}` checks the whole cache)", path)


class Native:
    """``flock`` or POSIX ``lockf`` on the whole lock file.

    A lock file another user left without group write is opened read-only.  flock takes an
    exclusive lock on such a descriptor, except on NFS, where flock is a POSIX lock and an
    exclusive POSIX lock needs a descriptor opened for writing (flock(2), EBADF).  There, and for
    the posix kind, the lock is a *shared* one plus the marker: the shared lock excludes (and is
    excluded by) every exclusive holder, sharedfs or not; the marker excludes the other read-only
    holders, whose shared locks do not exclude each other.
    """

    def __init__(self, target: Target, holder_alive: HolderAlive) -> None:
        self.target = target
        self.how = target.choice.kind
        self.holder_alive = holder_alive

    def try_acquire(self) -> Hold | None:
        try:
            return self._try_once()
        except OSError as exc:
            if not stale.is_stale(exc):
                raise
            # The lock file was removed or replaced by another client under this attempt (ESTALE from the
            # open, fstat or the lock call): its lock guards no name; the next poll opens the name again.
            return None

    def _try_once(self) -> Hold | None:
        target = self.target
        fd: int | None = None
        read_only = False
        if target.team is None and target.explicit_mode is None:
            try:  # the common case, inline: the lock file exists, or this call creates it
                fd = os.open(target.lock_file, _LOCK_FILE_FLAGS, target.mode)
            except OSError:
                pass  # vanished meanwhile, or not ours to write: _open_lock_file sorts it out
        if fd is None:
            opened = _open_lock_file(target)
            if opened is None:
                return None
            fd, read_only = opened
        shared = read_only and self.how == "posix"
        thread_lock: threading.Lock | None = None
        locked = False
        hold: Hold | None = None
        try:
            if self.how == "posix":
                candidate = _InProcess.for_file(os.fstat(fd))
                if not candidate.acquire(blocking=False):
                    return None
                thread_lock = candidate
            try:
                try:
                    if self.how == "flock" and not read_only:
                        # The common case, inline; looked up on the module at each call, as filelock
                        # does, so a test (or a tool) that patches fcntl.flock reaches sharedfs's locks too.
                        fcntl.flock(fd, LOCK_EX_NB)
                    else:
                        oslocks.lock(fd, self.how, shared=shared)
                except OSError as exc:
                    if not (read_only and exc.errno == errno.EBADF and not shared):
                        raise
                    shared = True  # NFS: an exclusive flock is an exclusive POSIX lock, which needs write access
                    oslocks.lock(fd, self.how, shared=True)
            except OSError as exc:
                if exc.errno in oslocks.CONTENTION:
                    return None
                if exc.errno in oslocks.NO_LOCKS:
                    raise NativeLockRefused(self.how, exc) from exc
                raise
            locked = True
            # Locked an inode someone unlinked or replaced (wids unlinks its lock files,
            # webdataset#386): that lock guards no name, so let go and try again.  On a filesystem
            # only this node sees, the inode's link count says so exactly; where other nodes
            # unlink (a client's attribute cache may lag), the name is looked up again.
            st = os.fstat(fd)
            if st.st_nlink == 0:
                return None
            if st.st_nlink > 1 and target.callback:  # the common path (no callback) pays nothing for it
                _refuse_if_linked(target.lock_file, st)
            if st.st_uid != os.geteuid() and target.team is None:
                _refuse_if_removable(target.lock_file, st)
            if target.choice.marker or read_only:
                try:
                    current = os.stat(target.lock_file)
                except OSError as exc:
                    if not stale.gone(exc):
                        raise
                    return None
                if current.st_ino != st.st_ino or current.st_dev != st.st_dev:
                    return None
            candidate_hold = Hold(fd, self, None, None, thread_lock, (st.st_dev, st.st_ino))
            if self.target.choice.marker or shared:
                # A shared lock proves nothing about a marker's holder (other readers hold one too).
                taken = take_marker(self.target, native_held=not shared, holder_alive=self.holder_alive)
                if taken is None:
                    return None
                candidate_hold.marker_fd, candidate_hold.lease = taken
            hold = candidate_hold
            return hold
        finally:
            if hold is None:  # not acquired, or an error: undo in reverse order
                try:
                    if locked:
                        oslocks.unlock(fd, self.how)
                finally:
                    stale.close(fd)
                    if thread_lock is not None:
                        thread_lock.release()

    def unlock(self, hold: Hold) -> None:
        """Let go of the lock and keep the descriptor; safe to repeat (a release an interrupt cut short)."""
        if hold.marker_fd is not None:
            drop_marker(hold, self.target)
        if hold.pid == os.getpid():  # flock is shared with a forked child's copy: the child must not unlock
            uncertain = oslocks.unlock(hold.fd, self.how)
            if uncertain is not None:
                # NFS answered ENOLCK/ESTALE (TensorRT-LLM saw it in its remote-code lock with many ranks):
                # close(2), which comes next, lets go of the lock whatever the server said, so the release is
                # done as far as this process can tell; a framework's `with lock:` must not fail on it.
                _say_once("unlock:" + uncertain, "releasing the %s lock on %s answered %s (the filesystem's lock "
                          "manager could not confirm it); its descriptor is closed now, which releases it: treated "
                          "as released (said once per process; others may follow)", self.how, self.target.lock_file,
                          uncertain)

    def close(self, hold: Hold) -> None:
        """After :meth:`unlock`: close the descriptor (then the in-process lock of a POSIX record lock)."""
        fd, hold.fd = hold.fd, -1
        if fd < 0:
            return
        try:
            stale.close(fd)  # ESTALE: the lock file was removed or replaced elsewhere; the descriptor is freed
        finally:
            if hold.thread_lock is not None and hold.pid == os.getpid():
                hold.thread_lock.release()


# -- existence kinds ------------------------------------------------------------------------------


class Existence:
    """``soft`` and ``lease``: the marker alone."""

    def __init__(self, target: Target, holder_alive: HolderAlive) -> None:
        self.target = target
        self.holder_alive = holder_alive

    def try_acquire(self) -> Hold | None:
        taken = take_marker(self.target, native_held=False, holder_alive=self.holder_alive)
        if taken is None:
            return None
        fd, lease = taken
        return Hold(fd, self, fd, lease)

    def unlock(self, hold: Hold) -> None:
        unlink_marker(hold, self.target)

    def close(self, hold: Hold) -> None:
        close_marker(hold)  # the marker's descriptor is the hold's (filelock's): closed after filelock forgot it


KINDS: dict[str, type[Native] | type[Existence]] = {"flock": Native, "posix": Native, "soft": Existence,
                                                   "lease": Existence}
