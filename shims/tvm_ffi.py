"""tvm-ffi (``apache-tvm-ffi``): the JIT build cache's lock gets a kind right for its filesystem.

tvm-ffi's lock takes any flock error for "held" and waits forever (docs/frameworks/tvm_ffi.md).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from types import ModuleType
from typing import Any

from sharedfs.types import Policy, Shim, ShimContext, decision, hookimpl

log = logging.getLogger("sharedfs")

#: How often tvm-ffi retries its lock (its ``poll_interval`` default): the stock file is polled as often.
POLL = 0.1


class SharedFSBuildLock:
    """In front of ``tvm_ffi.utils.FileLock``: its interface on sharedfs's lock (docs/frameworks/tvm_ffi.md)."""

    #: The policy this class applies (set on the per-policy subclass :func:`build_lock_class` makes).
    policy: Policy
    lock_file_path: str

    def __init__(self, lock_file_path: str) -> None:
        super().__init__(lock_file_path)  # type: ignore[call-arg]  # tvm-ffi's: lock_file_path, _file_descriptor
        self._sharedfs_lock: Any = None  # while held
        self._sharedfs_stock: Any = None
        self._sharedfs_held = False

    def acquire(self) -> bool:
        """One attempt, as tvm-ffi's: False when another holds it (or this instance does already)."""
        import filelock

        if self._sharedfs_held:
            return False
        try:
            self._take(0)
        except filelock.Timeout:
            return False
        return True

    def blocking_acquire(self, timeout: float | None = None, poll_interval: float = POLL) -> bool:
        """Wait for the lock (forever by default, as tvm-ffi waits); ``TimeoutError`` after ``timeout`` seconds."""
        import filelock

        if self._sharedfs_held:
            raise RuntimeError("Lock is already held by this instance.")
        try:
            self._take(-1 if timeout is None else timeout)
        except filelock.Timeout as exc:  # sharedfs's message names the holder: chained
            raise TimeoutError(f"Failed to acquire lock on '{self.lock_file_path}' after {timeout} seconds.") from exc
        return True

    def release(self) -> None:
        if not self._sharedfs_held:
            return
        self._sharedfs_held = False
        stock, self._sharedfs_stock = self._sharedfs_stock, None
        held, self._sharedfs_lock = self._sharedfs_lock, None
        try:
            if stock is not None:
                stock.release()
        finally:
            held.release()
        _idle().setdefault((self.policy, held.lock_file), held)

    def _take(self, timeout: float) -> None:
        from sharedfs.types import lock

        started = time.monotonic()
        # tvm-ffi makes a FileLock per build: this thread's idle sharedfs lock of the file is reused (its kind is
        # known), taken out of the pool while held so that a second instance gets a lock of its own, as in tvm-ffi.
        key = (self.policy, os.path.abspath(self.lock_file_path))  # a relative path: in this working directory
        held = _idle().pop(key, None)
        if held is None:
            held = lock(key[1], timeout=-1, policy=self.policy)
        try:
            held.acquire(timeout=timeout)
        except BaseException:
            _idle().setdefault(key, held)
            raise
        try:
            self._sharedfs_stock = self._hold_stock_file(held, started, timeout)
        except BaseException:
            held.release()
            raise
        self._sharedfs_lock, self._sharedfs_held = held, True

    def _hold_stock_file(self, held_lock: Any, started: float, timeout: float) -> Any:
        """tvm-ffi's own flock of the lock file, beside a sharedfs lock of another kind; None where not needed.

        Where flock fails (ENOLCK, ENOSYS) tvm-ffi without sharedfs never holds the file (it waits forever),
        so there is nothing to exclude it by.
        """
        from sharedfs.errors import LockTimeout
        from sharedfs.types import FLOCK, REPORT_AFTER, REPORT_EVERY, StockLockFile, stock_mechanism

        if held_lock.kind == FLOCK:
            return None  # sharedfs's lock is a flock of this very file: tvm-ffi's own way already
        path = os.path.abspath(self.lock_file_path)
        if stock_mechanism(os.path.dirname(path)) != FLOCK:
            return None
        held = StockLockFile(path, FLOCK)
        report_at = started + REPORT_AFTER
        while not held.try_acquire():
            now = time.monotonic()
            if 0 <= timeout <= now - started:
                raise LockTimeout(path, f"The file lock '{path}' could not be acquired: sharedfs holds its own lock "
                                        "on it, and a tvm-ffi process without sharedfs on this node flocks the file.")
            if now >= report_at:
                report_at = now + REPORT_EVERY
                log.warning("still waiting after %.0f s for %s, flocked by a tvm-ffi build without sharedfs on this "
                            "node (another environment, or SHAREDFS_DISABLE); tvm-ffi waits for it as long",
                            now - started, path)
            time.sleep(POLL)
        return held


class _Idle(threading.local):
    locks: dict[tuple[Policy, str], Any]

    def __init__(self) -> None:
        self.locks = {}


_idle_locks = _Idle()


def _idle() -> dict[tuple[Policy, str], Any]:
    """This thread's unheld sharedfs locks, by policy and lock file."""
    return _idle_locks.locks


_classes: dict[tuple[type, Policy], type] = {}
_classes_lock = threading.Lock()


def build_lock_class(own: type, policy: Policy) -> type:
    """tvm-ffi's ``FileLock`` under ``policy``: :class:`SharedFSBuildLock` in front of ``own`` (isinstance holds)."""
    with _classes_lock:
        made = _classes.get((own, policy))
        if made is None:
            made = type(own.__name__, (SharedFSBuildLock, own), {
                "__module__": __name__, "__qualname__": own.__qualname__, "policy": policy,
                "__doc__": f"sharedfs drop-in for {own.__module__}.{own.__qualname__} in tvm_ffi.cpp.extension: " +
                           (SharedFSBuildLock.__doc__ or ""),
            })
            _classes[(own, policy)] = made
        return made


def _tvm_lock_class(current: type) -> type:
    """tvm-ffi's own class behind ``current`` (a sharedfs class left bound by an earlier activation)."""
    for cls in current.__mro__:
        if not issubclass(cls, SharedFSBuildLock):
            return cls
    return current  # pragma: no cover - build_lock_class always derives from tvm-ffi's class


class TvmFfiShim(Shim):
    name = "tvm_ffi"
    # `import tvm_ffi` imports tvm_ffi.cpp, which executes this module: it binds FileLock at its import.
    distribution = "apache-tvm-ffi"
    # cpp/extension.py with `from tvm_ffi.utils import FileLock` and FileLock(<build_dir>/lock) around each build
    # since 0.1.5 (0.1.0-0.1.4: cpp/load_inline.py); utils/lockfile.py unchanged since.  Read: 0.1.5, 0.1.9, 0.1.12,
    # 0.1.15.post2; tested with 0.1.15.post2 (tests/integration/test_tvm_ffi.py).
    supported = ">=0.1.5,<0.2"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        own = _tvm_lock_class(module.FileLock)
        self.patcher.setattr(module, "FileLock", build_lock_class(own, policy))
        decision("tvm_ffi: JIT build locks (<cache>/<name>_<hash>/lock) are sharedfs's, of the kind chosen for "
                 "the cache's filesystem")


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [TvmFfiShim()]
