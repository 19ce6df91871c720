"""Opening a shard: downloaded once per cache, under its lock, published whole.

:func:`open_shard` is what the shims call: it leaves an in-use marker, opens the
shard if it is there, and otherwise -- one process per node at a time, then under the
shard's stripe lock -- :func:`ensure` downloads it, unless a download claim shows that
someone published it already and lagging metadata only hides it here.
"""

from __future__ import annotations

import os
import time
from typing import IO, TYPE_CHECKING, Callable

from sharedfs.errors import UnsafeDirectoryError, WaitTimeout
from sharedfs.fs import stale
from sharedfs.fs.directory import identity
from sharedfs.model.records import HolderRecord
from sharedfs.shardcache.claims import InUse, _Claim, _claim_state
from sharedfs.shardcache.downloads import Download, _PrivateDir, _publish, _remove_downloads
from sharedfs.shardcache.tree import LAG_BOUND, Swapped, _current, _tree, forget, key, open_cache

if TYPE_CHECKING:  # pragma: no cover
    from sharedfs.model.policy import Policy


def shard_lock(dest: str, timeout: float = -1, policy: Policy | None = None):  # -> sharedfs.locks.SharedFSLock
    """The lock that serialises downloading, opening-after-download and evicting ``dest``.

    The lock of ``dest``'s stripe.  Waits without limit by default, as webdataset and
    wids do: the holder may be downloading a large shard over a slow link, and a waiter
    that gave up after ``SHAREDFS_WAIT_TIMEOUT`` would fail a healthy job.  A waiter says
    every few minutes whom it waits for, and a dead holder's lock is released by the
    kernel (flock/posix) or broken when a plugin proves it dead (soft).
    """
    from sharedfs.locks import lock

    current = _current(policy)
    # The stripe directory must exist before acquiring: a lock file that cannot be created
    # looks like contention to the lock, which would wait for it forever.
    lay, stripes = _tree(os.path.dirname(os.path.abspath(dest)), "stripes", current)
    stripes.close()
    return lock(lay.stripe_lock(key(os.path.basename(dest))), timeout=timeout, policy=current)


def open_shard(dest: str, download: Download, *, mode: str = "rb", validate: Callable[[str], None] | None = None,
               policy: Policy | None = None) -> tuple[IO, InUse]:
    """Open ``dest``, downloading it first (once per cache) if it is missing.

    Returns the open file and the in-use marker; release the marker when done
    with the shard.  ``download(path)`` must write the whole shard to ``path``;
    ``validate(path)`` may raise to reject a download before it is published.
    """
    current = _current(policy)
    marker = InUse(dest, current)
    try:
        try:  # fast path: a published shard is complete (atomic rename), just open it
            return _open_published(dest, mode), marker
        except FileNotFoundError:
            pass
        # One process per node goes for the shard lock; the node's others wait their turn on
        # node-local storage and then find the shard there, without passing through the lock
        # one by one (the shared filesystem sees nodes, not ranks).  Never taken while holding a
        # shard lock, so it cannot deadlock with one.
        from sharedfs.cluster import gates
        with gates.turn(f"shard:{os.path.abspath(dest)}"):
            try:
                return _open_published(dest, mode), marker
            except FileNotFoundError:
                pass
            with shard_lock(dest, policy=current):
                ensure(dest, download, validate=validate, policy=current)
                return _open_published(dest, mode), marker
    except BaseException:
        marker.release()
        raise


def _open_published(dest: str, mode: str) -> IO:
    """``open(dest, mode)``, asked again through the name on ESTALE (a shard another client replaced).

    A name stale every time is a miss (:class:`FileNotFoundError`): the caller downloads under the lock.
    """
    try:
        return stale.retry(lambda: open(dest, mode))
    except OSError as exc:
        raise stale.vanished(exc, dest) from None


def ensure(dest: str, download: Download, *, validate: Callable[[str], None] | None = None,
           policy: Policy | None = None) -> bool:
    """Make ``dest`` exist.  Call with the shard lock held.  True when this call downloaded it.

    Everything is written and removed through descriptors: the claim in ``claims/``, the download
    in ``tmp/`` (the tree's own parts, :func:`~sharedfs.shardcache.tree.open_part`), the shard
    renamed into the cache directory this process used (:func:`~sharedfs.shardcache.tree.open_cache`).
    When a member swapped one of them (a symlink to another directory, say), nothing is written
    and :class:`~sharedfs.errors.UnsafeDirectoryError` says which, in one line.
    """
    if os.path.exists(dest):
        return False
    current = _current(policy)
    cache_dir = os.path.dirname(os.path.abspath(dest))
    if not os.path.isdir(cache_dir):
        forget(cache_dir)  # the cache was removed while this process used it: make it (and its tree) again
    try:
        return _fetch(dest, cache_dir, download, validate, current)
    except Swapped as why:
        raise UnsafeDirectoryError(
            f"shard cache {cache_dir}: {os.path.basename(dest)} not downloaded, nothing written: {why}; someone who "
            f"may write {os.path.dirname(cache_dir)} may have swapped it (see who with ls -la): put it back (a "
            "removed coordination directory is made again), or give the job a cache directory only you can write"
        ) from None


def _fetch(dest: str, cache_dir: str, download: Download, validate: Callable[[str], None] | None,
           policy: Policy) -> bool:
    lay, claims = _tree(cache_dir, "claims", policy)
    name = os.path.basename(dest)
    shard_key = key(name)
    record = HolderRecord.mine(policy.node_id, "downloading")
    with claims:
        try:
            claim = _Claim.take(claims, shard_key, record, lay.cache, lay.team)
        except FileExistsError:
            # Someone claimed this shard before us and has released the lock since: it either
            # published it (and the name is not visible here yet: lagging metadata) or died
            # mid-download.  Only the claim, created O_EXCL, can tell us which.
            seen = _claim_state(claims.join(shard_key))
            if seen is not None and seen.kind == "published" and _published_visible(dest, seen, policy):
                return False
            _, tmp = _tree(cache_dir, "tmp", policy)
            with tmp:
                _remove_downloads(tmp, shard_key)  # holding the lock: any partial of this shard is a dead one's
            try:  # holding the lock: whatever claim is there now is a dead downloader's
                claims.unlink_if_same(shard_key, identity(claims.lstat(shard_key)))
            except FileNotFoundError:
                pass
            claim = _Claim.take(claims, shard_key, record, lay.cache, lay.team)
    private = None
    try:
        private = _PrivateDir(_tree(cache_dir, "tmp", policy)[1], shard_key)
        download(private.file(name))
        private.fsync(name)
        if validate is not None:
            validate(private.file(name))
        with open_cache(cache_dir, policy, evicting=False) as cache:  # the directory this process used, or Swapped
            _publish(private, name, dest, cache, lay.team)
        claim.publish(HolderRecord.mine(policy.node_id, "published"))
    except BaseException:
        claim.abandon()
        raise
    finally:
        if private is not None:
            private.remove()
    return True


def _published_visible(dest: str, record: HolderRecord, policy: Policy) -> bool:
    """Wait (bounded) for a shard another node published to become visible here."""
    from sharedfs.cluster.dirs import wait_for

    remaining = LAG_BOUND - (time.time() - record.acquired_at)
    # Lagging metadata hides other nodes' new files, never this node's own: a shard published
    # here and missing now was removed (the cache deleted and made again, say), so do not wait.
    if remaining <= 0 or (record.node == policy.node_id and policy.node_id_trusted):
        return os.path.exists(dest)
    try:
        wait_for(dest, timeout=remaining, what=f"shard {dest}")
    except WaitTimeout:
        return False
    return True
