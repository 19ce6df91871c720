"""This process's umask, read without changing it.

``os.umask`` can only be read by setting it: ``old = os.umask(x); os.umask(old)``.  Between
the two calls every other thread of the process creates files under ``x`` -- a DataLoader
worker thread or a download pool writing with mode 0 -- so sharedfs reads the ``Umask:``
line of ``/proc/self/status`` (Linux >= 4.7) and sets-and-restores only where that line is
missing, in the narrowest form it can.
"""

from __future__ import annotations

import os

STATUS = "/proc/self/status"


def current_umask() -> int:
    """The umask in force, without changing it where the kernel reports it."""
    try:
        with open(STATUS, "rb") as status:  # procfs: a small, local, never-blocking read
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o077)  # no Umask: line (Linux < 4.7, no procfs): the racy way, restrictive meanwhile
    os.umask(umask)
    return umask
