"""filelock's contract, as assertions: run against a stock lock class and its sharedfs replacement alike.

Usage: python contract_checks.py CLASS DIR -> one JSON object {check: "ok" | "FAILED: ..."}

CLASS names where the lock class comes from, resolved in *this* process (so with
``SHAREDFS_DISABLE=1`` it is the framework's own class, without it sharedfs's
replacement): ``filelock`` (filelock.FileLock), ``sharedfs`` (sharedfs.lock),
``datasets`` (datasets.utils._filelock.FileLock), ``huggingface_hub``
(huggingface_hub.utils._fixes.FileLock, the class WeakFileLock builds).  The contract
is filelock's documentation: the library defines it, and the same assertions run on both.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable

import filelock

HOLDER = """
import sys, time
sys.path.insert(0, {here!r})
from contract_checks import factory
lock = factory({which!r})({path!r})
lock.acquire()
print("held", flush=True)
sys.stdin.readline()
lock.release()
print("released", flush=True)
"""


def factory(which: str) -> Callable[..., Any]:
    if which == "filelock":
        return filelock.FileLock
    if which == "filelock-threads-share":  # a lock that breaks the contract: shows the checks can fail
        return lambda path, **kw: filelock.FileLock(path, **{"thread_local": False, **kw})
    if which == "sharedfs":
        import sharedfs

        return lambda path, **kw: sharedfs.lock(path, **kw)
    if which == "datasets":
        import datasets.utils._filelock as module

        return module.FileLock
    if which == "huggingface_hub":
        import huggingface_hub.utils._fixes as module

        return module.FileLock
    raise ValueError(which)


class Holder:
    """Another process holding the same lock file through the same class."""

    def __init__(self, which: str, path: str) -> None:
        code = HOLDER.format(here=os.path.dirname(os.path.abspath(__file__)), which=which, path=path)
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout.readline().strip() == "held"

    def release(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "released"
        self.proc.wait(timeout=30)


def check_nonblocking_and_zero_timeout_return_at_once(make: Callable[..., Any], which: str, d: str) -> None:
    path = os.path.join(d, "nb.lock")
    holder = Holder(which, path)
    try:
        lock = make(path, timeout=10)
        for kwargs in ({"blocking": False}, {"timeout": 0}):
            start = time.monotonic()
            try:
                lock.acquire(**kwargs)
            except filelock.Timeout:
                pass
            else:
                raise AssertionError(f"acquire({kwargs}) got a lock another process holds")
            assert time.monotonic() - start < 1.0, f"acquire({kwargs}) waited {time.monotonic() - start:.1f} s"
    finally:
        holder.release()


def check_negative_timeout_waits_until_released(make: Callable[..., Any], which: str, d: str) -> None:
    path = os.path.join(d, "wait.lock")
    holder = Holder(which, path)
    releaser = threading.Timer(1.0, holder.release)
    releaser.start()
    start = time.monotonic()
    lock = make(path, timeout=-1)
    lock.acquire()
    waited = time.monotonic() - start
    lock.release()
    releaser.join()
    assert waited >= 0.9, f"got the lock after {waited:.2f} s, while the holder held it for 1 s"


def _timeout_while_held(make: Callable[..., Any], which: str, path: str, timeout: float) -> tuple[Any, Any]:
    """(the lock, the Timeout its acquire raised) while another process holds ``path``."""
    holder = Holder(which, path)
    try:
        lock = make(path)
        try:
            lock.acquire(timeout=timeout)
        except filelock.Timeout as exc:
            return lock, exc
        raise AssertionError("no Timeout")
    finally:
        holder.release()


def check_timeout_error_is_filelocks_with_lock_file_and_pickles(make: Callable[..., Any], which: str, d: str) -> None:
    lock, error = _timeout_while_held(make, which, os.path.join(d, "err.lock"), 0.1)
    assert isinstance(error, TimeoutError)
    assert os.path.abspath(error.lock_file) == os.path.abspath(lock.lock_file)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and again.lock_file == error.lock_file and str(again) == str(error)


def check_reentrant_counter_and_force_release(make: Callable[..., Any], which: str, d: str) -> None:
    lock = make(os.path.join(d, "re.lock"))
    with lock:
        with lock:
            assert lock.is_locked and lock.lock_counter == 2
        assert lock.is_locked and lock.lock_counter == 1
    assert not lock.is_locked and lock.lock_counter == 0
    lock.acquire()
    lock.acquire()
    lock.release(force=True)
    assert not lock.is_locked and lock.lock_counter == 0


def check_with_acquire_releases(make: Callable[..., Any], which: str, d: str) -> None:
    path = os.path.join(d, "wa.lock")
    lock = make(path)
    with lock.acquire():
        assert lock.is_locked
    assert not lock.is_locked and lock.lock_counter == 0
    other = make(path)
    other.acquire(timeout=0)  # nobody holds it any more
    other.release()


def check_context_manager_returns_the_lock(make: Callable[..., Any], which: str, d: str) -> None:
    lock = make(os.path.join(d, "cm.lock"))
    with lock as entered:
        assert entered is lock


def check_threads_do_not_share_a_hold_by_default(make: Callable[..., Any], which: str, d: str) -> None:
    lock = make(os.path.join(d, "th.lock"))
    assert lock.is_thread_local()
    outcome: list[str] = []

    def other() -> None:
        try:
            lock.acquire(timeout=0.2)
        except filelock.Timeout:
            outcome.append("timeout")
        else:
            outcome.append("acquired")
            lock.release()

    with lock:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert outcome == ["timeout"], f"a second thread {outcome} a held thread-local lock"


def _interrupting(lock: Any, at: int | None, error: Callable[[], BaseException] = KeyboardInterrupt
                  ) -> Callable[..., Any]:
    """A profile hook that counts the calls handed ``lock`` and raises ``error()`` at call number ``at``.

    It stands for a signal handler that raises (SIGINT, or a job's SIGTERM handler): the exception
    lands between two steps of an acquire or a release.  The count is kept on the hook.
    """
    def hook(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and any(value is lock for value in frame.f_locals.values()):
            hook.calls += 1  # type: ignore[attr-defined]
            if hook.calls == at:  # type: ignore[attr-defined]
                hook.raised = error()  # type: ignore[attr-defined]
                raise hook.raised  # type: ignore[attr-defined]

    hook.calls = 0  # type: ignore[attr-defined]
    hook.raised = None  # type: ignore[attr-defined]
    return hook


def _run_interrupted(lock: Any, operation: Callable[[], Any], at: int | None,
                     error: Callable[[], BaseException] = KeyboardInterrupt) -> int:
    hook = _interrupting(lock, at, error)
    sys.setprofile(hook)
    try:
        operation()
    except BaseException as exc:
        if exc is not hook.raised:  # type: ignore[attr-defined]  # only the error the hook raised is expected
            raise
    finally:
        sys.setprofile(None)
    return hook.calls  # type: ignore[attr-defined]


def _free(make: Callable[..., Any], path: str) -> bool:
    """Whether a new lock object, in another thread, gets the lock at once."""
    got: list[bool] = []

    def probe() -> None:
        peer = make(path)
        try:
            peer.acquire(timeout=0)
        except filelock.Timeout:
            got.append(False)
        else:
            got.append(True)
            peer.release()

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return got == [True]


def check_release_interrupted_anywhere_then_retried_frees_the_lock(make: Callable[..., Any], which: str,
                                                                   d: str) -> None:
    path = os.path.join(d, "int-release.lock")
    lock = make(path)
    lock.acquire()
    points = _run_interrupted(lock, lock.release, None)
    assert points > 0 and _free(make, path)
    for at in range(1, points + 1):
        lock = make(path)
        lock.acquire()
        _run_interrupted(lock, lock.release, at)
        lock.release()  # the caller's retry (a with block's exit runs once; code that retries runs this)
        assert _free(make, path), f"an interrupt at call {at} of {points} in release() left the lock held"


def check_acquire_interrupted_anywhere_leaves_one_holder_or_none(make: Callable[..., Any], which: str,
                                                                 d: str) -> None:
    path = os.path.join(d, "int-acquire.lock")
    lock = make(path)
    points = _run_interrupted(lock, lock.acquire, None)
    lock.release()
    assert points > 0
    for at in range(1, points + 1):
        lock = make(path)
        _run_interrupted(lock, lock.acquire, at)
        # The object says it holds the lock exactly when nobody else can take it.
        free = _free(make, path)
        assert lock.is_locked != free, (f"an interrupt at call {at} of {points} in acquire(): "
                                        f"is_locked={lock.is_locked} and free for others={free}")
        lock.release(force=True)


def _signal_handlers_oserror() -> OSError:
    return OSError(errno.EIO, "raised by a signal handler")


def check_a_release_that_raised_never_nests_into_a_lock_others_can_take(make: Callable[..., Any], which: str,
                                                                       d: str) -> None:
    """An errno-bearing error out of release() leaves it unknown whether the kernel let go (a signal
    handler's error after the unlock, or the unlock's own).  While the object still reports the hold,
    acquire() on it must refuse (filelock >= 4.3: RuntimeError until release() is retried,
    tox-dev/filelock#1098) or nest into a hold the kernel really keeps: never into a lock another
    lock object can take meanwhile (two holders).  A retried release() frees the lock."""
    path = os.path.join(d, "uncertain.lock")
    lock = make(path)
    lock.acquire(timeout=5)
    points = _run_interrupted(lock, lock.release, None)
    assert points > 0 and _free(make, path)
    for at in range(1, points + 1):
        lock = make(path)
        lock.acquire(timeout=5)
        _run_interrupted(lock, lock.release, at, _signal_handlers_oserror)
        if lock.is_locked:
            try:
                lock.acquire(timeout=0)
            except RuntimeError:
                pass  # refused until release() is retried
            else:
                others_could_take_it = _free(make, path)
                lock.release()
                assert not others_could_take_it, (f"an OSError at call {at} of {points} in release(): acquire() "
                                                  "nested into a hold that another lock object could take")
        lock.release()  # the caller's retry (a no-op once nothing is held)
        for _ in range(2):
            if lock.is_locked:
                lock.release()
        assert not lock.is_locked and _free(make, path), f"an OSError at call {at} of {points} in release(): " \
                                                         "retried releases left the lock held"


def check_on_acquired_is_never_handed_a_hard_link_others_could_plant(make: Callable[..., Any], which: str,
                                                                    d: str) -> None:
    """filelock >= 4.3 (tox-dev/filelock#1118): with an ``on_acquired`` callback, a lock file that has
    another hard link in a directory other accounts can write is refused (PermissionError), so the
    callback never writes through a planted link into another file; once the extra name is gone the
    callback gets the lock.  (An existence lock hands the callback its own marker, never the lock
    file: nothing to refuse.)  Without a callback hard-linked names share the lock (not checked here)."""
    calls: list[int] = []
    private = os.path.join(d, "links-private")
    os.mkdir(private, 0o700)
    try:
        probe = make(os.path.join(private, "probe.lock"), timeout=0, on_acquired=calls.append)
    except TypeError:
        return  # filelock < 3.30 has no on_acquired: nothing is handed the descriptor
    with probe:
        pass
    if not calls:
        return  # the class drops the option (a subclass's **kwargs on filelock < 3.30, filelock#628)
    shared = os.path.join(d, "links-shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)  # as /tmp: every account may add names
    victim = os.path.join(shared, "victim")
    with open(victim, "wb") as out:
        out.write(b"keep me")
    path = os.path.join(shared, "linked.lock")
    os.link(victim, path)
    calls.clear()

    def write_holder(fd: int) -> None:
        calls.append(fd)
        os.write(fd, b"holder metadata")

    lock = make(path, timeout=0, on_acquired=write_holder)
    try:
        lock.acquire()
    except PermissionError as exc:
        assert "hard link" in str(exc), str(exc)
        assert not lock.is_locked and calls == [], (lock.is_locked, calls)
    else:
        lock.release()
    with open(victim, "rb") as back:
        kept = back.read()
    assert kept == b"keep me", f"on_acquired wrote through the lock file's other hard link into another file: {kept!r}"
    os.unlink(victim)
    calls.clear()
    with lock:
        assert len(calls) == 1


def check_timeout_message_is_filelocks(make: Callable[..., Any], which: str, d: str) -> None:
    _, error = _timeout_while_held(make, which, os.path.join(d, "msg.lock"), 0)
    assert re.match(r"The file lock '.*' could not be acquired", str(error)), str(error)


def check_a_missing_directory_is_created(make: Callable[..., Any], which: str, d: str) -> None:
    path = os.path.join(d, "not", "yet", "there.lock")
    lock = make(path, timeout=5)
    start = time.monotonic()
    with lock:
        assert lock.is_locked and os.path.isdir(os.path.dirname(path))
    assert time.monotonic() - start < 2.0, f"took {time.monotonic() - start:.1f} s"


def check_properties_and_constructor_options(make: Callable[..., Any], which: str, d: str) -> None:
    path = os.path.join(d, "props.lock")
    lock = make(path, timeout=5, mode=0o664, thread_local=False, blocking=True, poll_interval=0.01)
    assert lock.timeout == 5 and lock.mode == 0o664 and not lock.is_thread_local() and lock.blocking
    lock.timeout = 7
    assert lock.timeout == 7
    assert os.path.abspath(lock.lock_file) == os.path.abspath(path)


CHECKS = [value for name, value in sorted(globals().items()) if name.startswith("check_")]


def main() -> None:
    which, directory = sys.argv[1], sys.argv[2]
    make = factory(which)
    results = {}
    for check in CHECKS:
        try:
            check(make, which, directory)
        except Exception as exc:  # noqa: BLE001 - every failure is a line of the report
            results[check.__name__] = f"FAILED: {type(exc).__name__}: {exc} | {traceback.format_exc(limit=2)}"
        else:
            results[check.__name__] = "ok"
    made = type(make(os.path.join(directory, "class.lock")))
    print(json.dumps({"class": f"{made.__module__}.{made.__qualname__}", "results": results}))


if __name__ == "__main__":
    main()
