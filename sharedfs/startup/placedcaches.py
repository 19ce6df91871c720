"""Exporting the placed-cache table's decisions (:mod:`sharedfs.model.caches`) into this process's environment.

Run when sharedfs activates (the first import of a framework it patches, Triton's included),
before that framework's code reads its variable, so the library and every process it starts
(compiler workers, ninja, ``torch.compile`` subprocesses) use the placed directory.  A
variable already set is left alone: the user's own value (one log line says what sharedfs would
have done), or the same placement inherited from a parent process (nothing to say).  A value
naming another user's node-local directory (``<root>/sharedfs-<uid>/...``, 0700) is not the
user's setting but a parent's export inherited across ``su``/``setpriv``/``subprocess.run(user=...)``:
this process places its own directory instead, as if the variable were unset (the parent's
directory would answer ``PermissionError``).  What is exported here is exactly what ``sharedfs
env`` prints, and :func:`restore` takes it back (:func:`sharedfs.disable`), the inherited value
included.
"""

from __future__ import annotations

import os
import threading

from sharedfs.cluster.nodelocal import made_for_uid
from sharedfs.errors import SharedFSError
from sharedfs.machinery import choices
from sharedfs.machinery.log import decision
from sharedfs.model.caches import PLACED_CACHES, PlacedCache
from sharedfs.model.policy import CachePlacement, Policy

_lock = threading.Lock()
#: variable -> the value this process exported (None: it unset the variable) and the inherited export of another
#: user's it replaced, if any; restored only while the variable still holds what this process left there.
_exported: dict[str, tuple[str | None, str | None]] = {}
_placed_for: Policy | None = None


def rows(policy: Policy) -> list[tuple[PlacedCache, CachePlacement | None, str | None]]:
    """Each row that applies under ``policy``, what the plugins decide for it now, and its problem if any."""
    out: list[tuple[PlacedCache, CachePlacement | None, str | None]] = []
    for row in PLACED_CACHES:
        if policy.shim_disabled(row.name):  # SHAREDFS_DISABLE=triton: Triton is left entirely alone
            continue
        try:
            user_value = None if _other_users(os.environ.get(row.variable)) else True
            out.append((row, choices.placed_cache(row, policy, create=False, user_value=user_value), None))
        except SharedFSError as exc:  # an unsafe node-local root: nothing is placed, the reason says why
            out.append((row, None, str(exc)))
    return out


def _other_users(value: str | None) -> bool:
    """Whether ``value`` names another user's node-local directory: a parent's export, not this user's setting."""
    uid = made_for_uid(value) if value else None
    return uid is not None and uid != os.getuid()


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
            inherited = user_value if _other_users(user_value) else None
            if placed is not None and placed.path:
                os.environ[row.variable] = placed.path
                _exported[row.variable] = (placed.path, inherited)
                instead = f" instead of {inherited} (another user's, inherited)" if inherited else ""
                decision(f"{row.name} cache -> {placed.path} ({row.variable}){instead}: {placed.reason}")
                continue
            if inherited:  # nothing placed, and the library must not use another user's directory: its own default
                del os.environ[row.variable]
                _exported[row.variable] = (None, inherited)
                decision(f"{row.variable}={inherited} is another user's directory, inherited: unset")
            if problem is not None:
                decision(f"{row.name} cache not placed: {problem}")
            elif user_value and not inherited:
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
        variable, (value, replaced) = _exported.popitem()
        if os.environ.get(variable) == value:
            if replaced is not None:
                os.environ[variable] = replaced
            elif value is not None:
                del os.environ[variable]
