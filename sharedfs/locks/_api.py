"""The filelock-shaped lock: filelock's ``BaseFileLock`` contract, sharedfs's choice of kind.

What sharedfs adds to filelock's contract: docs/architecture.md, "Locks"."""

from __future__ import annotations

import errno
import logging
import os
import random
import threading
import time
import warnings
import weakref
from dataclasses import replace
from typing import Any

import filelock

from sharedfs.cluster import gates
from sharedfs.errors import ConfigError, LockTimeout
from sharedfs.fs import oslocks
from sharedfs.locks import _handover, _marker
from sharedfs.locks._kinds import DEFAULT_MODE, KINDS, Existence, Hold, Native, NativeLockRefused, Target
from sharedfs.locks.reporting import REPORT_AFTER, REPORT_EVERY
from sharedfs.machinery import choices, runtime
from sharedfs.machinery.log import decision
from sharedfs.machinery.standin import unwrap
from sharedfs.model.policy import LockChoice, Policy
from sharedfs.model.records import user_name
from sharedfs.model.settings import LOCK_KINDS

log = logging.getLogger("sharedfs")

#: A node's representative waiter pauses between attempts, doubling from MIN_POLL up to the
#: ``poll_interval`` setting.
MIN_POLL = 0.002


class _Wait(threading.local):
    """One thread's wait for one lock; the class attributes are every thread's starting values."""

    started: float | None = None  # when this thread's current wait began (its first refused attempt)
    report_after = REPORT_AFTER
    next_attempt = 0.0
    pause = MIN_POLL
    missed = False
    gate: int | None = None
    asked = 0.0  # when this wait last asked another node's holders for a turn (_handover)

    def end(self) -> None:
        """Back to the starting values (the gate, if any, is the caller's to keep or leave)."""
        self.started, self.next_attempt, self.pause, self.missed, self.asked = None, 0.0, MIN_POLL, False, 0.0


class _State:
    """Per lock object: the chosen kind, and the holds (by descriptor) of its threads."""

    def __init__(self, lock_file: str, mode: int | None, policy: Policy, owner: str, *, callback: bool = False,
                 marks_uncertain: bool = False) -> None:
        choice = choices.lock_choice(lock_file, policy)
        # The reason names the mount: one line per framework, mount and kind, not per lock.
        unpatched = ("; processes running without sharedfs (stock filelock on the same files) are not excluded "
                     "by it" if choice.kind in ("soft", "lease") else "")
        decision(f"{owner} locks -> {choice.kind}: {choice.reason}{unpatched}")
        self.guard = threading.Lock()
        self.target = Target(lock_file, DEFAULT_MODE if mode is None else mode, policy, choice,
                             choices.team_cache(os.path.dirname(lock_file), policy), explicit_mode=mode,
                             callback=callback)
        #: filelock >= 4.3 refuses a re-entrant acquire after a release whose unlock may or may not have
        #: happened (its context's ``unlock_uncertain``); _release keeps that flag as filelock's own does.
        self.marks_uncertain = marks_uncertain
        self.kind: Native | Existence = KINDS[choice.kind](self.target, runtime.registry().holder_alive)
        #: What the next holder on another node must wait out (None: a mount whose clients cache nothing).
        self.handover = _handover_for(self.target)
        self.holds: dict[int, Hold] = {}
        self.waits = _Wait()  # per thread: when this wait began, next attempt, pause
        #: The lock file was given as a relative path (resolved again by each acquisition).
        self.relative = False
        #: How many threads are in a wait for this lock (``waits.missed``): while none is, an attempt
        #: reads this int instead of the thread-local (~5x dearer), as every uncontended one does.
        self.waiting = 0

    def begin_wait(self, wait: _Wait, now: float) -> None:
        with self.guard:
            self.waiting += 1
        wait.missed, wait.started, wait.report_after = True, now, REPORT_AFTER

    def end_wait(self, wait: _Wait) -> None:
        """This thread's wait is over (acquired, timed out or interrupted); the gate is the caller's."""
        if wait.missed:
            with self.guard:
                self.waiting -= 1
        wait.end()

    def fall_back(self, refused: NativeLockRefused) -> None:
        """The filesystem refused a native lock: ask the plugins again with that evidence."""
        name = errno.errorcode.get(refused.errno or 0, str(refused.errno))
        choices.native_lock_refused(self.target.lock_file, refused.kind, name)
        with self.guard:
            choice = choices.lock_choice(self.target.lock_file, self.target.policy)
            if choice.kind == refused.kind:
                raise refused  # a plugin insists on the refused kind: fail, do not loop
            self.target = replace(self.target, choice=choice)
            self.kind = KINDS[choice.kind](self.target, runtime.registry().holder_alive)


class SharedFSLockMixin:
    """Put in front of a ``filelock.BaseFileLock`` subclass: sharedfs's kinds behind filelock's contract."""

    #: The policy the lock follows (a drop-in class carries its shim's); ``None``: the process's policy.
    _sharedfs_policy: Policy | None = None
    #: Who made the lock, for the log line that says which kind it got ("datasets locks -> soft: ...").
    _sharedfs_owner = "sharedfs"
    #: filelock >= 4 tracks descriptors for forks and signals; older releases read the field only.
    _sharedfs_tracks_fds = hasattr(filelock.BaseFileLock, "_mark_descriptor_owned")
    #: filelock >= 4.2.12 pins each acquisition to the lock file's canonical path (``claim_root``: the
    #: directory resolved when the acquire begins), so a directory change or a retargeted symlink during
    #: the wait or the hold cannot redirect it; sharedfs locks that same path.
    _sharedfs_pins_path = hasattr(filelock.BaseFileLock, "_pin_lock_path")
    #: The acquire after the mixin's in the MRO (filelock's, or the framework class's).
    _sharedfs_next_acquire: Any = filelock.BaseFileLock.acquire

    # -- what sharedfs adds, resolved on first use (constructing a lock costs nothing extra) ----

    def _sharedfs(self, pinned: str | None = None) -> _State:
        """This lock's state: for ``pinned`` (filelock's canonical path of this acquisition), else the lock file."""
        state = self.__dict__.get("_sharedfs_state")
        if state is None:
            given = os.fspath(self.lock_file)  # type: ignore[attr-defined]
            if not given:  # abspath("") is the working directory: fail as opening "" does
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), given)
            context = self._context  # type: ignore[attr-defined]
            mode = getattr(context, "mode", -1)
            policy = self._sharedfs_policy or runtime.policy()
            state = _State(pinned or os.path.abspath(given), None if mode is None or mode < 0 else mode, policy,
                           self._sharedfs_owner,
                           callback=getattr(getattr(self, "_settings", None), "on_acquired", None) is not None,
                           marks_uncertain=hasattr(type(context), "unlock_uncertain"))
            state.relative = not os.path.isabs(given)
            state = self.__dict__.setdefault("_sharedfs_state", state)
            _live.add(self)
        return state

    def _sharedfs_here(self, state: _State, pinned: str | None = None) -> _State:
        """The lock file of this acquisition: filelock's pinned path, or (older filelock) a relative lock file
        resolved in the working directory of each acquisition, as filelock does."""
        path = pinned or os.path.abspath(self.lock_file)  # type: ignore[attr-defined]
        if state.holds or path == state.target.lock_file:
            return state  # held (by another thread of a shared lock): the hold's file it stays
        self.__dict__.pop("_sharedfs_state", None)
        return self._sharedfs(pinned)

    @property
    def choice(self) -> LockChoice:
        """The plugins' choice for this lock: ``.kind`` and ``.reason``."""
        return self._sharedfs().target.choice

    @property
    def kind(self) -> str:
        return self.choice.kind

    @property
    def marker(self) -> str:
        """The existence marker this lock creates while held (existence kinds; native ones on shared filesystems)."""
        return self._sharedfs().target.marker

    # -- filelock's two methods -----------------------------------------------------------------

    def _acquire(self) -> None:
        state = self.__dict__.get("_sharedfs_state")
        if self._sharedfs_pins_path:
            # filelock pinned this acquisition's path before its first attempt (None: a path without a last
            # component, which fails to open); a wait keeps it, so it keeps its state.
            pinned = self._context.claim_root  # type: ignore[attr-defined]
            if state is None:
                state = self._sharedfs(pinned)
            elif pinned is not None and pinned != state.target.lock_file:
                state = self._sharedfs_here(state, pinned)
        elif state is None:
            state = self._sharedfs()
        elif state.relative and not (state.waiting and state.waits.missed):  # a wait keeps the file it began with
            state = self._sharedfs_here(state)
        # Only a waiter pays for the back-off and the node gate (and for reading its thread-local).
        wait = state.waits if state.waiting and state.waits.missed else None
        if wait is not None:
            if time.monotonic() < wait.next_attempt:
                return  # backing off: filelock polls often, the shared filesystem is asked less
            if wait.gate is None and _shared(state):
                gate = gates.try_enter(state.target.lock_file)
                if gate is None:
                    return  # another rank of this node is asking the shared filesystem for both of us
                wait.gate = gate
        while True:  # each refusal removes one native kind from the choice: at most flock, posix, then soft
            try:
                hold = state.kind.try_acquire()
                break
            except NativeLockRefused as refused:
                if not self._sharedfs_may_fall_back():
                    raise refused.__cause__ or refused  # the filesystem's own error, as filelock raises it
                state.fall_back(refused)
            except FileNotFoundError:
                # The lock file's directory is missing.  filelock creates it once per acquire (before
                # 4.2 in the _acquire this method replaces); one that vanishes while the acquire waits
                # fails it, rather than a second lock file being made where the holder's is not.
                directory = os.path.dirname(state.target.lock_file)
                if wait is not None or os.path.isdir(directory):
                    raise
                os.makedirs(directory, exist_ok=True)
        if hold is None:
            self._sharedfs_missed(state, time.monotonic())
            return
        if state.handover is not None:
            try:
                state.handover.arrive()  # what the previous holder wrote is what this one reads
            except _handover.Yield:
                _let_go(hold)  # a waiter on another node asked for a turn
                self._sharedfs_missed(state, time.monotonic())
                return
            except BaseException:
                _let_go(hold)
                raise
        if wait is not None:
            hold.gate, wait.gate = wait.gate, None
            state.end_wait(wait)
        state.holds[hold.fd] = hold  # one dict store: atomic, no guard needed
        try:
            if self._sharedfs_tracks_fds:  # filelock >= 4 tracks descriptors for forks and signals
                identity = hold.identity
                if identity is None:
                    st = os.fstat(hold.fd)
                    identity = (st.st_dev, st.st_ino)
                self._mark_descriptor_owned(hold.fd, identity)  # type: ignore[attr-defined]
            else:  # older releases read the field only
                self._context.lock_file_fd = hold.fd  # type: ignore[attr-defined]
        except BaseException:
            # Interrupted (a signal handler raised) before filelock recorded the hold: nobody would ever
            # release it.  Once recorded, filelock's own rollback releases it through _release.
            if not self.is_locked:  # type: ignore[attr-defined]
                state.holds.pop(hold.fd, None)
                _let_go(hold)
            raise

    def _sharedfs_may_fall_back(self) -> bool:
        """Whether a native lock the filesystem refuses may become an existence lock for this object.

        filelock >= 4.2 fails closed with the filesystem's error when asked to (``fallback_to_soft=False``),
        when the lock file must stay (``preserve_lock_file=True``) or when ``on_acquired`` needs the
        native lock's descriptor; so does sharedfs then.
        """
        settings = getattr(self, "_settings", None)
        return settings is None or (getattr(settings, "fallback_to_soft", True) is not False
                                    and not getattr(settings, "preserve_lock_file", False)
                                    and getattr(settings, "on_acquired", None) is None)

    def _release(self) -> None:
        fd = self._context.lock_file_fd  # type: ignore[attr-defined]
        state = self.__dict__.get("_sharedfs_state") or self._sharedfs()
        # In filelock's order: unlock, then forget the hold, then close.  A signal handler that raises
        # in between leaves a hold that filelock still reports and a retried release completes.
        hold = state.holds.get(fd)
        if hold is not None:
            if state.handover is not None and hold.pid == os.getpid():
                state.handover.depart()  # still held: the next holder learns this node wrote last
            if state.marks_uncertain:
                # As filelock >= 4.3's own _release (tox-dev/filelock#1098): an error raised from here on (a
                # signal handler's, or the unlock's own) may come after the kernel let go.  Until a retried
                # release() settles it, filelock refuses to nest an acquire into a hold that may be gone (two
                # holders otherwise); _mark_descriptor_released clears the flag.
                self._context.unlock_uncertain = True  # type: ignore[attr-defined]
            hold.kind.unlock(hold)
        state.holds.pop(fd, None)
        try:
            if self._sharedfs_tracks_fds:
                self._mark_descriptor_released()  # type: ignore[attr-defined]
            else:
                self._context.lock_file_fd = None  # type: ignore[attr-defined]
        finally:  # even when interrupted here: filelock may count the release as done, and a POSIX lock's
            if hold is not None:  # in-process guard must not stay taken
                try:
                    _close(hold)
                except OSError:
                    # The lock is let go; a failing close (EIO from a FUSE or bind mount, ENOSPC on NFS) is dropped
                    # as filelock's Unix FileLock drops it, unless close_error_policy="raise" (filelock >= 4.2).
                    if getattr(getattr(self, "_settings", None), "close_error_policy", "default") == "raise":
                        raise

    def _sharedfs_missed(self, state: _State, now: float) -> None:
        wait = state.waits
        if not wait.missed:
            state.begin_wait(wait, now)
        if _shared(state):
            # Doubling from MIN_POLL to the poll interval, +-25 %: a release is noticed within 1.25
            # poll intervals, and ranks released by one event do not hit the metadata server in step.
            pause = wait.pause
            wait.next_attempt = now + pause * random.uniform(0.75, 1.25)
            wait.pause = min(pause * 2, state.target.policy.poll_interval)
        handover = state.handover
        if handover is not None and wait.started is not None and now - wait.started >= handover.ask_after \
                and now - wait.asked >= handover.ask_after:
            wait.asked = now
            handover.ask()  # holders on other nodes let go for a turn of this node's
        started = wait.started
        if started is not None and now - started >= wait.report_after:
            # A silent hang at 3 a.m. is the worst failure: say whom we wait for.
            wait.report_after = now - started + REPORT_EVERY
            log.warning("still waiting for %s after %.0f s: %s", state.target.lock_file, now - started,
                        _holder_text(state))

    # -- filelock's public method, with sharedfs's timeout message -------------------------------

    def acquire(self, *args: Any, **kwargs: Any) -> Any:
        if "poll_intervall" in kwargs and kwargs["poll_intervall"] is not None:
            # filelock's deprecation warning names the caller's line (stacklevel=2): from here, that is ours.
            warnings.warn("use poll_interval instead of poll_intervall", DeprecationWarning, stacklevel=2)
            kwargs["poll_interval"] = kwargs.pop("poll_intervall")
        try:
            # The next class's acquire, looked up once per class (drop_in): no super() object per call.
            return self._sharedfs_next_acquire(*args, **kwargs)  # type: ignore[misc]
        except BaseException as exc:  # gave up (timeout, interrupt): this thread's wait is over
            state = self._sharedfs()
            wait = state.waits
            state.end_wait(wait)
            if wait.gate is not None:  # the next rank of this node may ask
                gates.leave(wait.gate)
                wait.gate = None
            if not isinstance(exc, filelock.Timeout) or isinstance(exc, LockTimeout):
                raise
            timeout = kwargs.get("timeout", args[0] if args else None)
            if timeout is None:
                timeout = getattr(self, "timeout", None)
            blocking = kwargs.get("blocking")
            if blocking is None:
                blocking = getattr(self, "blocking", None)
            # filelock's own words first (code may match them), then who holds the lock and what to do.
            message = f"{exc} {_timeout_message(state, timeout, blocking)}"
            raise LockTimeout(self.lock_file, message) from None  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        state = self.__dict__.get("_sharedfs_state")
        kind = state.target.choice.kind if state else "not chosen yet"
        return (f"<sharedfs {type(self).__name__} {self.lock_file} kind={kind} "  # type: ignore[attr-defined]
                f"locked={self.is_locked}>")  # type: ignore[attr-defined]


class SharedFSLock(SharedFSLockMixin, filelock.BaseFileLock):
    """What :func:`sharedfs.lock` returns: a filelock lock whose kind suits its filesystem."""


def _handover_for(target: Target) -> _handover.Handover | None:
    """The handover rule for a lock on a mount whose clients cache metadata (one per lock object)."""
    choice = target.choice
    if not (choice.marker or choice.kind in ("soft", "lease")):
        return None  # a filesystem only this node sees (the plugins chose no marker): nothing to ask
    fs = choices.filesystem(os.path.dirname(target.lock_file) or ".")
    if not fs.shared:
        return None
    settle = _handover.settle_seconds(fs)
    if settle <= 0:
        return None
    return _handover.Handover(target.lock_file, settle, target.policy.node_id, target.mode,
                              target.policy.poll_interval, target.team)


def _close(hold: Hold) -> None:
    """The rest of a release whose lock is let go: its descriptor, and the node gate its wait held."""
    try:
        hold.kind.close(hold)
    finally:
        gate, hold.gate = hold.gate, None
        if gate is not None:
            gates.leave(gate)


def _let_go(hold: Hold) -> None:
    try:
        hold.kind.unlock(hold)
    finally:
        _close(hold)


def _shared(state: _State) -> bool:
    """Whether waiting for this lock costs a shared filesystem operations (native kinds there take the marker)."""
    return state.target.choice.marker or state.target.choice.kind in ("soft", "lease")


def _holder_text(state: _State) -> str:
    seen = _marker.read(state.target.marker)
    if seen is not None and seen.record is not None:
        # The command that answers "is it alive, and may it go?" with the lock's own evidence.
        return f"held by {seen.record.describe()} (see: sharedfs locks {state.target.lock_file})"
    if state.target.choice.kind in ("flock", "posix"):
        here = _native_holder_here(state.target.lock_file)
        if here:
            return f"held by {here} (see: sharedfs locks {state.target.lock_file})"
        return (f"held by a live process on another node (sharedfs locks {state.target.lock_file} there, or "
                f"`fuser -v {state.target.lock_file}` on each node, names it)")
    return "held by a holder that left no record"


def _native_holder_here(lock_file: str) -> str | None:
    """"pid N (user) on this node" for a flock/POSIX lock held on this node (``/proc/locks``), else None."""
    try:
        st = os.stat(lock_file)
    except OSError:
        return None
    found = oslocks.held_here().get((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    if not found:
        return None
    how, pid = found[0]
    try:
        owner = f" ({user_name(os.stat(f'/proc/{pid}').st_uid)})"
    except OSError:
        owner = ""
    return f"pid {pid}{owner} on this node, a {how.lower()} lock"


def _timeout_message(state: _State, timeout: Any, blocking: Any) -> str:
    target = state.target
    seen = _marker.read(target.marker)
    record = seen.record if seen is not None else None
    # A wait without a deadline that still ended was ended by filelock itself (cancel_check, a deadlock check).
    within = "at once (blocking=False)" if blocking is False else f"within {timeout:g} s" if isinstance(
        timeout, (int, float)) and timeout >= 0 else "(the wait was ended before any timeout)"
    if record is not None:
        holder = record.describe()
        hint = (_scheduler_note(record, target.policy) +
                f"Whether it is gone, and why: sharedfs locks {target.lock_file} (run it on node {record.node} "
                f"to decide for a holder there); `sharedfs locks --clear-dead {target.lock_file}` removes it only "
                f"if its holder is provably gone. A plain rm -f {target.marker} breaks it even for a live holder.")
    elif target.choice.kind in ("flock", "posix"):
        here = _native_holder_here(target.lock_file)
        if here:
            holder = f"{here} (the kernel drops the flock/POSIX locks of dead processes)"
            hint = f"See it with: sharedfs locks {target.lock_file}."
        else:
            holder = "a live process on another node (the kernel drops the flock/POSIX locks of dead ones)"
            hint = (f"Run sharedfs locks {target.lock_file} (or `fuser -v {target.lock_file}`) on each node to "
                    "find it.")
    elif seen is not None:
        holder = "a marker without a readable holder record"
        hint = (f"See what it is: sharedfs locks {target.lock_file}. If nobody uses the lock, clear it with: "
                f"rm -f {target.marker}")
    elif target.tampered is not None:
        holder = (f"nobody, but another process removed or replaced this taker's own record file "
                  f"{target.tampered} before it could be linked to the marker")
        hint = (f"Something else changes files in {os.path.dirname(target.marker)}: see what is there with "
                f"ls -la {os.path.dirname(target.marker)} and sharedfs locks {target.lock_file}.")
    else:
        holder = "a holder that released it just now"
        hint = ""
    return (f"sharedfs could not acquire the {target.choice.kind} lock {within}; it is held by {holder}. "
            f"{hint} Raise SHAREDFS_WAIT_TIMEOUT (or the timeout= you passed) to wait longer. "
            f"(Lock kind: {target.choice.reason})")


def _scheduler_note(record: Any, policy: Policy) -> str:
    """Why a recorded holder was not declared dead, in one sentence (empty for a lease: it expires)."""
    if record.kind == "lease":
        return ""
    alive = runtime.registry().holder_alive(record, policy)
    if alive:
        return (f"Slurm reports job {record.slurm_job} as still active. " if record.slurm_job
                else "That process is still running. ")
    if alive is None:
        asked = (f"Slurm could not be asked about job {record.slurm_job} (squeue/scontrol missing or not "
                 "answering, the job id refused, or the slurm plugin off)" if record.slurm_job
                 else "its record names no Slurm job to ask the scheduler about")
        return (f"Nobody could tell whether it is still running: it is on another node or in another PID "
                f"namespace, and {asked}, so the lock was waited out instead of broken. ")
    return ""


# -- making locks --------------------------------------------------------------------------------


def lock(path: str | os.PathLike[str], timeout: float | None = None, *, kind: str | None = None,
         mode: int | None = None, policy: Policy | None = None, **options: Any) -> SharedFSLock:
    """A lock on ``path`` (the lock file itself) that is correct on its filesystem.

    ``timeout=None`` waits up to ``SHAREDFS_WAIT_TIMEOUT``; negative waits forever; ``0``
    tries once.  ``kind`` forces ``flock``, ``posix``, ``soft`` or ``lease`` for this lock
    (a native kind that cannot exclude other nodes there is still replaced, and the reason
    says so).  ``options`` go to ``filelock.BaseFileLock`` (``thread_local``, ``blocking``,
    ``poll_interval``, ...).
    """
    if kind is not None and (kind not in LOCK_KINDS or kind == "auto"):
        raise ConfigError("kind", kind, "flock, posix, soft or lease")
    current = policy or runtime.policy()
    if kind is not None:
        current = replace(current, lock=kind, sources={**current.sources, "lock": "argument kind"})
    if mode is not None:
        options["mode"] = mode
    made = SharedFSLock(os.path.abspath(os.fspath(path)),
                        timeout=current.wait_timeout if timeout is None else timeout, **options)
    made._sharedfs_policy = current
    return made


_drop_ins: weakref.WeakKeyDictionary[type, dict[Policy, type]] = weakref.WeakKeyDictionary()


def drop_in(original: type, policy: Policy, owner: str = __name__) -> type:
    """``original`` (a ``filelock.BaseFileLock`` subclass of a framework) with sharedfs's kinds under ``policy``.

    The framework's own constructor, class attributes and helpers are kept (datasets'
    name hashing and umask-based mode, say); only the locking itself changes.  ``owner``
    (the shim's module) becomes the class's ``__module__``, so ``sharedfs status``, a
    traceback or a debugger shows who replaced the class.
    """
    original = unwrap(original)  # a stand-in waiting for this activation: wrap what it stands for
    per_policy = _drop_ins.setdefault(original, {})
    made = per_policy.get(policy)
    if made is None:
        made = type(original.__name__, (SharedFSLockMixin, original), {
            "__module__": owner,
            "__qualname__": original.__qualname__,
            "__doc__": f"sharedfs drop-in for {original.__module__}.{original.__qualname__}: "
                       "the lock kind is chosen for each file's filesystem.",
            "_sharedfs_policy": policy,
            "_sharedfs_owner": owner.rpartition(".")[2],
            "_sharedfs_tracks_fds": hasattr(original, "_mark_descriptor_owned"),
            "_sharedfs_pins_path": hasattr(original, "_pin_lock_path"),
            "_sharedfs_next_acquire": original.acquire,  # type: ignore[attr-defined]
        })
        per_policy[policy] = made
    return made


# -- fork: a child neither releases nor believes it holds its parent's locks -----------------------

_live: weakref.WeakSet[SharedFSLockMixin] = weakref.WeakSet()


def _forget_holds_in_child() -> None:
    for made in list(_live):
        state = made.__dict__.get("_sharedfs_state")
        if state is None:
            continue
        # filelock >= 4 resets its own state and closes the descriptors it was told about in the
        # child; older releases do neither, so sharedfs does it for them.
        filelock_resets = hasattr(made, "_reset_after_fork_in_child")
        for hold in list(state.holds.values()):
            fds = {hold.fd, hold.marker_fd} - {None}  # sharedfs.cluster.gates drops its own descriptors in a child
            if filelock_resets:
                fds.discard(hold.fd)
            for fd in fds:
                try:
                    os.close(fd)  # a parent's flock survives: its own descriptor still references it
                except OSError:
                    pass
        state.holds.clear()
        state.guard = threading.Lock()
        state.waiting = 0  # the waiting threads were the parent's (the forking thread was not waiting)
        if not filelock_resets:
            context = made._context  # type: ignore[attr-defined]
            context.lock_file_fd = None
            context.lock_counter = 0


os.register_at_fork(after_in_child=_forget_holds_in_child)
