"""Is a holder on *this* machine still alive?  Answered only from unambiguous local evidence.

Also judges leases by expiry and, last, shard-cache records by age; locks are never broken by age.
"""

from __future__ import annotations

import os
import time

from sharedfs.types import HolderRecord, Policy, hookimpl, process_start_time

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
