"""A chaos-drill worker: increments a shared counter under a lock, forever, until it is killed.

Usage: python chaosworker.py LOCKFILE COUNTER LOG KIND   (KIND: auto, flock, soft, lease, or stock-flock
for filelock's own FileLock, the baseline)

Inside the lock: read the counter, publish counter + 1 by rename, then append one line
``<pid> <start> <end> <value>`` to LOG (monotonic clock, shared by every process of the
machine).  Once started (interpreter, sharedfs, the lock object), it creates ``LOG.ready-<pid>``: the
drill kills only workers that are up, or on a busy machine it would kill them all while they start
and measure nothing.  A worker SIGKILLed between the rename and the append leaves the counter one
ahead of the log, never behind: the log can only have *more* lines than the counter if two
workers held the lock at once (a lost update).
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    lock_file, counter, log, kind = sys.argv[1:5]
    if kind == "stock-flock":
        import filelock

        lock = filelock.FileLock(lock_file)
    else:
        import sharedfs

        lock = sharedfs.lock(lock_file, timeout=-1, kind=None if kind == "auto" else kind)
    out = open(log, "a", buffering=1)
    open(f"{log}.ready-{os.getpid()}", "w").close()  # up: the drill may kill it from now on
    while True:
        with lock:
            start = time.monotonic()
            try:
                with open(counter) as fh:
                    value = int(fh.read() or 0)
            except FileNotFoundError:
                value = 0
            time.sleep(0.003)  # widen the window a second holder would need
            tmp = f"{counter}.{os.getpid()}"
            with open(tmp, "w") as fh:
                fh.write(str(value + 1))
            os.replace(tmp, counter)
            out.write(f"{os.getpid()} {start} {time.monotonic()} {value + 1}\n")


if __name__ == "__main__":
    main()
