"""This process's umask, read without changing it (from ``/proc/self/status``: setting it races every other thread)."""

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
