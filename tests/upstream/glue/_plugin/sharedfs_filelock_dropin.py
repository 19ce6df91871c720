"""pytest plugin (``-p sharedfs_filelock_dropin``) for filelock's own suite, run by tests/upstream/run.py.

Written for this project; it changes no test.  sharedfs never replaces ``filelock.FileLock``
itself: it hands each framework a subclass of the framework's filelock class with sharedfs's
locking in front (``sharedfs.locks.drop_in``; datasets' FileLock is such a subclass of
``filelock.FileLock``).  So that filelock's own tests judge that object, this plugin binds
``filelock.FileLock`` to ``drop_in(filelock.FileLock)`` before the test modules import it --
only when sharedfs is on (not under ``SHAREDFS_DISABLE``, the baseline run).

sharedfs remembers per mount that a native lock failed (ENOSYS, ENOLCK); filelock's tests fake
that failure for one lock, so each test starts from sharedfs's first answer again
(``sharedfs.machinery.choices.forget``), as a fresh process would.
"""

from __future__ import annotations

import os

import filelock

_ON = not os.environ.get("SHAREDFS_DISABLE")

if _ON:
    import sharedfs
    from sharedfs.locks import drop_in

    filelock.FileLock = drop_in(filelock.FileLock, sharedfs.policy(), "sharedfs.locks")


def pytest_runtest_setup(item):  # noqa: ARG001 - pytest's hook signature
    if _ON:
        from sharedfs.machinery import choices
        choices.forget()
