"""Hugging Face ``diffusers``: its remote-code module cache is filled once, each file whole, and is the team's.

``diffusers.utils.dynamic_modules_utils.get_cached_module_file`` (custom pipelines and
``trust_remote_code`` components: ``DiffusionPipeline.from_pretrained(..., custom_pipeline=...)``,
``AutoModel``) copies module files into ``HF_MODULES_CACHE`` -- the cache transformers uses,
under ``diffusers_modules/`` -- with ``shutil.copyfile``, in place, on every rank; a local module is
copied again on every load, into one ``diffusers_modules/local/`` shared by every local model.
So ranks import files other ranks are rewriting, and in a lab's shared ``HF_HOME`` the second
user cannot add to, or rewrite, what the first user's umask made (diffusers#1517, diffusers#9798).

The shim applies what the transformers shim applies (:mod:`sharedfs.modulecache.fill`): each copy
published whole under a lock on its directory, a file already holding the same content left alone
(no rewrite per load), the mode from the umask, ``HF_MODULES_CACHE`` watched as a team cache
(:mod:`sharedfs.cluster.teamfiles`, a code root: ``local/`` is sticky, module files are the group's
to read, never to write), and what diffusers will import checked first
(:mod:`sharedfs.modulecache.verify`).
"""

from __future__ import annotations

from types import ModuleType

from sharedfs.cluster import teamfiles
from sharedfs.modulecache import verify
from sharedfs.modulecache.fill import PACKAGES, ShutilView, fill_once
from sharedfs.types import Policy, Shim, ShimContext, hookimpl


class DiffusersShim(Shim):
    name = "diffusers"
    target = "diffusers.utils.dynamic_modules_utils"
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
