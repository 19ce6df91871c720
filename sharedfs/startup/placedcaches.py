"""Exporting the placed-cache table's decisions (:mod:`sharedfs.model.caches`) into this process's environment.

Before the framework reads its variable, so every process it starts inherits it; a user's value is left alone.
"""

from __future__ import annotations

import logging
import os
import threading

from sharedfs.cluster.dirs import makedirs
from sharedfs.cluster.nodelocal import made_for_uid
from sharedfs.errors import SharedFSError, UnsafeDirectoryError
from sharedfs.machinery import choices
from sharedfs.machinery.log import decision
from sharedfs.model.caches import PLACED_CACHES, PlacedCache
from sharedfs.model.policy import CachePlacement, Policy

_lock = threading.Lock()
#: variable -> the value this process exported (None: it unset the variable) and the inherited export of another
#: user's it replaced, if any; restored only while the variable still holds what this process left there.
_exported: dict[str, tuple[str | None, str | None]] = {}
_placed_for: Policy | None = None


def rows(policy: Policy, *, create: bool = False
         ) -> list[tuple[PlacedCache, CachePlacement | None, str | None]]:
    """Each row that applies under ``policy``, what the plugins decide for it now, and its problem if any.

    ``create=True`` makes (or checks) each node-local directory before it is named: what is exported;
    ``create=False`` makes nothing (``sharedfs status``) and still refuses what exists and is not ours.
    """
    out: list[tuple[PlacedCache, CachePlacement | None, str | None]] = []
    for row in PLACED_CACHES:
        if policy.shim_disabled(row.name):  # SHAREDFS_DISABLE=triton: Triton is left entirely alone
            continue
        try:
            user_value = None if _other_users(os.environ.get(row.variable)) else True
            placed = choices.placed_cache(row, policy, create=create, user_value=user_value)
            if create and placed.path and not row.made_by_library and not os.path.isdir(placed.path):
                makedirs(placed.path)  # the library would turn its cache off rather than make it
            out.append((row, placed, None))
        except (SharedFSError, OSError) as exc:  # unsafe, or cannot be made: nothing placed, the reason says why
            out.append((row, None, str(exc)))
    return out


def _other_users(value: str | None) -> bool:
    """Whether ``value`` names another user's node-local directory: a parent's export, not this user's setting."""
    uid = made_for_uid(value) if value else None
    return uid is not None and uid != os.getuid()


def exports(policy: Policy, refused: dict[str, list[str]] | None = None) -> dict[str, str]:
    """The variables to export (unset ones the plugins placed), each directory made or checked: ``sharedfs env``.

    A refused row raises :class:`~sharedfs.UnsafeDirectoryError`, one line naming every variable
    the problem refuses (``refused``: problem -> variables the caller found refused already, e.g. a
    shim's cache): a batch script gets no exports and a non-zero status rather than a partial set
    that would quietly put some caches back in the shared home.
    """
    found = rows(policy, create=True)
    refused = dict(refused or {})
    for problem, variables in _refused(found).items():
        refused[problem] = [*refused.get(problem, []), *variables]
    for problem, variables in refused.items():
        raise UnsafeDirectoryError(f"{', '.join(variables)} not exported: {problem}")
    return {row.variable: placed.path for row, placed, _ in found if placed is not None and placed.path}


def _refused(found: list[tuple[PlacedCache, CachePlacement | None, str | None]]) -> dict[str, list[str]]:
    """problem -> the variables it refused (one unsafe level refuses every row below it: said once)."""
    out: dict[str, list[str]] = {}
    for row, _, problem in found:
        if problem is not None:
            out.setdefault(problem, []).append(row.variable)
    return out


def place(policy: Policy) -> None:
    """Export every placed row's variable once per policy; log each decision once."""
    global _placed_for
    with _lock:
        if _placed_for == policy:
            return
        restore_locked()
        _placed_for = policy
        found = rows(policy, create=True)
        for row, placed, problem in found:
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
            if problem is None and user_value and not inherited:
                _would_have(row, policy, user_value)
        for problem, variables in _refused(found).items():
            decision(f"{', '.join(variables)} left unset (each library uses its own default): {problem}",
                     level=logging.WARNING)


def _would_have(row: PlacedCache, policy: Policy, user_value: str) -> None:
    """One line for a variable the user set: where sharedfs would have put the cache."""
    try:
        would = choices.placed_cache(row, policy, create=False, user_value=None)
    except SharedFSError:
        return  # it would have refused: nothing to suggest
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
