"""``LockTimeout``, kept apart from :mod:`sharedfs.errors` because it needs filelock.

Importing filelock costs a process ~44 M instructions; :mod:`sharedfs.errors` (which every
activation loads) hands this class out on first use instead (PEP 562).
"""

from __future__ import annotations

from filelock import Timeout as _FilelockTimeout

from ._errorbase import SharedFSError


class LockTimeout(SharedFSError, _FilelockTimeout):
    """A lock could not be acquired in time; the message names the holder and how to clear it.

    A ``filelock.Timeout`` (so code that catches filelock's exception, as every framework
    does, catches this one), with ``.lock_file``; it pickles with its message.
    """

    __module__ = "sharedfs.errors"  # where users catch it, and how it pickles

    def __init__(self, lock_file: str, message: str = "") -> None:
        _FilelockTimeout.__init__(self, lock_file)
        self._message = message or f"The file lock '{lock_file}' could not be acquired."

    def __str__(self) -> str:
        return self._message

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return type(self), (self._lock_file, self._message)
