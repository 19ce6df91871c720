"""Choose the lock kind for a path from its filesystem and the ``lock`` setting: the one place a kind is decided.

Correct before fast: a lock that excludes within one node only counts as no lock on a shared path.
"""

from __future__ import annotations

from sharedfs.errors import NoSafeLockError
from sharedfs.types import COHERENT, NODE_LOCAL, FsInfo, LockChoice, Policy, hookimpl

NATIVE = ("flock", "posix")  # cheapest first


@hookimpl(trylast=True)  # the built-in rule: a site plugin's answer comes first
def sharedfs_choose_lock(path: str, fs: FsInfo, policy: Policy) -> LockChoice:
    return decide(fs, policy)


def excludes_everyone(fs: FsInfo, kind: str) -> bool:
    """Whether a ``kind`` lock on ``fs`` excludes every process that can reach the file."""
    state = getattr(fs, kind)
    return state == COHERENT or (not fs.shared and state == NODE_LOCAL)


def decide(fs: FsInfo, policy: Policy) -> LockChoice:
    """The lock kind for a file on ``fs`` under ``policy``, with the reason in one sentence."""
    where = f"{fs.name or fs.kind} ({fs.mount.fstype} at {fs.mount.mount_point})"
    safe = next((kind for kind in NATIVE if excludes_everyone(fs, kind)), None)
    if safe is None and fs.shared and not fs.o_excl_atomic and fs.hard_links is False:
        # An object-store bucket mount: no kind of lock excludes another node there, whatever is asked.
        raise NoSafeLockError(
            f"no lock excludes other nodes on {where}: it has no cluster-wide flock or POSIX lock, no hard links "
            "and no exclusive create; keep locks and caches off it (point the framework's cache variable at "
            "node-local or a shared POSIX filesystem, or set SHAREDFS_CACHE=node-local)")
    if policy.lock != "auto":
        requested = policy.lock
        if requested not in NATIVE or excludes_everyone(fs, requested):
            return _choice(requested, f"{policy.source('lock')} asks for {requested}", fs)
        fallback = safe or "soft"
        return _choice(fallback, f"{policy.source('lock')} asks for {requested}, but {requested} on {where} is "
                                 f"{getattr(fs, requested)}; using {fallback} so other nodes are excluded too", fs)
    if safe is not None:
        return _choice(safe, f"{safe} is {'cluster-coherent' if fs.shared else 'reliable'} on {where}", fs)
    why = "; ".join(fs.notes) if fs.notes else "no lock known to exclude across nodes"
    if not fs.o_excl_atomic:
        why += ("; O_EXCL create is not atomic there either, so no lock excludes other nodes: keep caches "
                "on node-local storage (SHAREDFS_CACHE=node-local)")
    return _choice("soft", f"existence lock on {where}: {why}", fs)


def _choice(kind: str, reason: str, fs: FsInfo) -> LockChoice:
    return LockChoice(kind, reason, marker=fs.shared and kind in NATIVE)
