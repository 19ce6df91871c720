"""Choose the lock kind for a path from its filesystem and the ``lock`` setting.

Correct before fast: a lock that excludes only within one node is treated as
no lock at all on a path other nodes share (GPFS flock: filelock#389; NFS
``local_lock=all``: 2653 overlaps in 2829 acquisitions, claude-swap#372).
"""

from __future__ import annotations

from sharedfs.fsinfo import FsInfo
from sharedfs.hookspecs import hookimpl
from sharedfs._policy import LockChoice, Policy


@hookimpl
def sharedfs_choose_lock(path: str, fs: FsInfo, policy: Policy) -> LockChoice:
    where = f"{fs.kind} ({fs.mount.fstype} at {fs.mount.mount_point})"
    safe = fs.safe_lock()
    if policy.lock != "auto":
        requested = policy.lock
        unsafe = (requested == "flock" and fs.flock != "coherent" and (fs.shared or fs.flock == "absent")) or (
            requested == "posix" and fs.posix != "coherent" and (fs.shared or fs.posix == "absent")
        )
        if not unsafe:
            return LockChoice(requested, f"{policy.source('lock')} asks for {requested}")
        fallback = safe or "soft"
        return LockChoice(
            fallback,
            f"{policy.source('lock')} asks for {requested}, but {requested} on {where} is "
            f"{getattr(fs, requested)}; using {fallback} so other nodes are excluded too",
        )
    if safe is not None:
        return LockChoice(safe, f"{safe} is {'cluster-coherent' if fs.shared else 'reliable'} on {where}")
    why = "; ".join(fs.notes) if fs.notes else "no lock known to exclude across nodes"
    return LockChoice("soft", f"existence lock on {where}: {why}")
