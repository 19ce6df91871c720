"""Is a holder on *this* machine still alive?  Answered only from unambiguous local evidence.

A pid means something only inside the kernel boot and PID namespace that issued
it, so the record must name this node, this boot (``boot_id``) and this PID
namespace; then the holder is dead when its pid is gone or now belongs to a
process that started at another time.  Anything less (another node, another
namespace, a record without that evidence, a node name this process cannot vouch
for) is "cannot tell": the ``slurm`` plugin or the lease decides instead.

Runs before the other liveness plugins (``tryfirst``): it is exact and costs two
system calls.  A lease is judged here too, and only by its expiry: its holder renews the
record while it holds the lock, so a record its waiter has watched unchanged for a whole
lease is gone, wherever its holder ran.

The last answer (``trylast``, after the scheduler): a shard-cache record -- a reader's
in-use marker, a download claim -- whose holder nobody could vouch for counts as gone
:data:`SHARD_RECORD_LIFETIME` after it was written, so a reader on another node that died
without a scheduler to say so cannot pin its shard forever.  Locks never get this answer:
a lock holder nobody can vouch for is waited for, never broken by age.
"""

from __future__ import annotations

import os
import time

from sharedfs.model.records import process_start_time
from sharedfs.types import HolderRecord, Policy, hookimpl

#: Record kinds the shard cache writes (in-use markers and download claims; sharedfs.shardcache).
SHARD_RECORD_KINDS = frozenset({"inuse", "downloading"})
#: How long a shard-cache record nobody can vouch for (another node, no scheduler) counts as alive.
SHARD_RECORD_LIFETIME = 6 * 3600.0


@hookimpl(tryfirst=True)
def sharedfs_holder_alive(record: HolderRecord, policy: Policy, unchanged_for: float | None) -> bool | None:
    if record.kind == "lease" and unchanged_for is not None:
        return unchanged_for < (record.lease_seconds or policy.lease_seconds)
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


@hookimpl(trylast=True, specname="sharedfs_holder_alive")
def sharedfs_holder_alive_shard_record_lifetime(record: HolderRecord) -> bool | None:
    if record.kind in SHARD_RECORD_KINDS and time.time() - record.acquired_at >= SHARD_RECORD_LIFETIME:
        return False
    return None
