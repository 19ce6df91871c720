"""A shard cache that many processes on many nodes fill, read and evict at once.

Used by the webdataset and wids shims (and usable directly).  What goes wrong
without it (failures.md section 2): webdataset 1.0's ``FileCache`` has no lock,
so every worker of every node downloads the same shard, into a temp name
``dest + ".temp{pid}"`` that collides across nodes; its ``LRUCleanup`` runs in
every process and deletes files others are about to open.  wids' ``ULockFile``
unlinks its lock file on release, which splits waiters across inodes and, on
NFS/FUSE, raises ``FileNotFoundError: ....tar.lock`` (webdataset#386); it
downloads straight to the final name, so a killed download leaves a truncated
shard that later readers trust.

Bookkeeping lives in a hidden ``.sharedfs/`` directory beside the shards, so
framework globs (``*.tar``) never see it::

    .sharedfs/locks/<key>.lock        per-shard lock (sharedfs.lock: kind chosen per filesystem)
    .sharedfs/claims/<key>            "downloading" / "published" record, created O_EXCL
    .sharedfs/tmp/<key>.<node>.<pid>.<rand>.part    a download in progress
    .sharedfs/inuse/<key>.<node>.<pid>.<rand>       a reader has the shard open or is opening it
    .sharedfs/evict.lock              one evictor per cache at a time

Guarantees: a shard is downloaded at most once per cache while its first
download succeeds (the claim makes this hold even where a new file stays
invisible to other nodes for a while, like NFS's negative lookup cache); a
shard is published by atomic rename from a unique temp name after fsync, so a
reader never sees a partial one; the evictor deletes a shard only while holding
its lock and while no live reader has an in-use marker for it.  Non-guarantee:
a reader whose marker the evictor cannot see yet (lagging metadata) may lose
the race for a *closed* shard; it then finds the name missing and fetches it
again under the lock -- a second download, never a missing or truncated file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Callable

from .errors import LockTimeout, WaitTimeout

log = logging.getLogger("sharedfs")

META = ".sharedfs"
#: A file published this long ago that is still invisible is gone, not lagging (NFS acdirmax is 60 s).
LAG_BOUND = 60.0
#: In-use markers and temp files of processes whose liveness nobody can tell (another node,
#: no scheduler plugin) count as alive for this long.
STALE_AFTER = 6 * 3600.0
#: Files in a cache directory that are never shards (wids' and webdataset's own bookkeeping).
NOT_SHARDS = (".lock", ".part", ".db", ".db-journal")

Download = Callable[[str], None]
"""Writes the complete shard to the path it is given (a unique temp file)."""


def key(name: str) -> str:
    """A file-name-safe, length-bounded key for a shard's bookkeeping files."""
    digest = hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    readable = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:60]
    return f"{readable}-{digest}"


def meta_dir(dest: str, part: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(dest)), META, part)


_made: set[str] = set()


def _ensure_dir(path: str) -> str:
    # sharedfs.makedirs, not os.makedirs: on lagging NFS-like storage exist_ok=True still
    # raises FileExistsError when another node made the directory a moment ago (lingua#49).
    if path not in _made:
        from .dirs import makedirs

        makedirs(path)
        _made.add(path)
    return path


def _tag() -> str:
    from .runtime import policy

    return f"{policy().node_id}.{os.getpid()}.{secrets.token_hex(4)}"


def _record(**extra: object) -> bytes:
    from .locks import process_start_time
    from .runtime import policy

    return json.dumps({"node": policy().node_id, "pid": os.getpid(), "host": socket.gethostname(),
                       "start_time": process_start_time(os.getpid()), "at": time.time(), **extra}).encode()


def _create_exclusive(path: str, content: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some network filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


# -- in-use markers ----------------------------------------------------------------------------


@dataclass
class InUse:
    """An in-use marker: while it exists, no sharedfs evictor deletes ``dest``."""

    dest: str
    path: str = field(default="", init=False)

    def __post_init__(self) -> None:
        directory = meta_dir(self.dest, "inuse")
        path = os.path.join(directory, f"{key(os.path.basename(self.dest))}.{_tag()}")
        try:
            _create_exclusive(path, _record(dest=os.path.basename(self.dest)))
        except FileNotFoundError:  # first use in this process, or the cache was wiped meanwhile
            _made.discard(directory)
            _ensure_dir(directory)
            _create_exclusive(path, _record(dest=os.path.basename(self.dest)))
        self.path = path

    def release(self) -> None:
        if self.path:
            _unlink(self.path)
            self.path = ""

    def __enter__(self) -> InUse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _alive(record_path: str, *, now: float | None = None) -> bool:
    """Whether the process that wrote ``record_path`` may still be using it (unknown -> alive)."""
    from .locks import HolderRecord
    from .runtime import policy, registry

    try:
        with open(record_path, encoding="utf-8") as fh:
            data = json.load(fh)
        record = HolderRecord(node=str(data["node"]), pid=int(data["pid"]), start_time=data.get("start_time"),
                              host=str(data.get("host", "")), acquired_at=float(data["at"]), kind="inuse")
    except FileNotFoundError:
        return False  # released while we looked
    except (OSError, ValueError, TypeError, KeyError):
        return True  # half-written or not visible yet: make no claim, keep the shard
    verdict = registry().holder_alive(record, policy())
    if verdict is not None:
        return verdict
    return (now or time.time()) - record.acquired_at < STALE_AFTER


def readers(dest: str) -> list[str]:
    """In-use markers of live readers of ``dest`` (dead ones are removed on the way)."""
    directory = meta_dir(dest, "inuse")
    prefix = key(os.path.basename(dest)) + "."
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
    except FileNotFoundError:
        return []
    live = []
    for name in names:
        path = os.path.join(directory, name)
        if _alive(path):
            live.append(path)
        else:
            _unlink(path)
    return live


# -- fetching ----------------------------------------------------------------------------------


def shard_lock(dest: str, timeout: float = -1):  # -> sharedfs.locks.SharedLock
    """The lock that serialises downloading, opening-after-download and evicting ``dest``.

    Waits without limit by default, as webdataset and wids do: the holder may be
    downloading a large shard over a slow link, and a waiter that gave up after
    ``SHAREDFS_WAIT_TIMEOUT`` would fail a healthy job.  A waiter says every few
    minutes whom it waits for, and a dead holder's lock is released by the kernel
    (flock/posix) or broken when a plugin proves it dead (soft).
    """
    from .locks import lock

    directory = _ensure_dir(meta_dir(dest, "locks"))
    return lock(os.path.join(directory, key(os.path.basename(dest)) + ".lock"), timeout=timeout)


def open_shard(dest: str, download: Download, *, mode: str = "rb",
               validate: Callable[[str], None] | None = None) -> tuple[IO, InUse]:
    """Open ``dest``, downloading it first (once per cache) if it is missing.

    Returns the open file and the in-use marker; release the marker when done
    with the shard.  ``download(path)`` must write the whole shard to ``path``;
    ``validate(path)`` may raise to reject a download before it is published.
    """
    marker = InUse(dest)
    try:
        try:  # fast path: a published shard is complete (atomic rename), just open it
            return open(dest, mode), marker
        except FileNotFoundError:
            pass
        with shard_lock(dest):
            ensure(dest, download, validate=validate)
            return open(dest, mode), marker
    except BaseException:
        marker.release()
        raise


def ensure(dest: str, download: Download, *, validate: Callable[[str], None] | None = None) -> bool:
    """Make ``dest`` exist.  Call with the shard lock held.  True when this call downloaded it."""
    if os.path.exists(dest):
        return False
    claim = os.path.join(_ensure_dir(meta_dir(dest, "claims")), key(os.path.basename(dest)))
    tmp_dir = _ensure_dir(meta_dir(dest, "tmp"))
    temp = os.path.join(tmp_dir, f"{key(os.path.basename(dest))}.{_tag()}.part")
    content = _record(state="downloading", temp=os.path.basename(temp))
    try:
        _create_exclusive(claim, content)
    except FileExistsError:
        # Someone claimed this shard before us and has released the lock since: it either
        # published it (and the name is not visible here yet: lagging metadata) or died
        # mid-download.  Only the claim, created O_EXCL, can tell us which.
        data = _claim_state(claim)
        if data is not None and data.get("state") == "published" and _published_visible(dest, data):
            return False
        if data is not None and isinstance(data.get("temp"), str):
            _unlink(os.path.join(tmp_dir, os.path.basename(data["temp"])))  # the dead downloader's partial
        _unlink(claim)
        _create_exclusive(claim, content)
    try:
        download(temp)
        with open(temp, "rb+") as fh:  # data on disk before the name points at it
            os.fsync(fh.fileno())
        if validate is not None:
            validate(temp)
        os.rename(temp, dest)
        _fsync_dir(os.path.dirname(os.path.abspath(dest)))
        _rewrite(claim, _record(state="published"))
    except BaseException:
        _unlink(temp)
        _unlink(claim)
        raise
    return True


def _rewrite(path: str, content: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)


def _claim_state(claim: str) -> dict | None:
    """The claim's record, once visible here; None if it vanished, never shows, or is garbled."""
    from .dirs import wait_for

    try:
        wait_for(claim, timeout=LAG_BOUND, what=f"download record {claim}")
        with open(claim, encoding="utf-8") as fh:
            data = json.load(fh)
    except (WaitTimeout, OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _published_visible(dest: str, data: dict) -> bool:
    """Wait (bounded) for a shard another process published to become visible here."""
    from .dirs import wait_for

    remaining = LAG_BOUND - (time.time() - float(data.get("at", 0)))
    if remaining <= 0:
        return os.path.exists(dest)  # published long ago and gone now: evicted by hand
    try:
        wait_for(dest, timeout=remaining, what=f"shard {dest}")
    except WaitTimeout:
        return False
    return True


def download_atomic(dest: str, write: Download) -> None:
    """Write ``dest`` through a unique temp file, fsync and rename: never a partial ``dest``.

    For callers without the per-shard protocol (webdataset's module-level ``download``).
    """
    directory = os.path.dirname(os.path.abspath(dest))
    temp = os.path.join(directory, f".{os.path.basename(dest)}.{_tag()}.part")
    try:
        write(temp)
        with open(temp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.rename(temp, dest)
    except BaseException:
        _unlink(temp)
        raise


# -- eviction ----------------------------------------------------------------------------------


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


_last_run: dict[str, float] = {}


def evict(cache_dir: str, max_bytes: float, *, interval: float | None = None) -> list[str]:
    """Delete least recently used shards until ``cache_dir`` holds at most ``max_bytes``.

    Runs in one process per cache at a time (the others skip it), deletes a
    shard only under its lock and with no live reader, and removes temp files
    and markers left by dead processes.  Returns the deleted paths.
    """
    from .locks import lock

    now = time.time()
    if interval is not None and now - _last_run.get(cache_dir, 0.0) < interval:
        return []
    _last_run[cache_dir] = now
    if not os.path.isdir(cache_dir):
        return []
    evictor = lock(os.path.join(_ensure_dir(os.path.join(cache_dir, META)), "evict.lock"), timeout=0)
    try:
        evictor.acquire()
    except LockTimeout:
        return []  # another process is evicting this cache right now
    try:
        _sweep_temps(cache_dir)
        shards = list(_shards(cache_dir))
        total = sum(st.st_size for _, st in shards)
        deleted: list[str] = []
        # Least recently used first: readers' opens update atime only under strictatime, so
        # take the later of access and modification (download) time.
        for path, st in sorted(shards, key=lambda item: max(item[1].st_atime, item[1].st_mtime)):
            if total <= max_bytes:
                break
            if try_evict(path):
                total -= st.st_size
                deleted.append(path)
        if deleted:
            log.debug("evicted %d shard(s) from %s", len(deleted), cache_dir)
        return deleted
    finally:
        evictor.release()


def try_evict(path: str) -> bool:
    """Delete the shard ``path`` unless a live reader has it or its lock is held.  True if deleted."""
    if readers(path):
        return False
    guard = shard_lock(path)
    try:
        guard.acquire(timeout=0)
    except LockTimeout:
        return False  # being downloaded or opened right now
    try:
        if readers(path):  # re-check under the lock: a reader may have arrived
            return False
        # Claim first, then the shard: a crash in between leaves a shard without a claim,
        # which readers simply use; the other order would leave a claim promising a shard.
        _unlink(os.path.join(meta_dir(path, "claims"), key(os.path.basename(path))))
        _unlink(path)
        return True
    finally:
        guard.release()


def _sweep_temps(cache_dir: str) -> None:
    """Remove partial downloads of processes that are gone (SIGKILL, OOM, preemption)."""
    directory = os.path.join(cache_dir, META, "tmp")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        # <key>.<node>.<pid>.<rand>.part: the key has no dots, the node id may.
        _, _, rest = name.partition(".")
        parts = rest.rsplit(".", 3)
        if len(parts) != 4 or parts[3] != "part" or not parts[1].isdigit():
            continue
        path = os.path.join(directory, name)
        if _temp_owner_gone(parts[0], int(parts[1]), path):
            _unlink(path)


def _temp_owner_gone(node: str, pid: int, path: str) -> bool:
    from .runtime import policy

    if node == policy().node_id:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    try:
        return time.time() - os.stat(path).st_mtime > STALE_AFTER
    except FileNotFoundError:
        return False


__all__ = ["InUse", "download_atomic", "ensure", "evict", "key", "open_shard", "readers", "shard_lock", "try_evict"]
