"""Explicit collectives: :func:`barrier` and :func:`main_process_first`.

Every rank must call them: a patch that may run on one rank only uses ``makedirs``/``wait_for`` instead.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from sharedfs.errors import SharedFSError

_gloo_group: Any = None


def _torch_dist() -> Any:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def barrier() -> None:
    """Collective: wait until every rank has arrived.

    Uses torch.distributed through a gloo group, so the host-side sync works
    whatever the training backend is (NCCL barriers need a device).  A single
    process returns at once; a multi-rank job without an initialised process
    group cannot synchronise and raises.
    """
    global _gloo_group
    dist = _torch_dist()
    if dist is None:
        from sharedfs.machinery.runtime import identity

        ident = identity()
        if ident.world_size > 1:
            raise SharedFSError(
                f"a barrier needs an initialised torch.distributed process group, but this process is rank "
                f"{ident.rank} of {ident.world_size} ({ident.source}) without one; call "
                "torch.distributed.init_process_group() first, or use the non-collective makedirs/wait_for"
            )
        return
    if dist.get_backend() == "gloo":
        dist.barrier()
        return
    if _gloo_group is None:
        _gloo_group = dist.new_group(backend="gloo")  # itself collective: every rank is here
    dist.barrier(group=_gloo_group)


@contextlib.contextmanager
def main_process_first(*, per_node: bool | None = None) -> Iterator[bool]:
    """Collective: the leader runs the body first, the other ranks after it.

    ``per_node=None`` decides from the cache policy: with a node-local cache
    each node's leader goes first (every node must prepare its own copy); with
    a shared cache only the global leader does.  Yields whether this process is
    a leader.
    """
    from sharedfs.machinery.runtime import identity, policy

    if per_node is None:
        per_node = policy().cache == "node-local"
    ident = identity()
    leader = ident.is_node_leader if per_node else ident.is_leader
    if not leader:
        barrier()
    try:
        yield leader
    finally:
        if leader:
            barrier()
