"""Exceptions raised by sharedfs.  Every message says what was wrong, where, and what to do."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

__all__ = ["ConfigError", "LockTimeout", "NoSafeLockError", "SharedFSError", "UnsafeDirectoryError", "WaitTimeout"]


class SharedFSError(Exception):
    """Base class of every error sharedfs raises on purpose."""


class ConfigError(SharedFSError, ValueError):
    """A setting has a value sharedfs cannot honour.

    Raised at the first import of a target framework, by :func:`sharedfs.policy`
    and shown by ``sharedfs status``.  ``origin`` names the variable or file key.
    """

    def __init__(self, origin: str, value: object, expected: str, hint: str = "") -> None:
        self.origin = origin
        self.value = value
        self.expected = expected
        message = f"{origin}={value!r} is not valid: expected {expected}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


class WaitTimeout(SharedFSError, TimeoutError):
    """:func:`sharedfs.wait_for` gave up; the message says what, where and what to change."""


class UnsafeDirectoryError(SharedFSError, PermissionError):
    """A node-local directory exists but is not safe to use (owner, symlink, mode)."""


class NoSafeLockError(SharedFSError):
    """Nothing on a path's filesystem can exclude another node (an object-store bucket mount: no cluster
    lock, no hard link, no exclusive create), so sharedfs refuses to lock there rather than pretend.

    Not an ``OSError``: code that treats a lock's ``OSError`` as "no locking here, go on" must not go on.
    """


if TYPE_CHECKING:
    from filelock import Timeout as _FilelockTimeout

    class LockTimeout(SharedFSError, _FilelockTimeout):
        def __init__(self, lock_file: str, message: str = "") -> None: ...


def _lock_timeout() -> type:
    # LockTimeout subclasses filelock.Timeout, and importing filelock costs ~44 M instructions
    # (12 ms): a torch, webdataset or mmengine process that never takes a sharedfs lock never
    # imports it, so the class is built on first use (PEP 562) and then stays this module's
    # attribute: one class, which pickles and prints as sharedfs.errors.LockTimeout.
    from filelock import Timeout as _FilelockTimeout

    class LockTimeout(SharedFSError, _FilelockTimeout):
        """A lock could not be acquired in time; the message names the holder and how to clear it.

        A ``filelock.Timeout`` (so code that catches filelock's exception, as every framework
        does, catches this one), with ``.lock_file``; it pickles with its message.
        """

        def __init__(self, lock_file: str, message: str = "") -> None:
            _FilelockTimeout.__init__(self, lock_file)
            self._message = message or f"The file lock '{lock_file}' could not be acquired."

        def __str__(self) -> str:
            return self._message

        def __reduce__(self):  # type: ignore[no-untyped-def]
            return type(self), (self._lock_file, self._message)

    LockTimeout.__qualname__ = "LockTimeout"
    return LockTimeout


_building = threading.Lock()  # two threads asking at once must get one class, or except clauses miss


def __getattr__(name: str) -> Any:  # PEP 562
    if name == "LockTimeout":
        with _building:
            cls = globals().get("LockTimeout")
            if cls is None:
                cls = globals()["LockTimeout"] = _lock_timeout()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
