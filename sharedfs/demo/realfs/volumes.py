"""A volume of one kind with one client mount per simulated node, torn down on any exit."""

from __future__ import annotations

import os
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator, Optional

from .daemons import _counter, _glusterd, _start_glusterfs, _start_juicefs, _start_moosefs, _wait_serving
from .kinds import PROFILES, RealFSUnavailable, Volume, unavailable
from .reaper import _start_reaper, _State, _teardown


@contextmanager
def volume(kind: str, *, nodes: int = 2, profile: str = "default", workdir: Optional[Path] = None,
           node_local_locks: bool = False) -> Iterator[Volume]:
    """Start a ``kind`` volume with ``nodes`` client mounts; tear it all down on exit.

    ``workdir`` is where its data, logs and mount points go (a new directory inside it; a temporary
    directory by default).  ``node_local_locks`` (MooseFS only) mounts with
    ``mfsnobsdlocks,mfsnoposixlocks``: flock and fcntl exclude only one node's processes, as GPFS
    flock and Lustre ``localflock`` do.  Raises :class:`RealFSUnavailable` when ``kind`` cannot run
    here, :class:`RealFSError` when it fails to start.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    if node_local_locks and kind != "moosefs":
        raise ValueError("node_local_locks is a MooseFS mount option")
    if nodes < 1:
        raise ValueError("a volume needs at least one node")
    reason = unavailable(kind)
    if reason:
        raise RealFSUnavailable(reason)
    t0 = time.monotonic()
    parent = Path(workdir) if workdir is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        server = stack.enter_context(_glusterd(parent)) if kind == "glusterfs" else None
        root = Path(tempfile.mkdtemp(prefix=f"sfs-{kind}-", dir=parent))
        name = f"sfs{os.getpid()}x{next(_counter)}"
        mounts = [root / f"node{i}" for i in range(nodes)]
        for mnt in mounts:
            mnt.mkdir()
        state = _State(remove=[str(root)], path=str(root) + ".state.json")
        state.save()
        reaper = _start_reaper(state)
        vol: Optional[Volume] = None
        try:
            if kind == "juicefs":
                _start_juicefs(state, root, name, mounts, profile)
            elif kind == "moosefs":
                _start_moosefs(state, root, mounts, profile, node_local_locks)
            else:
                assert server is not None
                _start_glusterfs(state, server, root, name, mounts, profile)
            _wait_serving(mounts)
            vol = Volume(kind, profile, tuple(mounts), {"start_s": time.monotonic() - t0}, root)
            yield vol
        finally:
            t1 = time.monotonic()
            _teardown(state)
            os.close(reaper)  # the reaper finds no state file and exits
            if vol is not None:
                vol.timings["stop_s"] = time.monotonic() - t1
