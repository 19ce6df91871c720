"""A worker process for lock tests: increments a shared counter under a lock, records hold intervals.

Usage: python lockworker.py LOCKFILE COUNTER ITERATIONS {sharedfs|filelock} OUT.json

Read-modify-write with a pause in between, so two holders at once lose an update;
the hold intervals (start, end on the monotonic clock, CLOCK_MONOTONIC is system-wide)
let the test count overlaps directly, as filelock's own tests do.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    lock_file, counter, iterations, which, out = sys.argv[1:6]
    if which == "filelock":
        import filelock

        lock = filelock.FileLock(lock_file)
    else:
        import sharedfs

        lock = sharedfs.lock(lock_file, timeout=120)
    intervals = []
    for _ in range(int(iterations)):
        with lock:
            start = time.monotonic()
            try:
                with open(counter) as fh:
                    value = int(fh.read() or 0)
            except FileNotFoundError:
                value = 0
            time.sleep(0.002)
            tmp = f"{counter}.{os.getpid()}"
            with open(tmp, "w") as fh:
                fh.write(str(value + 1))
            os.replace(tmp, counter)
            intervals.append((start, time.monotonic()))
    with open(out, "w") as fh:
        json.dump({"intervals": intervals, "kind": getattr(lock, "kind", which)}, fh)


if __name__ == "__main__":
    main()
