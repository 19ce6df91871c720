"""Test tooling that makes one machine fail like a cluster shared filesystem.

* :mod:`~sharedfs.testing.hostilefs` -- a FUSE passthrough filesystem whose
  profiles break locking (``lustre-noflock``, ``nfs-nolock``,
  ``localflock``) or metadata visibility (``lagging``) the way Lustre, GPFS
  and NFS do, plus :func:`mount` to run it from tests;
* :mod:`~sharedfs.testing.preload` -- an LD_PRELOAD library making lock calls
  fail under chosen directories, no FUSE needed;
* :mod:`~sharedfs.testing.nodes` -- processes that act as if they ran on
  different cluster nodes;
* :mod:`~sharedfs.testing.pytest_plugin` -- the ``hostile_mount`` and
  ``fault_preload`` fixtures (load it with
  ``pytest_plugins = ["sharedfs.testing.pytest_plugin"]``).

Standard library only (plus mfusepy inside the FUSE server process).
"""

from __future__ import annotations

from sharedfs.testing.hostilefs import (
    FSTYPE,
    PROFILES,
    FuseUnavailable,
    HostileMount,
    HostileMountError,
    fuse_available,
    is_mounted,
    mount,
)
from sharedfs.testing.nodes import (
    NodeProcess,
    NodeResult,
    NodesTimeout,
    RemoteError,
    assert_all_ok,
    node_env,
    run_on_nodes,
)
from sharedfs.testing.preload import PreloadUnavailable, build_preload, preload_env

__all__ = [
    "FSTYPE",
    "PROFILES",
    "FuseUnavailable",
    "HostileMount",
    "HostileMountError",
    "NodeProcess",
    "NodeResult",
    "NodesTimeout",
    "PreloadUnavailable",
    "RemoteError",
    "assert_all_ok",
    "build_preload",
    "fuse_available",
    "is_mounted",
    "mount",
    "node_env",
    "preload_env",
    "run_on_nodes",
]
