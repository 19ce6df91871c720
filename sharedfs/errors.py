"""Exceptions raised by sharedfs.  Every message says what was wrong, where, and what to do."""

from __future__ import annotations


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


class LockTimeout(SharedFSError, TimeoutError):
    """A lock could not be acquired in time; the message names the holder."""


class WaitTimeout(SharedFSError, TimeoutError):
    """:func:`sharedfs.wait_for` gave up; the message says what, where and what to change."""


class UnsafeDirectoryError(SharedFSError, PermissionError):
    """A node-local directory exists but is not safe to use (owner, symlink, mode)."""
