"""Hugging Face ``huggingface_hub``: the hub cache's locks get a kind that is correct for their filesystem.

Every lock the hub takes around its cache (``hf_hub_download`` blobs,
``snapshot_download``, local-dir downloads, the stored-tokens file) goes through
``huggingface_hub.utils._fixes.WeakFileLock``, a context manager that builds a
``filelock.FileLock`` (BSD flock) from the ``FileLock`` name of its own module,
in every release from 0.22 (what datasets 3.x and transformers 4.48 accept) to
2.x.  It falls back to ``SoftFileLock`` only on filelock's "use SoftFileLock
instead" NotImplementedError, so:

* NFS without lockd (ENOLCK) fails every download with "[Errno 37] No locks
  available", whatever the filelock version (datasets#1672);
* GPFS / Lustre ``localflock`` / NFS ``local_lock`` flock excludes one node only;
* a job killed while holding the soft fallback leaves a ``.lock`` that old
  filelock never breaks and new filelock breaks only from the same host:
  every later job logs "Still waiting to acquire lock" forever
  (huggingface_hub#2543).

The shim replaces that one name -- ``FileLock`` in ``_fixes`` -- with filelock's
class behind sharedfs's kinds (:func:`sharedfs.locks.drop_in`).  The hub's own
``WeakFileLock`` keeps running unchanged: its timeout loop, its "Still waiting to
acquire lock on ..." INFO lines every ``FILELOCK_LOG_EVERY_SECONDS``, its
weak release and its 0o664 lock files are exactly upstream's.  hub 2.x also
locks its shared xet blob store with ``filelock.FileLock`` in
``utils._shared_blobs``; that module's ``FileLock`` name is replaced too.

Team caches (a lab's ``HF_HOME`` in a setgid, group-writable directory; see
``plugins/teamcache.py``): the hub makes its lock files 0o664 (huggingface_hub#2580),
but every directory it makes (``blobs/``, ``snapshots/<commit>/``, ``refs/``,
``.locks/<repo>/``) is 2755 under umask 022, so the next member of the group
cannot add a blob, a snapshot or a lock file, and the first download of a new file
fails with ``PermissionError`` on its lock -- or, with sharedfs before this change,
waited for that lock forever.  The hub cache (``HF_HUB_CACHE``, and the cache of a
``cache_dir=`` argument, found from its ``.locks`` directory) is watched
(:mod:`sharedfs.cluster.teamfiles`): what this process creates there is given to the group
-- directories g+rwx and setgid, files g+rw, by descriptor and only this user's --
before each hub lock is tried (the directories the hub made for the download exist
by then) or released (the blob and the snapshot link are in place by then), at
exit, and otherwise within a second.  ``HF_HOME`` itself, with the token files in it, is never touched.
"""

from __future__ import annotations

import os
from importlib import import_module
from types import ModuleType
from typing import Callable

from sharedfs.cluster import teamfiles
from sharedfs.locks import drop_in
from sharedfs.types import Policy, Shim, ShimContext, hookimpl

#: The hub's lock helper; its module is this shim's target (see ``_sharedfs_bootstrap.TARGETS``).
FIXES = "huggingface_hub.utils._fixes"
#: hub 2.x: the xet shared-blob store, which uses ``filelock.FileLock`` directly.
SHARED_BLOBS = "huggingface_hub.utils._shared_blobs"


class HuggingFaceHubShim(Shim):
    name = "huggingface_hub"
    # huggingface_hub/__init__ imports nothing eagerly (a lazy facade): trigger on the module
    # that defines the lock helper instead, which also runs before any module binds it.
    target = FIXES
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
