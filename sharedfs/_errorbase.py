"""The base of every exception sharedfs raises on purpose.

A module of its own so that :mod:`sharedfs._timeout` (``LockTimeout``, which needs filelock)
and :mod:`sharedfs.errors` (which hands ``LockTimeout`` out on first use) both build on it
without importing each other.  Catch it as ``sharedfs.SharedFSError`` or ``sharedfs.errors.SharedFSError``.
"""

from __future__ import annotations


class SharedFSError(Exception):
    """Base class of every error sharedfs raises on purpose."""

    __module__ = "sharedfs.errors"  # where users catch it, and how it pickles
