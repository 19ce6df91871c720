"""Hugging Face ``huggingface_hub``: the hub cache's locks get a kind that is correct for their filesystem.

Only the ``FileLock`` name the hub's ``WeakFileLock`` uses is replaced; team caches get group bits.
"""

from __future__ import annotations

import os
from importlib import import_module
from types import ModuleType
from typing import Callable

from sharedfs.types import Policy, Shim, ShimContext, drop_in, hookimpl, teamfiles

#: hub 2.x: the xet shared-blob store, which uses ``filelock.FileLock`` directly.
SHARED_BLOBS = "huggingface_hub.utils._shared_blobs"


class HuggingFaceHubShim(Shim):
    name = "huggingface_hub"
    distribution = "huggingface_hub"
    # datasets 3.0 accepts hub >= 0.22, transformers 4.48 >= 0.24; WeakFileLock builds its lock from
    # _fixes.FileLock in every release from 0.22 to 2.4 (read in 0.22.0, 0.24.0, 0.36.0, 1.0.0, 2.4.0).
    supported = ">=0.22,<3"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        # Applied at the first lock (the usual case: a stand-in waited for it), the hub has already made
        # that download's directories unwatched: they are given to the group once, before the lock.
        catch_up = _made_for_download if context.late else None
        self.patcher.setattr(module, "FileLock", _settling(drop_in(module.FileLock, policy, __name__), catch_up))
        constants = import_module("huggingface_hub.constants")  # _fixes imported it already
        teamfiles.watch(constants.HF_HUB_CACHE, policy, self.patcher)
        try:
            blobs = import_module(SHARED_BLOBS)  # stdlib + filelock only: ~1 ms
        except ImportError:
            return  # hub < 2: no shared blob store
        if hasattr(blobs, "FileLock"):
            self.patcher.setattr(blobs, "FileLock", _settling(drop_in(blobs.FileLock, policy, __name__), catch_up))


def _cache_of(lock_file: str) -> str | None:
    """The hub cache a lock file belongs to: every hub lock is ``<cache>/.locks/<repo>/<name>.lock``."""
    head, sep, _ = lock_file.rpartition(f"{os.sep}.locks{os.sep}")
    return head if sep else None


def _made_for_download(lock_file: str) -> list[str]:
    """What the hub makes before a download's lock: ``.locks/<repo>/``, the repo's folder (``refs/``,
    ``blobs/``, ``snapshots/<commit>/``) and the cache's ``CACHEDIR.TAG`` (hub 1.x and later); given to
    the group only inside a watched team cache."""
    head, sep, rest = lock_file.rpartition(f"{os.sep}.locks{os.sep}")
    if not sep:
        return []
    return [os.path.join(head, ".locks"), os.path.join(head, rest.partition(os.sep)[0]),
            os.path.join(head, "CACHEDIR.TAG")]


def _settling(cls: type, catch_up: Callable[[str], list[str]] | None = None) -> type:
    return teamfiles.settling(cls, team_root=_cache_of, catch_up=catch_up)


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [HuggingFaceHubShim()]
