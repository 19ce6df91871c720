"""The field failures ``sharedfs demo`` reproduces, each run without and then with sharedfs; the tests run them too.

:mod:`~sharedfs.demo.scenarios.registry` (:data:`SCENARIOS`, in order), :mod:`~sharedfs.demo.scenarios.sim`
(the simulated cluster, outcomes, skips), and one module per group: :mod:`~sharedfs.demo.scenarios.flock`,
:mod:`~sharedfs.demo.scenarios.lag`, :mod:`~sharedfs.demo.scenarios.holders`, :mod:`~sharedfs.demo.scenarios.shards`,
:mod:`~sharedfs.demo.scenarios.broadcast`, :mod:`~sharedfs.demo.scenarios.frameworks`.
"""

from __future__ import annotations

from .broadcast import broadcast_trap
from .flock import datasets_enolck, datasets_enosys, node_local_flock
from .frameworks import (
    megatron_killed_rank0,
    modelscope_enolck,
    team_modules,
    torch_extension,
    torch_extension_enolck,
    torch_extension_enosys,
    torch_extension_two_nodes,
    tvm_ffi_enolck,
)
from .holders import live_lock, stale_lock
from .lag import makedirs_race, visibility_timeout
from .registry import REFERENCES, SCENARIOS, Scenario
from .shards import triton_cache, webdataset_duplicates, wids_flockless
from .sim import (
    DISTRIBUTIONS,
    FILESYSTEMS,
    OLD_FILELOCK,
    OnRealFS,
    Outcome,
    ScenarioSkipped,
    Sim,
    install_command,
    missing_modules,
    old_filelock_dir,
)

__all__ = [
    "DISTRIBUTIONS",
    "FILESYSTEMS",
    "OLD_FILELOCK",
    "REFERENCES",
    "SCENARIOS",
    "OnRealFS",
    "Outcome",
    "Scenario",
    "ScenarioSkipped",
    "Sim",
    "broadcast_trap",
    "datasets_enolck",
    "datasets_enosys",
    "install_command",
    "live_lock",
    "makedirs_race",
    "megatron_killed_rank0",
    "missing_modules",
    "modelscope_enolck",
    "node_local_flock",
    "old_filelock_dir",
    "stale_lock",
    "team_modules",
    "torch_extension",
    "torch_extension_enolck",
    "torch_extension_enosys",
    "torch_extension_two_nodes",
    "triton_cache",
    "tvm_ffi_enolck",
    "visibility_timeout",
    "webdataset_duplicates",
    "wids_flockless",
]
