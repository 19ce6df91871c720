"""The harness that makes one machine fail like a cluster: what ``sharedfs demo``, the benchmarks and the tests run.

Importable without pytest (the demo runs without it); the pytest fixtures and the skip rule are
the subpackage :mod:`sharedfs.testing.pytest`.

Filesystems and processes that fail like a cluster's:

* :mod:`~sharedfs.testing.hostilefs` -- a FUSE passthrough filesystem whose
  profiles break locking (``lustre-noflock``, ``nfs-nolock``,
  ``localflock``) or metadata visibility (``lagging``) the way Lustre, GPFS
  and NFS do, plus :func:`mount` to run it;
* :mod:`~sharedfs.testing.realfs` -- real distributed filesystems (JuiceFS, MooseFS, GlusterFS),
  one FUSE client mount per node, started and torn down by :func:`~sharedfs.testing.realfs.volume`;
* :mod:`~sharedfs.testing.preload` -- an LD_PRELOAD library (``preload.c``) making lock calls
  fail under chosen directories, no FUSE needed;
* :mod:`~sharedfs.testing.nodes` -- processes that act as if they ran on
  different cluster nodes;
* :mod:`~sharedfs.testing.slurm` -- a real Slurm cluster of fake nodes on this machine;
* :mod:`~sharedfs.testing.accounts` -- throwaway Unix users in a throwaway group (root only);
* :mod:`~sharedfs.testing.ports` -- TCP ports concurrent runs cannot take from each other;
* :mod:`~sharedfs.testing.frameworkvenv` -- venvs for framework stacks that cannot share the
  main environment, built once;
* :mod:`~sharedfs.testing.shardserver` -- an HTTP server of WebDataset shards that counts GETs;
* :mod:`~sharedfs.testing.remotecode` -- an offline hub cache of remote-code models.

The demo's scenarios (each run without and with sharedfs):

* :mod:`~sharedfs.testing.scenarios` -- the list ``sharedfs demo`` runs, and the smaller ones'
  programs; the larger ones have a module each:
  :mod:`~sharedfs.testing.scenario_makedirs`, :mod:`~sharedfs.testing.scenario_team_modules`,
  :mod:`~sharedfs.testing.scenario_torch` (with ``torch_ext/``),
  :mod:`~sharedfs.testing.scenario_triton`, :mod:`~sharedfs.testing.scenario_modelscope`,
  :mod:`~sharedfs.testing.scenario_megatron`, :mod:`~sharedfs.testing.scenario_tvm_ffi`, and
  :mod:`~sharedfs.testing.olmo_core_job` (with its rank program
  :mod:`~sharedfs.testing.olmo_core_rank` and ``olmo_core_requirements.txt``).

Standard library and sharedfs's own dependencies only; the frameworks are imported by the
programs the scenarios start, mfusepy by the FUSE server process.
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
