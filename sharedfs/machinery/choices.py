"""What the plugins decided, asked once and remembered, so no caller re-derives a rule.

A native lock refused at run time becomes part of the mount's description, and the plugins are asked again.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

from sharedfs.machinery import runtime
from sharedfs.model.caches import PlacedCache, cache_path
from sharedfs.model.fsinfo import FsInfo
from sharedfs.model.mounts import clear_mount_cache, mount_for
from sharedfs.model.policy import CachePlacement, CacheRequest, LockChoice, Policy, TeamCache

if TYPE_CHECKING:  # pragma: no cover
    from sharedfs.machinery.shimbase import Shim

log = logging.getLogger("sharedfs")

MountKey = tuple[int, str]

_lock = threading.Lock()
_filesystems: dict[MountKey, FsInfo] = {}
#: mount -> {lock kind: errno name} for native locks refused at run time.
_refused: dict[MountKey, dict[str, str]] = {}
_by_directory: dict[tuple[str, str, str], LockChoice] = {}


def filesystem(path: str) -> FsInfo:
    """The plugins' classification of the filesystem under ``path`` (which need not exist yet)."""
    mount = mount_for(path)
    key = (mount.mount_id, mount.mount_point)
    with _lock:
        info = _filesystems.get(key)
    if info is None:
        info = runtime.registry().classify_filesystem(mount)
        with _lock:
            info = _filesystems.setdefault(key, info)
    refused = _refused.get(key)
    return info.with_refused(refused) if refused else info


def lock_choice(lock_file: str, policy: Policy) -> LockChoice:
    """The lock kind for ``lock_file`` under ``policy``: the ``sharedfs_choose_lock`` answer, cached."""
    directory = os.path.dirname(lock_file) or "."
    key = (directory, policy.lock, policy.source("lock"))
    choice = _by_directory.get(key)
    if choice is None:
        fs = filesystem(directory)
        choice = runtime.registry().choose_lock(lock_file, fs, policy)
        with _lock:
            _by_directory[key] = choice
    return choice


_teams: dict[tuple[str, str | None], TeamCache | None] = {}


def team_cache(directory: str, policy: Policy) -> TeamCache | None:
    """The ``sharedfs_team_cache`` answer for ``directory`` (or its nearest existing ancestor), cached."""
    key = (directory, policy.shared_group)
    if key not in _teams:
        existing = directory
        while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
            existing = os.path.dirname(existing)
        answer = runtime.registry().team_cache(existing, policy)
        with _lock:
            _teams[key] = answer
    return _teams[key]


def native_lock_refused(lock_file: str, kind: str, errno_name: str) -> None:
    """Remember that ``kind`` locks fail with ``errno_name`` on ``lock_file``'s mount; choose again from now on."""
    mount = mount_for(os.path.dirname(lock_file) or ".")
    key = (mount.mount_id, mount.mount_point)
    with _lock:
        _refused.setdefault(key, {})[kind] = errno_name
        _by_directory.clear()
    log.warning("%s failed with %s at %s; sharedfs switched this filesystem to existence (soft) locks",
                kind, errno_name, lock_file)


def cache_placement(shim: Shim, policy: Policy, *, create: bool = True) -> CachePlacement | None:
    """Where ``shim``'s framework cache goes (``None`` for a shim without a cache variable).

    ``create=False`` makes nothing (``sharedfs status``); what is exported or printed is asked with ``create=True``.
    """
    if not shim.cache_env:
        return None
    request = CacheRequest(shim.name, shim.cache_env, os.environ.get(shim.cache_env) or None, shim.cache_default,
                           create=create)
    return runtime.registry().cache_placement(request, policy)


def placed_cache(row: PlacedCache, policy: Policy, *, create: bool = True,
                 user_value: str | None | bool = True) -> CachePlacement:
    """Where ``row``'s cache goes; ``user_value=None`` asks what sharedfs would do were the variable unset."""
    default = cache_path(row)
    value = (os.environ.get(row.variable) or None) if user_value is True else (user_value or None)
    request = CacheRequest(row.name, row.variable, value, default, create=create, per_node=True,
                           default_shared=filesystem(default).shared)
    placed = runtime.registry().cache_placement(request, policy)
    return placed if placed is not None else CachePlacement(None, f"{row.name}'s own default kept (no plugin answered)")


def forget() -> None:
    """Forget every cached answer (after mounting or unmounting, and in tests)."""
    with _lock:
        _filesystems.clear()
        _refused.clear()
        _by_directory.clear()
        _teams.clear()
    clear_mount_cache()
