"""Hugging Face ``diffusers``: its remote-code module cache is filled once, each file whole, and is the team's.

The same fill and checks as the transformers shim (docs/frameworks/transformers.md, diffusers).
"""

from __future__ import annotations

from types import ModuleType

from sharedfs.types import PACKAGES, Policy, Shim, ShimContext, ShutilView, fill_once, hookimpl, teamfiles, verify


class DiffusersShim(Shim):
    name = "diffusers"
    distribution = "diffusers"
    # Written for 0.42.1's get_cached_module_file (shutil.copyfile through the module's `shutil`, HF_MODULES_CACHE a
    # module global); no other module binds get_cached_module_file by name.
    supported = ">=0.42,<0.43"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        def check(found: str) -> None:
            verify.check_import(module.HF_MODULES_CACHE, found, module.get_relative_imports)

        self.patcher.setattr(module, "get_cached_module_file", fill_once(module.get_cached_module_file, check))
        self.patcher.setattr(module, "shutil", ShutilView(policy, module.shutil))
        teamfiles.watch(module.HF_MODULES_CACHE, policy, self.patcher, code=PACKAGES)


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [DiffusersShim()]
