"""Eviction: deleting shards no live reader needs, and what dead processes left behind.

One evictor per cache at a time (``evict.lock``); a shard goes only under its stripe
lock and with no live in-use marker; :func:`evictor` first sweeps markers, claims and
private downloads whose processes are gone.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sharedfs.errors import LockTimeout
from sharedfs.shardcache.claims import GARBLED_GRACE, _alive, _read_record, readers
from sharedfs.shardcache.downloads import _remove_downloads
from sharedfs.shardcache.fetch import shard_lock
from sharedfs.shardcache.tree import KEY_PATTERN, LAG_BOUND, NOT_SHARDS, Layout, _current, _unlink, key, layout

if TYPE_CHECKING:  # pragma: no cover
    from sharedfs.model.policy import Policy

log = logging.getLogger("sharedfs")


def _shards(cache_dir: str) -> Iterator[tuple[str, os.stat_result]]:
    for dirpath, dirnames, filenames in os.walk(cache_dir):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or name.endswith(NOT_SHARDS):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            yield path, st


@contextmanager
def evictor(cache_dir: str, policy: Policy | None = None) -> Iterator[bool]:
    """Hold ``cache_dir``'s evictor lock if nobody else does: yields True if this process may evict now.

    Also sweeps what dead processes left (markers, claims, private downloads) before yielding.
    """
    from sharedfs.locks import lock

    current = _current(policy)
    lay = layout(cache_dir, current)
    guard = lock(lay.part("evict.lock"), timeout=0, policy=current)
    try:
        guard.acquire()
    except LockTimeout:
        yield False  # another process is evicting this cache right now
        return
    try:
        _sweep(lay, current)
        yield True
    finally:
        guard.release()


_last_run: dict[str, float] = {}


def evict(cache_dir: str, max_bytes: float, *, interval: float | None = None,
          policy: Policy | None = None) -> list[str]:
    """Delete least recently used shards until ``cache_dir`` holds at most ``max_bytes``.

    Runs in one process per cache at a time (the others skip it), deletes a
    shard only under its lock and with no live reader, and removes temp files,
    markers and claims left by dead processes.  Returns the deleted paths.
    """
    now = time.time()
    if interval is not None and now - _last_run.get(cache_dir, 0.0) < interval:
        return []
    _last_run[cache_dir] = now
    if not os.path.isdir(cache_dir):
        return []
    current = _current(policy)
    with evictor(cache_dir, current) as mine:
        if not mine:
            return []
        shards = list(_shards(cache_dir))
        total = sum(st.st_size for _, st in shards)
        deleted: list[str] = []
        # Least recently used first: readers' opens update atime only under strictatime, so
        # take the later of access and modification (download) time.
        for path, st in sorted(shards, key=lambda item: max(item[1].st_atime, item[1].st_mtime)):
            if total <= max_bytes:
                break
            if try_evict(path, current):
                total -= st.st_size
                deleted.append(path)
        if deleted:
            log.debug("evicted %d shard(s) from %s", len(deleted), cache_dir)
        return deleted


def try_evict(path: str, policy: Policy | None = None) -> bool:
    """Delete the shard ``path`` unless a live reader has it or its lock is held.  True if deleted."""
    current = _current(policy)
    if readers(path, current):
        return False
    guard = shard_lock(path, policy=current)
    try:
        guard.acquire(timeout=0)
    except LockTimeout:
        return False  # being downloaded or opened right now (or another shard of its stripe is)
    try:
        if readers(path, current):  # re-check under the lock: a reader may have arrived
            return False
        # Claim first, then the shard: a crash in between leaves a shard without a claim,
        # which readers simply use; the other order would leave a claim promising a shard.
        lay = layout(os.path.dirname(os.path.abspath(path)), current)
        _unlink(lay.claim(key(os.path.basename(path))))
        _unlink(path)
        return True
    finally:
        guard.release()


def _sweep(lay: Layout, policy: Policy) -> None:
    """Remove what dead processes left: in-use markers, claims of shards no longer cached, partials."""
    now = time.time()
    directory = lay.part("inuse")
    for name in _listdir(directory):
        path = os.path.join(directory, name)
        if not _alive(path, policy, now=now):
            _unlink(path)
    # Only claims of shards that are gone are looked at (a claim of a cached shard goes when it is
    # evicted): one read per orphan, not one per cached shard.
    present = {key(name) for name in _listdir(lay.cache)}
    stale: dict[str, set[str]] = {}
    for name in _listdir(lay.part("claims")):
        if name not in present:
            stale.setdefault(name, set()).add("claim")
    for name in _listdir(lay.part("tmp")):
        if _owned_dir(os.path.join(lay.part("tmp"), name)):  # others' partials are private to them
            stale.setdefault(name.rsplit(".", 1)[0], set()).add("tmp")
    for shard_key, what in stale.items():
        if re.fullmatch(KEY_PATTERN, shard_key):
            _sweep_shard(lay, shard_key, what, policy, now)


def _listdir(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def _owned_dir(path: str) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _sweep_shard(lay: Layout, shard_key: str, what: set[str], policy: Policy, now: float) -> None:
    """Under ``shard_key``'s stripe (never waiting for it), remove its stale claim and dead partials.

    Holding the stripe, nobody downloads a shard of it: a "downloading" claim or a private
    download directory is a dead process's.
    """
    from sharedfs.locks import lock

    guard = lock(lay.stripe_lock(shard_key), timeout=0, policy=policy)
    try:
        guard.acquire()
    except LockTimeout:
        return  # someone downloads or evicts a shard of this stripe: next time
    try:
        if "tmp" in what:
            _remove_downloads(lay, shard_key)
        if "claim" in what:
            _sweep_claim(lay.claim(shard_key), now)
    finally:
        guard.release()


def _sweep_claim(path: str, now: float) -> None:
    try:
        record, changed = _read_record(path)
    except FileNotFoundError:
        return
    if record is None:
        if now - changed > GARBLED_GRACE:
            _unlink(path)  # not a record (ENOSPC, a killed writer, a planted file)
    elif record.kind != "published":
        _unlink(path)  # "downloading" while we hold its stripe: its downloader is gone
    elif now - record.acquired_at > LAG_BOUND:
        # Its shard was not in the cache when we listed it (removed by another tool or by
        # hand), and lagging metadata can no longer hide it: the claim promises nothing.
        # A shard published again since is younger than LAG_BOUND and keeps its claim.
        _unlink(path)
