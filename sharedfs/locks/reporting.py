"""When a process waiting for a lock says whom it waits for: after REPORT_AFTER seconds, then every REPORT_EVERY.

A sharedfs lock keeps the schedule per thread between attempts; a wait for a stock lock file loops on its own."""

from __future__ import annotations

__all__ = ["REPORT_AFTER", "REPORT_EVERY"]

#: A silent hang at 3 a.m. is the worst failure: the first report comes after this many seconds...
REPORT_AFTER = 30.0
#: ... and the next ones this many seconds apart.
REPORT_EVERY = 120.0
