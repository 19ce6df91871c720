"""ModelScope (``modelscope``, ``modelscope-hub``): the hub's download lock gets a kind right for its filesystem.

Every file ``snapshot_download`` / ``model_file_download`` fetches is downloaded by
``modelscope_hub._download.DownloadManager.download_file`` under
``_optional_file_lock(<cache>/.lock/file_<sha256>.lock)``, which builds a
``filelock.FileLock`` (BSD flock) and falls back to ``SoftFileLock`` only on filelock's
"use SoftFileLock instead" message or on ESTALE / ENOENT / EREMOTEIO.  So, with the
cache on a cluster filesystem (modelscope#1778 "100+ stale lock files on our shared
NFS PVC", modelscope#1621, gpustack#3054):

* NFS without lockd (ENOLCK) fails every download with "[Errno 37] No locks available";
* GPFS / Lustre ``localflock`` / NFS ``local_lock`` flock excludes one node only, and two
  nodes download into one cache file at once;
* a soft lock (Lustre without ``-o flock``, through filelock's own fallback or the
  hub's) left by a killed job is broken only by filelock on the holder's own host, and
  by the hub after the lock file is two hours old: every other node waits until the
  hub's lock deadline (``MODELSCOPE_DOWNLOAD_FILE_LOCK_TIMEOUT_SECONDS``, 600 s) and
  fails; a download that is still running past those two hours loses its lock to
  the next job.

The shim replaces ``_optional_file_lock`` in ``modelscope_hub._download`` (looked up
there at each download) with the same loop around filelock's class behind sharedfs's
kinds (:func:`sharedfs.locks.drop_in`): the hub's download deadline, its cancellation
and its "Still waiting to acquire lock" lines are kept; its soft-lock fallbacks and
its removal of a two-hour-old lock file are not, as sharedfs chooses the kind per
filesystem and breaks a lock only when its holder is known to be gone (a dead
process, a lease not renewed, a finished Slurm job), never by age.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import filelock

from sharedfs.locks import drop_in
from sharedfs.types import Policy, Shim, ShimContext, hookimpl

#: How often the hub logs that it is still waiting (its own figure).
NOTICE_EVERY = 60.0


class ModelScopeShim(Shim):
    name = "modelscope"
    # `import modelscope_hub` (which modelscope.hub imports) executes this module: it defines the lock.
    target = "modelscope_hub._download"
    distribution = "modelscope-hub"
    # _optional_file_lock(lock_path, *, enabled[, control]) in 0.4.6 (what modelscope 1.40 accepts), 0.5.0
    # and 0.5.1 (read); tested with 0.5.1 (tests/integration/test_modelscope.py).
    supported = ">=0.4.6,<0.6"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        lock_class = drop_in(filelock.FileLock, policy, __name__)
        self.patcher.setattr(module, "_optional_file_lock", make_optional_file_lock(module, lock_class))


def make_optional_file_lock(module: ModuleType, lock_class: type) -> Callable[..., Any]:
    """The hub's ``_optional_file_lock`` with ``lock_class`` and no fallbacks of its own.

    ``module`` is ``modelscope_hub._download``: its deadline constant, its exception and its
    logger are read from it at each call, as the hub's own function reads them.
    """

    @contextlib.contextmanager
    def _optional_file_lock(lock_path: Path | None, *, enabled: bool = True, control: Any = None) -> Iterator[Any]:
        """sharedfs: modelscope_hub's download lock, of the kind sharedfs chose for its filesystem."""
        if not enabled or lock_path is None:
            yield
            return
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        interval = 0.2 if control is not None else 60  # the hub's: short tries under a deadline, else a minute
        lock = lock_class(str(lock_path), timeout=interval)
        started = time.monotonic()
        next_notice = NOTICE_EVERY
        while True:
            if control is not None:
                _check_deadline(module, control, started, lock_path)
            try:
                lock.acquire(timeout=interval)
            except filelock.Timeout:
                waited = time.monotonic() - started
                if waited >= next_notice:
                    module.logger.info("Still waiting to acquire lock on %s", lock_path)
                    next_notice = waited + NOTICE_EVERY
            else:
                break
        try:
            yield lock
        finally:
            lock.release()

    return _optional_file_lock


def _check_deadline(module: ModuleType, control: Any, started: float, lock_path: Path) -> None:
    """The hub's own checks before each try: cancellation, the download's budget, the lock's deadline."""
    control.check()
    limit = float(module.DOWNLOAD_FILE_LOCK_TIMEOUT_SECONDS)
    if getattr(control, "recovery", None) is not None:
        limit = min(limit, control.recovery.policy.idle_timeout)
    if time.monotonic() - started >= limit:
        raise module._DownloadDeadlineError(f"Download file lock timed out after {limit}s: {lock_path}")


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [ModelScopeShim()]
