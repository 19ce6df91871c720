"""``sharedfs.lock(path)``: a lock that is correct for the filesystem ``path`` lives on.

Plugins choose the kind per path (``sharedfs_choose_lock``); this module only
carries the choice out, on top of filelock:

==========  ==========================================  ==========================
kind        exclusion by                                 correct across nodes when
==========  ==========================================  ==========================
``flock``   ``filelock.UnixFileLock`` (BSD flock)       flock is cluster-coherent
``posix``   ``fcntl`` byte-range lock (filelock has     POSIX locks are coherent
            none; GPFS needs it: granite.build#322)     (GPFS, NFS with lockd)
``soft``    ``filelock.SoftFileLock`` (O_EXCL marker)   O_EXCL create is atomic
``lease``   ``filelock.SoftFileLease`` (heartbeat)      always, but a lease trades
                                                        exclusion for progress
==========  ==========================================  ==========================

What sharedfs adds to filelock: a *holder record* beside the lock file
(``<lock>.holder``: node from ``SHAREDFS_NODE_ID``, pid, process start time,
Slurm job and step), so that a waiter can ask the ``sharedfs_holder_alive``
hook whether a holder on another node is gone (filelock only trusts a dead pid
on its own host), and a timeout error that names the holder and how to clear it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import filelock

from .errors import LockTimeout
from ._policy import LockChoice, Policy

HOLDER_SUFFIX = ".holder"
#: A waiter's pause doubles from MIN_POLL up to MAX_POLL, with jitter so ranks released by one
#: event do not hit the metadata server in step: a quick hand-over is seen within milliseconds,
#: and 512 ranks waiting out an hour-long dataset preparation cost ~512 lookups/s, not 10,000.
MIN_POLL = 0.002
MAX_POLL = 1.0
#: errnos meaning "this filesystem has no such lock": Lustre without -o flock, NFS without lockd.
NO_LOCKS = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP})
#: Existence locks outlive a killed holder, so only they carry a holder record.
RECORDED_KINDS = ("soft", "lease")
#: A waiter says who it waits for after REPORT_AFTER seconds, then every REPORT_EVERY.
REPORT_AFTER = 30.0
REPORT_EVERY = 120.0

log = logging.getLogger("sharedfs")


@dataclass(frozen=True)
class HolderRecord:
    """Who holds a lock: written beside the lock file when it is acquired."""

    node: str
    pid: int
    start_time: str | None  # /proc/<pid>/stat field 22 + boot id: tells a reused pid apart
    host: str
    acquired_at: float
    kind: str
    slurm_job: str | None = None
    slurm_step: str | None = None
    marker: tuple[int, int] | None = None  # (st_ino, st_ctime_ns) of the marker file when acquired

    def describe(self, now: float | None = None) -> str:
        age = (now or time.time()) - self.acquired_at
        job = f", Slurm job {self.slurm_job}" + (f".{self.slurm_step}" if self.slurm_step else "") if self.slurm_job else ""
        return f"pid {self.pid} on node {self.node}{job}, held for {age:.0f} s"

    @classmethod
    def read(cls, lock_file: str) -> HolderRecord | None:
        try:
            with open(lock_file + HOLDER_SUFFIX, encoding="utf-8") as fh:
                data = json.load(fh)
            data["marker"] = tuple(data["marker"]) if data.get("marker") else None
            return cls(**data)
        except (OSError, ValueError, TypeError, KeyError):
            return None  # absent, half-replaced or foreign: no claim about the holder


def process_start_time(pid: int) -> str | None:
    """A token that differs between two processes that had the same pid (Linux only)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            # The command name may contain spaces and parentheses: split after the last ')'.
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        return f"{boot}:{fields[19]}"
    except (OSError, IndexError):
        return None


_process: tuple[int, str | None, str] | None = None


def _this_process() -> tuple[int, str | None, str]:
    """(pid, start time, host name) of this process, computed once per pid (a fork gets its own)."""
    global _process
    if _process is None or _process[0] != os.getpid():
        import socket

        _process = (os.getpid(), process_start_time(os.getpid()), socket.gethostname())
    return _process


class _FcntlLock:
    """An exclusive ``flock`` or POSIX (``fcntl``) lock on the whole file.

    filelock has no POSIX lock (GPFS needs one: granite.build#322), and before 3.30 its
    flock lock mistakes ENOLCK for contention and waits forever; this small class serves
    both.  POSIX locks belong to the *process*: a second fd in the same process "gets" the
    lock too, and closing any fd of the file drops it, so a process-wide threading lock per
    path restores exclusion between threads.
    """

    _in_process: dict[str, threading.Lock] = {}
    _table_lock = threading.Lock()

    def __init__(self, lock_file: str, mode: int, how: str) -> None:
        self.lock_file = lock_file
        self.mode = mode
        self.how = how
        self._fd: int | None = None
        with self._table_lock:
            self._thread_lock = self._in_process.setdefault(os.path.realpath(lock_file), threading.Lock())

    def _lock(self, fd: int, op: int) -> None:
        import fcntl

        (fcntl.flock if self.how == "flock" else fcntl.lockf)(fd, op)

    def try_acquire(self) -> bool:
        import fcntl

        if not self._thread_lock.acquire(blocking=False):
            return False
        try:
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), self.mode)
        except BaseException:
            self._thread_lock.release()
            raise
        try:
            self._lock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # Locked an inode someone unlinked or replaced (wids unlinks its lock files,
            # webdataset#386): that lock excludes nobody, so let go and try again.
            if os.fstat(fd).st_ino != os.stat(self.lock_file).st_ino:
                raise BlockingIOError(errno.EAGAIN, "lock file replaced")
        except OSError as exc:
            os.close(fd)
            self._thread_lock.release()
            if exc.errno in (errno.EACCES, errno.EAGAIN) or isinstance(exc, FileNotFoundError):
                return False
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        import fcntl

        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self._lock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            self._thread_lock.release()


class _FileLockAdapter:
    """One non-blocking attempt at a filelock lock, so the waiting loop is ours."""

    def __init__(self, inner: filelock.BaseFileLock) -> None:
        self.inner = inner

    def try_acquire(self) -> bool:
        try:
            self.inner.acquire(timeout=0)
        except filelock.Timeout:
            return False
        except NotImplementedError as exc:  # filelock 3.10.5-3.23 on ENOSYS (seed 000)
            raise OSError(errno.ENOSYS, str(exc)) from exc
        return True

    def release(self) -> None:
        self.inner.release()


def _filelock_has(name: str) -> bool:
    # filelock >= 3.30 (SoftFileLease, fallback_to_soft) needs Python >= 3.10; 3.9 gets 3.19.
    # __all__ first: hasattr on a lazily exported name imports filelock._lease (~4 ms per process).
    return name in getattr(filelock, "__all__", ()) or hasattr(filelock, name)


def marker_path(lock_file: str, kind: str) -> str:
    """The file a lock of ``kind`` uses for ``lock_file``.

    Native locks use the lock file itself (as filelock and every framework do).
    Existence locks get their own name: a native lock file stays on disk after
    release, so an existence lock on the same name would be "held" forever by
    the first process that ever used flock there (a process without sharedfs, a
    ``python -S`` wrapper, or a flock attempt that failed with ENOSYS).
    """
    return lock_file if kind in ("flock", "posix") else f"{lock_file}.{kind}"


def _backend(kind: str, lock_file: str, policy: Policy, mode: int) -> Any:
    if kind == "posix" or (kind == "flock" and not _filelock_has("SoftFileLease")):
        return _FcntlLock(lock_file, mode, kind)
    if kind == "flock":
        # No silent fallback inside filelock: SharedLock handles a missing flock itself (ENOLCK
        # too, which filelock never falls back on) and remembers it for the whole mount.
        return _FileLockAdapter(filelock.UnixFileLock(lock_file, mode=mode, fallback_to_soft=False))
    if kind == "soft":
        return _FileLockAdapter(filelock.SoftFileLock(lock_file, mode=mode))
    if kind == "lease":
        if not _filelock_has("SoftFileLease"):
            from .errors import ConfigError

            raise ConfigError(policy.source("lock"), "lease", "flock, posix, soft or auto",
                              f"lease locks need filelock >= 3.30 (Python >= 3.10); this interpreter has "
                              f"filelock {filelock.__version__}")
        return _FileLockAdapter(filelock.SoftFileLease(lock_file, lease_duration=policy.lease_seconds, mode=mode))
    raise ValueError(f"unknown lock kind {kind!r}")


class SharedLock:
    """A re-entrant (per object) lock for one path.  Use as a context manager.

    ``timeout=None`` waits up to ``policy.wait_timeout``; a negative timeout waits
    forever; ``0`` tries once.  On timeout :class:`sharedfs.LockTimeout` names the
    holder and says how to clear a lock whose holder is gone.
    """

    def __init__(self, lock_file: str, choice: LockChoice, policy: Policy, *,
                 timeout: float | None = None, mode: int = 0o644) -> None:
        self.lock_file = os.path.abspath(os.fspath(lock_file))
        self.policy = policy
        self.timeout = policy.wait_timeout if timeout is None else timeout
        self._mode = mode
        self._use(choice)
        self._count = 0
        self._record: HolderRecord | None = None

    def _use(self, choice: LockChoice) -> None:
        self.choice = choice
        self.marker = marker_path(self.lock_file, choice.kind)
        self._backend = _backend(choice.kind, self.marker, self.policy, self._mode)

    @property
    def kind(self) -> str:
        return self.choice.kind

    @property
    def is_locked(self) -> bool:
        return self._count > 0

    def acquire(self, timeout: float | None = None) -> SharedLock:
        if self._count:
            self._count += 1
            return self
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout < 0 else time.monotonic() + timeout
        started = time.monotonic()
        delay = MIN_POLL
        next_report = started + REPORT_AFTER
        while True:
            try:
                if self._backend.try_acquire():
                    break
            except OSError as exc:
                if exc.errno not in NO_LOCKS or self.kind not in ("flock", "posix"):
                    raise
                self._fall_back(exc)
                continue
            if self._maybe_break_stale():
                continue  # the dead holder's marker is gone: try again now, not after a backoff pause
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise LockTimeout(self._timeout_message(timeout))
            if now >= next_report:  # a silent hang at 3 a.m. is the worst failure: say who we wait for
                log.warning("still waiting for %s after %.0f s: %s", self.lock_file, now - started,
                            self._holder_text())
                next_report = now + REPORT_EVERY
            pause = delay * random.uniform(0.5, 1.5)
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - now))
            time.sleep(pause)
            delay = min(delay * 2, MAX_POLL)
        self._count = 1
        if self.kind in RECORDED_KINDS:
            try:
                self._record = self._write_record()
            except OSError:
                self._record = None  # the record is advisory; the lock itself is held
        return self

    def release(self, force: bool = False) -> None:
        if not self._count:
            return
        self._count = 0 if force else self._count - 1
        if self._count:
            return
        if self._record is not None:
            # Before the lock is released nobody else can have written a record, so no
            # read-back: an expired lease holder deleting a successor's record only makes
            # that successor unbreakable, which is the safe direction.
            _unlink_quietly(self.lock_file + HOLDER_SUFFIX)
            self._record = None
        self._backend.release()

    def __enter__(self) -> SharedLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<sharedfs.SharedLock {self.lock_file} kind={self.kind} locked={self.is_locked}>"

    def _fall_back(self, exc: OSError) -> None:
        """The filesystem refused a native lock (the classification was wrong, or a lockd died):
        use an existence lock from now on, for this lock and every later one on the same mount."""
        from . import runtime

        failed = f"{self.kind} failed with {errno.errorcode.get(exc.errno, exc.errno)}"
        runtime.native_locks_failed(self.lock_file, failed)
        self._use(LockChoice("soft", f"{failed} on this filesystem; using an existence lock"))
        log.warning("%s at %s; sharedfs switched this filesystem to existence (soft) locks", failed, self.lock_file)

    # -- holder records ----------------------------------------------------------------------

    def _write_record(self) -> HolderRecord:
        st = os.stat(self.marker)
        pid, start_time, host = _this_process()
        record = HolderRecord(
            node=self.policy.node_id, pid=pid, start_time=start_time,
            host=host, acquired_at=time.time(), kind=self.kind,
            slurm_job=os.environ.get("SLURM_JOB_ID"), slurm_step=os.environ.get("SLURM_STEP_ID"), marker=(st.st_ino, st.st_ctime_ns),
        )
        # One create-and-write, no temp + rename: this runs on every acquire, and a reader
        # that catches it half-written gets None ("no claim"), which never breaks a lock.
        fd = os.open(self.lock_file + HOLDER_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, json.dumps(asdict(record)).encode())
        finally:
            os.close(fd)
        return record

    def _maybe_break_stale(self) -> bool:
        """Break an existence lock whose holder a plugin proves dead (filelock only knows its own host).

        True when this call removed the dead holder's marker.
        """
        if self.kind != "soft":
            return False  # native locks die with their holder; a lease expires by itself
        record = HolderRecord.read(self.lock_file)
        if record is None or record.marker is None:
            return False
        from .runtime import registry

        if registry().holder_alive(record, self.policy) is not False:
            return False
        # Breakers take turns, and each re-checks that the marker is still the dead holder's
        # (same inode and change time): a successor's fresh marker must never be unlinked.
        breaker = filelock.SoftFileLock(self.marker + ".break")
        try:
            breaker.acquire(timeout=0)
        except filelock.Timeout:
            return False
        try:
            if HolderRecord.read(self.lock_file) != record:
                return False
            st = os.stat(self.marker)
            if (st.st_ino, st.st_ctime_ns) != record.marker:
                return False
            _unlink_quietly(self.marker)
            _unlink_quietly(self.lock_file + HOLDER_SUFFIX)
            from .log import decision

            decision(f"broke the lock {self.lock_file}: its holder ({record.describe()}) is gone")
            return True
        except OSError:
            return False
        finally:
            breaker.release()

    def _holder_text(self) -> str:
        if self.kind not in RECORDED_KINDS:
            return f"held by a live process (find it with `fuser -v {self.lock_file}` on each node)"
        record = HolderRecord.read(self.lock_file)
        return f"held by {record.describe()}" if record else "held by a holder that left no record"

    def _timeout_message(self, timeout: float) -> str:
        record = HolderRecord.read(self.lock_file)
        holder = record.describe() if record else "a holder that left no record"
        clear = f"rm -f {self.marker} {self.lock_file}{HOLDER_SUFFIX}"
        if self.kind in RECORDED_KINDS:
            hint = _scheduler_note(record, self.policy) + \
                f"If that process is gone (a killed or finished job), clear the lock with: {clear}"
        else:
            holder = "a live process (the kernel drops the flock/POSIX locks of dead ones)"
            hint = f"Find it with `fuser -v {self.lock_file}` on each node."
        return (
            f"could not acquire the {self.kind} lock {self.lock_file} within {timeout:g} s; "
            f"it is held by {holder}. {hint} Raise SHAREDFS_WAIT_TIMEOUT to wait longer. "
            f"(Lock kind: {self.choice.reason})"
        )


class FileLockAPI:
    """filelock's public API over :func:`lock`: the base of shims' drop-in replacements.

    Frameworks call their lock class as filelock's (``acquire(timeout=...,
    poll_interval=...)`` returning the lock, ``release(force=...)``, ``is_locked``,
    ``with``); a shim subclass only adapts the constructor to the class it replaces.
    """

    def __init__(self, lock_file: str | os.PathLike[str], timeout: float = -1, mode: int = 0o644) -> None:
        self.lock_file = os.fspath(lock_file)
        self._lock = lock(self.lock_file, timeout=timeout, mode=mode)

    @property
    def is_locked(self) -> bool:
        return self._lock.is_locked

    def acquire(self, timeout: float | None = None, poll_interval: float = 0.05, **_: Any) -> FileLockAPI:
        self._lock.acquire(timeout)
        return self

    def release(self, force: bool = False) -> None:
        self._lock.release(force)

    def __enter__(self) -> FileLockAPI:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock(path: str | os.PathLike[str], timeout: float | None = None, *, kind: str | None = None,
         mode: int = 0o644) -> SharedLock:
    """A lock for ``path`` (the lock file itself) that is correct on its filesystem.

    ``kind`` overrides the policy for this one lock (``flock``, ``posix``, ``soft``, ``lease``).
    """
    from . import runtime

    lock_file = os.path.abspath(os.fspath(path))
    current = runtime.policy(lock=kind) if kind else runtime.policy()
    return SharedLock(lock_file, runtime.choose_lock(lock_file, current), current, timeout=timeout, mode=mode)


def _scheduler_note(record: HolderRecord | None, policy: Policy) -> str:
    """Why a holder on another node that names a Slurm job was not declared dead (empty when not asked)."""
    if record is None or not record.slurm_job or record.node == policy.node_id:
        return ""
    from .runtime import registry

    alive = registry().holder_alive(record, policy)
    if alive is None:
        return (f"Slurm could not be asked whether job {record.slurm_job} still runs (squeue/scontrol missing or "
                "not answering, or the slurm plugin is off), so the lock was waited out instead of broken. ")
    if alive:
        return f"Slurm reports job {record.slurm_job} as still active. "
    return ""


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
