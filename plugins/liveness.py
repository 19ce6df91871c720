"""Is a lock holder on *this* node still alive?  (pid exists and is the same process.)"""

from __future__ import annotations

import os

from sharedfs.hookspecs import hookimpl
from sharedfs.locks import HolderRecord, process_start_time
from sharedfs._policy import Policy


@hookimpl
def sharedfs_holder_alive(record: HolderRecord, policy: Policy) -> bool | None:
    if record.node != policy.node_id:
        return None  # another node's pid means nothing here; the slurm plugin may know
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    started = process_start_time(record.pid)
    if record.start_time and started and started != record.start_time:
        return False  # the pid was reused by a new process: the holder is gone
    return True
