"""Exceptions raised by sharedfs.  Every message says what was wrong, where, and what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._errorbase import SharedFSError

if TYPE_CHECKING:
    from ._timeout import LockTimeout

__all__ = ["ConfigError", "LockTimeout", "SharedFSError", "UnsafeDirectoryError", "WaitTimeout"]


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


def __getattr__(name: str) -> Any:  # PEP 562
    # LockTimeout subclasses filelock.Timeout, and importing filelock costs ~44 M instructions
    # (12 ms): a torch, webdataset or mmengine process that never takes a sharedfs lock never
    # imports it.  Its home is sharedfs._timeout; it pickles and prints as sharedfs.errors'.
    if name == "LockTimeout":
        from ._timeout import LockTimeout

        return LockTimeout
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
