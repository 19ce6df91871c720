"""When a process waiting for a lock says whom it waits for: after REPORT_AFTER seconds, then every REPORT_EVERY.

Two kinds of wait share the schedule, not a loop.  A sharedfs lock's waiter
(:mod:`sharedfs.locks._api`) does not own its loop: filelock's ``acquire`` polls, and sharedfs
makes one attempt per poll, so the schedule is kept per thread between attempts.  A wait for a
lock file held by a program without sharedfs (the torch shim's build baton and build lock
file, :mod:`sharedfs.locks.stock`) is a loop of its own, with a message that says what that
program is and how to clear its file.
"""

from __future__ import annotations

__all__ = ["REPORT_AFTER", "REPORT_EVERY"]

#: A silent hang at 3 a.m. is the worst failure: the first report comes after this many seconds...
REPORT_AFTER = 30.0
#: ... and the next ones this many seconds apart.
REPORT_EVERY = 120.0
