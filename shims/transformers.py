"""Hugging Face ``transformers``: the remote-code module cache is filled once, each file whole, and is the team's.

Stock copies in place on every rank, so ranks import half-written modules (docs/frameworks/transformers.md).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable

from sharedfs.types import (
    PACKAGES,
    Policy,
    RebindingShim,
    Shim,
    ShimContext,
    ShutilView,
    fill_once,
    hashing,
    hookimpl,
    teamfiles,
    verify,
)


class TransformersShim(RebindingShim):
    name = "transformers"
    distribution = "transformers"
    # get_cached_module_file copies with the module's `shutil` (copy in 4.57.1 and 5.0.0, copyfile in 5.24.0)
    # after exists()/filecmp checks, and HF_MODULES_CACHE is a module global, in every release read (4.57.1,
    # 5.0.0, 5.24.0); tested with 5.24.0.
    supported = ">=4.57,<6"
    function = "get_cached_module_file"
    package = "transformers"  # transformers.generation.utils binds it by name

    def replacement(self, original: Callable[..., Any], policy: Policy) -> Callable[..., Any]:
        module = sys.modules[original.__module__]  # transformers.dynamic_module_utils, being patched

        def check(found: str) -> None:
            verify.check_import(module.HF_MODULES_CACHE, found, module.get_relative_imports)

        return fill_once(original, check)

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        super().apply(module, policy, context)
        self.patcher.setattr(module, "shutil", ShutilView(policy, module.shutil))
        # 5.x names a local model's folder by this hash: a fill checks what it copies against it.
        if hasattr(module, "_compute_local_source_files_hash"):
            self.patcher.setattr(module, "_compute_local_source_files_hash",
                                 hashing(module._compute_local_source_files_hash))
        teamfiles.watch(module.HF_MODULES_CACHE, policy, self.patcher, code=PACKAGES)


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [TransformersShim()]
