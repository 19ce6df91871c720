"""Hugging Face ``transformers``: the remote-code module cache is filled once, each file whole, and is the team's.

``AutoConfig.from_pretrained(repo, trust_remote_code=True)`` (and every ``Auto*`` class,
pipelines, ``custom_generate``) copies the repository's ``.py`` files into
``HF_MODULES_CACHE`` (default ``$HF_HOME/modules``) through
``transformers.dynamic_module_utils.get_cached_module_file``, on every rank, and imports
them.  The copy is made in place (``shutil.copyfile``; ``shutil.copy``, which also copies
the mode bits, before 5.x) after an ``exists()``/``filecmp.cmp`` check, and the import is
guarded by a ``threading.Lock`` only, so on a shared filesystem:

* a rank imports a file another rank (another node) is still writing:
  ``AttributeError: module 'transformers_modules....' has no attribute '...'`` on one rank
  of many (TensorRT-LLM PR #17708), a module read empty on NFS (transformers#22555);
* copying the mode bits fails on Lustre: ``PermissionError: [Errno 1] Operation not
  permitted`` (NVIDIA-NeMo/Automodel PR #1840);
* in a lab's shared ``HF_HOME`` (setgid, group-writable) the first user's
  ``transformers_modules/`` and ``<org>/`` directories are 2755 under umask 022, and the next
  user's first model of that organisation fails: ``PermissionError: [Errno 13] Permission
  denied: '.../modules/transformers_modules/<org>/<name>'``.

The shim wraps ``get_cached_module_file`` (in ``dynamic_module_utils`` and in the modules
that bound it by name, ``generation.utils``) and gives ``dynamic_module_utils`` a ``shutil``
whose ``copyfile`` and ``copy`` publish each file whole, once, under a lock on the module's
directory while other ranks wait (:mod:`sharedfs.modulecache.fill`); everything else the
module does -- the checks, the ``__init__.py`` files, the import and its hash -- is
transformers' own.  ``HF_MODULES_CACHE`` is watched as the hub and datasets caches are
(:mod:`sharedfs.cluster.teamfiles`, a code root): in a team cache, what this process creates
there (directories, ``__init__.py``, module files, ``__pycache__``) becomes the group's to read and
to add to -- directories sticky, files never group-writable -- and a root reached through a symlink
another member may have planted is refused.  Before transformers imports from a team cache, what it
will execute is checked (:mod:`sharedfs.modulecache.verify`); a local model's folder only ever gets
the revision its hash names (``_compute_local_source_files_hash``, wrapped to remember it).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable

from sharedfs.cluster import teamfiles
from sharedfs.modulecache import verify
from sharedfs.modulecache.fill import PACKAGES, ShutilView, fill_once, hashing
from sharedfs.types import Policy, RebindingShim, Shim, ShimContext, hookimpl


class TransformersShim(RebindingShim):
    name = "transformers"
    target = "transformers.dynamic_module_utils"
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
