"""ModelScope (``modelscope``, ``modelscope-hub``): the hub's download lock gets a kind right for its filesystem.

Its stale locks are broken when the holder is gone, never by age (docs/frameworks/modelscope.md).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import filelock

from sharedfs.types import Policy, Shim, ShimContext, drop_in, hookimpl

#: How often the hub logs that it is still waiting (its own figure).
NOTICE_EVERY = 60.0


class ModelScopeShim(Shim):
    name = "modelscope"
    # `import modelscope_hub` (which modelscope.hub imports) executes this module: it defines the lock.
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
