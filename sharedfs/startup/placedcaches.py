"""Exporting the placed-cache table's decisions (:mod:`sharedfs.model.caches`) into this process's environment.

Run when sharedfs activates (the first import of a framework it patches, Triton's included),
before that framework's code reads its variable, so the library and every process it starts
(compiler workers, ninja, ``torch.compile`` subprocesses) use the placed directory.  A
variable already set is left alone: the user's own value (one log line says what sharedfs would
have done), or the same placement inherited from a parent process (nothing to say).  What is
exported here is exactly what ``sharedfs env`` prints, and :func:`restore` takes it back
(:func:`sharedfs.disable`).
"""

from __future__ import annotations

import os
import threading

from sharedfs.errors import SharedFSError
from sharedfs.machinery import choices
from sharedfs.machinery.log import decision
from sharedfs.model.caches import PLACED_CACHES, PlacedCache
from sharedfs.model.policy import CachePlacement, Policy

_lock = threading.Lock()
#: variable -> the value this process exported (restored only while it still holds that value).
_exported: dict[str, str] = {}
_placed_for: Policy | None = None


def rows(policy: Policy) -> list[tuple[PlacedCache, CachePlacement | None, str | None]]:
    """Each row that applies under ``policy``, what the plugins decide for it now, and its problem if any."""
    out: list[tuple[PlacedCache, CachePlacement | None, str | None]] = []
    for row in PLACED_CACHES:
        if policy.shim_disabled(row.name):  # SHAREDFS_DISABLE=triton: Triton is left entirely alone
            continue
        try:
            out.append((row, choices.placed_cache(row, policy, create=False), None))
        except SharedFSError as exc:  # an unsafe node-local root: nothing is placed, the reason says why
            out.append((row, None, str(exc)))
    return out


def exports(policy: Policy) -> dict[str, str]:
    """The variables to export (unset ones the plugins placed): what ``sharedfs env`` prints."""
    return {row.variable: placed.path for row, placed, _ in rows(policy) if placed is not None and placed.path}


def place(policy: Policy) -> None:
    """Export every placed row's variable once per policy; log each decision once."""
    global _placed_for
    with _lock:
        if _placed_for == policy:
            return
        restore_locked()
        _placed_for = policy
        for row, placed, problem in rows(policy):
            user_value = os.environ.get(row.variable)
            if problem is not None:
                decision(f"{row.name} cache not placed: {problem}")
            elif placed is not None and placed.path:
                os.environ[row.variable] = placed.path
                _exported[row.variable] = placed.path
                decision(f"{row.name} cache -> {placed.path} ({row.variable}): {placed.reason}")
            elif user_value:
                would = choices.placed_cache(row, policy, create=False, user_value=None)
                if would.path and would.path != user_value:  # equal: a parent process's export, inherited
                    decision(f"{row.variable}={user_value} is set and left as it is; sharedfs would have used "
                             f"{would.path} ({would.reason})")


def restore() -> None:
    """Unset what :func:`place` exported, where it still holds the exported value."""
    global _placed_for
    with _lock:
        restore_locked()
        _placed_for = None


def restore_locked() -> None:
    while _exported:
        variable, value = _exported.popitem()
        if os.environ.get(variable) == value:
            del os.environ[variable]
