"""Hugging Face ``datasets``: every cache lock goes through :func:`sharedfs.lock`; caches follow the policy.

datasets takes all its locks through ``datasets.utils._filelock.FileLock``
(a ``filelock.FileLock`` = BSD flock), imported by name into ``builder``,
``utils.file_utils`` and ``utils.extract``.  On Lustre without ``-o flock``
that raises "FileSystem does not appear to support flock" (datasets#6395), on
NFS without lockd "[Errno 37] No locks available" (datasets#1672), and on
GPFS / ``localflock`` / ``local_lock`` it silently excludes only one node.
The replacement keeps datasets' own behaviour (long-name hashing, umask-based
mode) and lets the plugins choose the lock kind for each path.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from sharedfs.hookspecs import hookimpl
from sharedfs.log import decision
from sharedfs.policy import Policy
from sharedfs.shim import Shim

#: Modules that bind ``FileLock`` by name at import time.
LOCK_SITES = (
    "datasets.utils._filelock",
    "datasets.utils.filelock",
    "datasets.builder",
    "datasets.utils.file_utils",
    "datasets.utils.extract",
)


class DatasetsShim(Shim):
    name = "datasets"
    target = "datasets"
    distribution = "datasets"
    supported = ">=2.14,<6"  # utils/_filelock.py appeared in 2.14

    def apply(self, module: ModuleType, policy: Policy) -> None:
        original = sys.modules["datasets.utils._filelock"].FileLock
        replacement = make_lock_class(original)
        for site in LOCK_SITES:
            site_module = sys.modules.get(site)
            if site_module is not None and getattr(site_module, "FileLock", None) is original:
                self.patcher.setattr(site_module, "FileLock", replacement)
        self._place_cache(policy)

    def _place_cache(self, policy: Policy) -> None:
        from sharedfs import runtime

        config = sys.modules["datasets.config"]
        if os.environ.get("HF_DATASETS_CACHE"):
            if policy.cache == "node-local":
                decision(f"datasets cache stays at {config.HF_DATASETS_CACHE}: HF_DATASETS_CACHE is set "
                         "(an explicit user setting wins over SHAREDFS_CACHE=node-local)")
            return
        placed = runtime.registry().cache_placement("datasets", policy)
        if placed is None:
            return
        root = Path(placed)
        for name, value in (
            ("HF_DATASETS_CACHE", root),
            ("DOWNLOADED_DATASETS_PATH", root / config.DOWNLOADED_DATASETS_DIR),
            ("EXTRACTED_DATASETS_PATH", root / config.DOWNLOADED_DATASETS_DIR / config.EXTRACTED_DATASETS_DIR),
        ):
            self.patcher.setattr(config, name, value)
        decision(f"datasets cache -> {root} (node-local, {policy.source('cache')})")


def make_lock_class(original: type) -> type:
    """A drop-in for datasets' ``FileLock`` that delegates to :func:`sharedfs.lock`."""

    class SharedFSFileLock:
        __doc__ = f"sharedfs replacement for {original.__module__}.FileLock (lock kind chosen per filesystem)."
        MAX_FILENAME_LENGTH = original.MAX_FILENAME_LENGTH
        hash_filename_if_too_long = original.hash_filename_if_too_long

        def __init__(self, lock_file: str, *args: Any, timeout: float = -1, mode: int | None = None,
                     **kwargs: Any) -> None:
            from sharedfs.locks import lock

            if args:  # filelock's positional signature is (lock_file, timeout=-1, mode=...)
                timeout = args[0]
            if mode is None:
                umask = os.umask(0o666)
                os.umask(umask)
                mode = 0o666 & ~umask
            self.lock_file = original.hash_filename_if_too_long(lock_file)
            self._lock = lock(self.lock_file, timeout=timeout, mode=mode)

        @property
        def is_locked(self) -> bool:
            return self._lock.is_locked

        def acquire(self, timeout: float | None = None, poll_interval: float = 0.05, **_: Any) -> SharedFSFileLock:
            self._lock.acquire(timeout)
            return self

        def release(self, force: bool = False) -> None:
            self._lock.release(force)

        def __enter__(self) -> SharedFSFileLock:
            return self.acquire()

        def __exit__(self, *exc: object) -> None:
            self.release()

    return SharedFSFileLock


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [DatasetsShim()]
