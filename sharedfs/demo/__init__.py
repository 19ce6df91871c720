"""What ``sharedfs demo`` runs from an installed wheel: its scenarios and the filesystems and nodes they fake.

Filesystems: :mod:`~sharedfs.demo.hostilefs` (FUSE fake of Lustre/GPFS/NFS), :mod:`~sharedfs.demo.realfs`
(JuiceFS, MooseFS, GlusterFS), :mod:`~sharedfs.demo.preload` (lock calls fail under chosen directories).
Nodes, users and servers: :mod:`~sharedfs.demo.nodes`, :mod:`~sharedfs.demo.accounts`, :mod:`~sharedfs.demo.ports`,
:mod:`~sharedfs.demo.frameworkvenv`, :mod:`~sharedfs.demo.shardserver`, :mod:`~sharedfs.demo.remotecode`.
Scenarios: :mod:`~sharedfs.demo.scenarios`, :mod:`~sharedfs.demo.scenario_makedirs`,
:mod:`~sharedfs.demo.scenario_team_modules`, :mod:`~sharedfs.demo.scenario_torch`,
:mod:`~sharedfs.demo.scenario_triton`,
:mod:`~sharedfs.demo.scenario_modelscope`, :mod:`~sharedfs.demo.scenario_megatron`,
:mod:`~sharedfs.demo.scenario_tvm_ffi`, :mod:`~sharedfs.demo.olmo_core_job`, :mod:`~sharedfs.demo.olmo_core_rank`.
Never imports pytest or the test suite's harness (tests/harness), which the wheel does not ship.
"""

from __future__ import annotations

from sharedfs.demo.hostilefs import (
    FSTYPE,
    PROFILES,
    FuseUnavailable,
    HostileMount,
    HostileMountError,
    fuse_available,
    is_mounted,
    mount,
)
from sharedfs.demo.nodes import (
    NodeProcess,
    NodeResult,
    NodesTimeout,
    RemoteError,
    assert_all_ok,
    node_env,
    run_on_nodes,
)
from sharedfs.demo.preload import PreloadUnavailable, build_preload, preload_env

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
