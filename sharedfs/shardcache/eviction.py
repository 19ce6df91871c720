"""Eviction: deleting shards no live reader needs, and what dead processes left behind.

Every removal goes through descriptors (docs/architecture.md, "The shard cache")."""

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
from sharedfs.fs.directory import Changed, Directory, Identity, identity
from sharedfs.fs.stale import gone as vanished
from sharedfs.shardcache.claims import GARBLED_GRACE, _read_record, live_markers, readers
from sharedfs.shardcache.downloads import _remove_downloads
from sharedfs.shardcache.fetch import shard_lock
from sharedfs.shardcache.tree import (
    KEY_PATTERN,
    LAG_BOUND,
    NOT_SHARDS,
    Layout,
    Swapped,
    _current,
    key,
    layout,
    open_cache,
    open_part,
)

if TYPE_CHECKING:  # pragma: no cover
    from sharedfs.model.policy import Policy

log = logging.getLogger("sharedfs")

#: Subdirectories below the cache that eviction looks into (the frameworks keep shards flat; a deeper
#: tree is someone else's, and its walk must not hold descriptors without bound).
MAX_DEPTH = 16

#: Where a shard is below the cache: the subdirectories on the way, each with the identity its listing showed.
Steps = tuple[tuple[str, Identity], ...]


def _shards(where: Directory, steps: Steps = ()) -> Iterator[tuple[Steps, str, os.stat_result]]:
    """Every shard below the open cache directory: (subdirectories on the way, its name, its own stat).

    Hidden names are the frameworks' temp files and sharedfs's tree; a symlink is neither followed
    nor counted; a subdirectory is entered from this descriptor, never through a symlink, and only
    while it is the directory just listed.
    """
    try:
        names = sorted(entry.name for entry in where.listing())
    except OSError:  # removed meanwhile, or not readable: nothing of it to evict, as os.walk skips it
        return
    for name in names:
        if name.startswith("."):
            continue
        try:
            st = where.lstat(name)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode) and len(steps) < MAX_DEPTH:
            try:
                below = where.subdirectory(name, identity(st))
            except OSError:  # Changed (swapped since listed), or gone
                continue
            with below:
                yield from _shards(below, (*steps, (name, identity(st))))
        elif stat.S_ISREG(st.st_mode) and not name.endswith(NOT_SHARDS):
            yield steps, name, st


@contextmanager
def _reach(where: Directory, steps: Steps) -> Iterator[Directory]:
    """The subdirectory ``steps`` below ``where``, descended by descriptor; :class:`Changed` if one was swapped."""
    if not steps:
        yield where
        return
    here = where.subdirectory(*steps[0])
    try:
        for name, ident in steps[1:]:
            below = here.subdirectory(name, ident)
            here.close()
            here = below
        yield here
    finally:
        here.close()


def _refused(cache_dir: str, why: Swapped) -> None:
    from sharedfs.machinery.log import decision

    parent = os.path.dirname(os.path.abspath(cache_dir))
    decision(f"shard cache {cache_dir}: eviction skipped, nothing deleted: {why}; someone who may write {parent} "
             "may have swapped it (see who with ls -la): put the cache directory back, or give the job a cache "
             "directory only you can write", level=logging.WARNING, every_rank=True)


@contextmanager
def _evicting(cache_dir: str, policy: Policy | None) -> Iterator[Directory | None]:
    """The verified cache directory while this process holds its evictor lock (dead processes' leftovers swept).

    ``None`` when another process evicts it right now, or when its name no longer leads to the
    directory this process used (said in one line: nothing is deleted this round).
    """
    from sharedfs.locks import lock

    current = _current(policy)
    try:
        where = open_cache(cache_dir, current)
    except Swapped as why:
        _refused(cache_dir, why)
        yield None
        return
    except FileNotFoundError:
        yield None
        return
    with where:
        lay = layout(cache_dir, current)
        guard = lock(lay.part("evict.lock"), timeout=0, policy=current)
        try:
            guard.acquire()
        except LockTimeout:
            yield None  # another process is evicting this cache right now
            return
        try:
            _sweep(lay, where, current)
            yield where
        finally:
            guard.release()


@contextmanager
def evictor(cache_dir: str, policy: Policy | None = None) -> Iterator[bool]:
    """Hold ``cache_dir``'s evictor lock if nobody else does: yields True if this process may evict now.

    Also sweeps what dead processes left (markers, claims, private downloads) before yielding.
    False, too, when the cache directory was swapped (:func:`~sharedfs.shardcache.tree.open_cache`).
    """
    with _evicting(cache_dir, policy) as where:
        yield where is not None


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
    with _evicting(cache_dir, current) as where:
        if where is None:
            return []
        shards = list(_shards(where))
        total = sum(st.st_size for _, _, st in shards)
        deleted: list[str] = []
        # Least recently used first: readers' opens update atime only under strictatime, so
        # take the later of access and modification (download) time.
        for steps, name, st in sorted(shards, key=lambda item: max(item[2].st_atime, item[2].st_mtime)):
            if total <= max_bytes:
                break
            path = os.path.join(cache_dir, *(step for step, _ in steps), name)
            try:
                with _reach(where, steps) as here:
                    gone = _evict_in(here, name, identity(st), path, current)
            except (Changed, FileNotFoundError):
                continue  # a subdirectory swapped or removed since the walk: nothing below it is touched
            if gone:
                total -= st.st_size
                deleted.append(path)
        if deleted:
            log.debug("evicted %d shard(s) from %s", len(deleted), cache_dir)
        return deleted


def try_evict(path: str, policy: Policy | None = None) -> bool:
    """Delete the shard ``path`` unless a live reader has it or its lock is held.  True if deleted.

    Through the descriptor of its directory, proven to be the cache this process used there
    (a swapped one is refused with one line); the file judged is the one at the name now.
    """
    current = _current(policy)
    directory, name = os.path.split(os.path.abspath(path))
    try:
        where = open_cache(directory, current)
    except Swapped as why:
        _refused(directory, why)
        return False
    except FileNotFoundError:
        return False
    with where:
        try:
            st = where.lstat(name)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode) and _evict_in(where, name, identity(st), path, current)


def _evict_in(where: Directory, name: str, judged: Identity, path: str, policy: Policy) -> bool:
    """Unlink ``name`` from ``where`` if it is still ``judged``, no live reader has it and its lock is free."""
    if readers(path, policy):
        return False
    guard = shard_lock(path, policy=policy)
    try:
        guard.acquire(timeout=0)
    except LockTimeout:
        return False  # being downloaded or opened right now (or another shard of its stripe is)
    try:
        if readers(path, policy):  # re-check under the lock: a reader may have arrived
            return False
        if not where.names(name, judged):
            return False  # published again since it was judged: the new shard and its claim stay
        # Claim first, then the shard: a crash in between leaves a shard without a claim,
        # which readers simply use; the other order would leave a claim promising a shard.
        lay = layout(os.path.dirname(os.path.abspath(path)), policy)
        return _unclaim(lay, where, key(name)) and where.unlink_if_same(name, judged)
    finally:
        guard.release()


def _unclaim(lay: Layout, where: Directory, claim: str) -> bool:
    """Remove the claim ``claim`` by descriptor; False when ``claims/`` is not sharedfs's any more (the shard stays)."""
    try:
        claims = open_part(lay, "claims", where)
    except FileNotFoundError:
        return True  # no claims at all (the tree was removed): nothing promises the shard
    except Changed:
        return False  # replaced by a member: its claim cannot be reached, so the shard is not taken from under it
    with claims:
        try:
            claims.unlink_if_same(claim, identity(claims.lstat(claim)))
        except FileNotFoundError:
            pass
    return True


def _sweep(lay: Layout, cache: Directory, policy: Policy) -> None:
    """Remove what dead processes left: in-use markers, claims of shards no longer cached, partials.

    Each part of the tree is entered by descriptor (:func:`~sharedfs.shardcache.tree.open_part`):
    a part a member replaced (a symlink to one of our directories, say) is not swept.
    """
    now = time.time()
    with _part(lay, "inuse", cache) as inuse:
        if inuse is not None:
            live_markers(inuse, policy, now=now)
    # Only claims of shards that are gone are looked at (a claim of a cached shard goes when it is
    # evicted): one read per orphan, not one per cached shard.
    present = {key(entry.name) for entry in cache.listing()}
    stale: dict[str, set[str]] = {}
    with _part(lay, "claims", cache) as claims:
        if claims is not None:
            for entry in claims.listing():
                if entry.name not in present:
                    stale.setdefault(entry.name, set()).add("claim")
    with _part(lay, "tmp", cache) as tmp:
        if tmp is not None:
            for entry in tmp.listing():
                if _owned_dir(tmp, entry.name):  # others' partials are private to them
                    stale.setdefault(entry.name.rsplit(".", 1)[0], set()).add("tmp")
    for shard_key, what in stale.items():
        if re.fullmatch(KEY_PATTERN, shard_key):
            _sweep_shard(lay, cache, shard_key, what, policy, now)


@contextmanager
def _part(lay: Layout, name: str, cache: Directory) -> Iterator[Directory | None]:
    """The part ``name`` of the tree, open; ``None`` when it is missing, or not ours any more (said once)."""
    try:
        part = open_part(lay, name, cache)
    except FileNotFoundError:
        yield None
        return
    except Changed as exc:
        from sharedfs.machinery.log import decision

        decision(f"shard cache {lay.cache}: {exc.filename}: {exc.strerror}; someone with write access to the "
                 "cache's coordination tree replaced it, so nothing in it is removed and no shard is evicted "
                 "while it is so: remove it and sharedfs makes it again", level=logging.WARNING, every_rank=True)
        yield None
        return
    with part:
        yield part


def _owned_dir(tmp: Directory, name: str) -> bool:
    try:
        st = tmp.lstat(name)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _sweep_shard(lay: Layout, cache: Directory, shard_key: str, what: set[str], policy: Policy, now: float) -> None:
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
            with _part(lay, "tmp", cache) as tmp:
                if tmp is not None:
                    _remove_downloads(tmp, shard_key)
        if "claim" in what:
            with _part(lay, "claims", cache) as claims:
                if claims is not None:
                    _sweep_claim(claims, shard_key, now)
    finally:
        guard.release()


def _sweep_claim(claims: Directory, name: str, now: float) -> None:
    try:
        judged = identity(claims.lstat(name))
        record, changed = _read_record(name, dir_fd=claims.fd)
    except OSError as exc:
        if vanished(exc):  # ESTALE through every retry included: cannot tell, so the claim stays
            return
        raise
    if record is None:
        gone = now - changed > GARBLED_GRACE  # not a record (ENOSPC, a killed writer, a planted file)
    elif record.kind != "published":
        gone = True  # "downloading" while we hold its stripe: its downloader is gone
    else:
        # Its shard was not in the cache when we listed it (removed by another tool or by
        # hand), and lagging metadata can no longer hide it: the claim promises nothing.
        # A shard published again since is younger than LAG_BOUND and keeps its claim.
        gone = now - record.acquired_at > LAG_BOUND
    if gone:
        claims.unlink_if_same(name, judged)
