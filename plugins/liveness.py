"""Is a holder on *this* machine still alive?  Answered only from unambiguous local evidence.

A pid means something only inside the kernel boot and PID namespace that issued
it, so the record must name this node, this boot (``boot_id``) and this PID
namespace; then the holder is dead when its pid is gone or now belongs to a
process that started at another time.  Anything less (another node, another
namespace, a record without that evidence, a node name this process cannot vouch
for) is "cannot tell": the ``slurm`` plugin or the lease decides instead.

Runs before the other liveness plugins (``tryfirst``): it is exact and costs two
system calls.
"""

from __future__ import annotations

import os

from sharedfs.model.records import process_start_time
from sharedfs.types import HolderRecord, Policy, hookimpl


@hookimpl(tryfirst=True)
def sharedfs_holder_alive(record: HolderRecord, policy: Policy) -> bool | None:
    if record.node != policy.node_id or not policy.node_id_trusted or not record.same_process_space():
        return None
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    started = process_start_time(record.pid)
    if record.start_time and started and started != record.start_time:
        return False  # the pid was reused by a new process: the holder is gone
    return True
