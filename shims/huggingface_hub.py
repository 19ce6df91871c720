"""Hugging Face ``huggingface_hub``: the hub cache's locks go through :func:`sharedfs.lock`.

Every lock the hub takes around its cache (``hf_hub_download`` blobs,
``snapshot_download``, local-dir downloads, the stored-tokens file) is
``huggingface_hub.utils._fixes.WeakFileLock``, a context manager over
``filelock.FileLock`` (BSD flock) in every release from 0.22 (what datasets 3.x
and transformers 4.48 accept) to 2.x.  It falls back to ``SoftFileLock`` only
on filelock's "use SoftFileLock instead" NotImplementedError, so:

* NFS without lockd (ENOLCK) fails every download with "[Errno 37] No locks
  available", whatever the filelock version (datasets#1672);
* GPFS / Lustre ``localflock`` / NFS ``local_lock`` flock excludes one node only;
* a job killed while holding the soft fallback leaves a ``.lock`` that old
  filelock never breaks and new filelock breaks only from the same host:
  every later job logs "Still waiting to acquire lock" forever
  (huggingface_hub#2543).

The replacement takes :func:`sharedfs.lock` (kind chosen per filesystem,
holder records, stale-holder rules of the primitives) and keeps the hub's
contract: ``timeout=None`` waits as long as it takes, a finite timeout raises
``filelock.Timeout``, a failed release is ignored, lock files are mode 0o664
so users sharing a cache can wait on each other's locks.

hub 2.x also locks its shared xet blob store with ``filelock.FileLock`` in
``utils._shared_blobs``; that module's ``FileLock`` name is replaced too.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

from sharedfs._policy import Policy
from sharedfs.hookspecs import hookimpl
from sharedfs.log import decision
from sharedfs.shim import Shim

#: The hub's lock helper; its module is this shim's target (see ``sharedfs._bootstrap.TARGETS``).
FIXES = "huggingface_hub.utils._fixes"
#: hub 2.x: the xet shared-blob store, which uses ``filelock.FileLock`` directly.
SHARED_BLOBS = "huggingface_hub.utils._shared_blobs"
#: The hub's own lock-file mode (2.x): group-writable, so users sharing a cache can wait.
LOCK_MODE = 0o664


class HuggingFaceHubShim(Shim):
    name = "huggingface_hub"
    # huggingface_hub/__init__ imports nothing eagerly (a lazy facade): trigger on the module
    # that defines the lock instead, which also runs before any module binds the name.
    target = FIXES
    distribution = "huggingface_hub"
    # datasets 3.0 accepts hub >= 0.22, transformers 4.48 >= 0.24; WeakFileLock is the one
    # lock helper with the same shape from 0.22 to 2.4 (read in 0.22.0, 0.23.0, 0.24.0,
    # 0.36.0, 1.0.0 and 2.4.0; 0.24 has neither ``timeout=`` nor the soft fallback, 0.36 both).
    supported = ">=0.22,<3"

    def apply(self, module: ModuleType, policy: Policy) -> None:
        original = module.WeakFileLock
        replacement = make_weak_file_lock(original, is_applied=lambda: self.applied)
        self.patcher.setattr(module, "WeakFileLock", replacement)
        # Modules that already bound the name (``from ._fixes import WeakFileLock`` in
        # utils/__init__, file_download, _local_folder...).  Later importers read it from
        # the patched module, and a late binding that outlives ``unpatch`` delegates back.
        for name, loaded in list(sys.modules.items()):
            if name.startswith("huggingface_hub") and getattr(loaded, "__dict__", {}).get("WeakFileLock") is original:
                self.patcher.setattr(loaded, "WeakFileLock", replacement)
        self._patch_shared_blobs()

    def _patch_shared_blobs(self) -> None:
        try:
            blobs = import_module(SHARED_BLOBS)  # stdlib + filelock only: ~1 ms
        except ImportError:
            return  # hub < 2: no shared blob store
        if hasattr(blobs, "FileLock"):
            self.patcher.setattr(blobs, "FileLock", _shared_blob_lock_class(blobs.FileLock))


def make_weak_file_lock(original: Callable[..., Any], is_applied: Callable[[], bool]) -> Callable[..., Any]:
    """A drop-in for the hub's ``WeakFileLock`` context manager built on :func:`sharedfs.lock`."""

    # Name and docstring only: __module__ stays ours, so a patched binding is recognisable.
    @functools.wraps(original, assigned=("__name__", "__qualname__", "__doc__"))
    @contextlib.contextmanager
    def WeakFileLock(lock_file: str | Path, *, timeout: float | None = None) -> Iterator[Any]:
        if not is_applied():  # bound by a module imported while patched, called after unpatch
            with original(lock_file, **({} if timeout is None else {"timeout": timeout})) as inner:
                yield inner
            return
        import filelock

        from sharedfs.errors import LockTimeout
        from sharedfs.locks import lock

        # The hub waits forever by default (and logs every 10 s); a download can take an hour,
        # so no policy timeout here: a dead holder is handled by the stale-lock rules instead.
        shared = lock(str(lock_file), timeout=-1 if timeout is None else timeout, mode=LOCK_MODE)
        decision(f"huggingface_hub locks -> {shared.kind}: {shared.choice.reason}")  # one line per mount
        try:
            shared.acquire()
        except LockTimeout as exc:
            raise filelock.Timeout(str(lock_file)) from exc  # what the hub's callers catch
        try:
            yield shared
        finally:
            try:
                shared.release()
            except OSError:
                pass  # "weak": the hub never fails a download because a release failed

    return WeakFileLock


def _shared_blob_lock_class(original: type) -> type:
    """``filelock.FileLock(path, mode=...)`` as used by ``_shared_blobs``, on :func:`sharedfs.lock`."""

    from sharedfs.locks import FileLockAPI

    class SharedFSFileLock(FileLockAPI):
        __doc__ = f"sharedfs replacement for {original.__module__}.FileLock in {SHARED_BLOBS}."

        def __init__(self, lock_file: str | Path, timeout: float = -1, mode: int = 0o644, **_: Any) -> None:
            super().__init__(lock_file, timeout=timeout, mode=mode)

    return SharedFSFileLock


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [HuggingFaceHubShim()]
