"""wids: no ``.tar.lock`` race, no partial shards, cache placement by policy, in-use-safe cleanup."""

from __future__ import annotations

import glob
import os
import sys
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from sharedfs.types import CachePlacement, Policy, Shim, ShimContext, decision, hookimpl

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self

#: The wids distribution's own versions, and webdataset 0.2.x, which bundles the same package.
SUPPORTED = {"wids": ">=0.1,<0.2", "webdataset": ">=0.2,<0.3"}


def _distribution() -> str:
    """Which distribution provides ``wids`` here, and so whose version range applies (``sharedfs status``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("wids")
    except PackageNotFoundError:
        pass
    else:
        return "wids"
    try:
        bundled = version("webdataset")
    except PackageNotFoundError:
        return "wids"
    # Only webdataset 0.2.x bundles wids; with a later webdataset and no wids, wids is simply not
    # installed, and its own range is the one to show (not webdataset 0.2's, which reads as a verdict).
    return "webdataset" if bundled == "0.2" or bundled.startswith("0.2.") else "wids"


class WidsShim(Shim):
    name = "wids"
    # wids reads WIDS_CACHE whenever a ShardListDataset gets neither cache_dir nor localname.
    cache_env = "WIDS_CACHE"
    cache_default = "/tmp/_wids_cache"

    @property
    def distribution(self) -> str:  # type: ignore[override]
        return _distribution()

    @property
    def supported(self) -> str:  # type: ignore[override]
        return SUPPORTED[self.distribution]

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        from sharedfs.types import workers
        dl = sys.modules["wids.wids_dl"]
        core = sys.modules["wids.wids"]
        original = dl.download_and_open
        replacement = make_download_and_open(dl, policy)
        self.patcher.setattr(dl, "ULockFile", make_lock_file(policy))
        for owner in (dl, core):  # wids.wids binds it by name at import
            if getattr(owner, "download_and_open", None) is original:
                self.patcher.setattr(owner, "download_and_open", replacement)
        self.patcher.setattr(core.LRUShards, "get_shard", make_get_shard(core, dl, policy))
        self.patcher.setattr(core.LRUShards, "release_handler", _release_handler)
        self._patch_cleanup(policy)
        self._place_cache(core, policy, context.cache)
        dataset = core.ShardListDataset
        # The torch shim caps DataLoaders over datasets a predicate claims.
        self.patcher.setitem(workers.PREDICATES, self.name, lambda ds: isinstance(ds, dataset))

    def _patch_cleanup(self, policy: Policy) -> None:
        try:
            import wids.wids_cleanup as cleanup  # imports numpy, which wids itself needs anyway
        except ImportError:
            return
        self.patcher.setattr(cleanup, "keep_most_recent_files", make_keep_most_recent_files(policy))
        self.patcher.setattr(cleanup, "ExclusiveLock", make_exclusive_lock(policy))

    def _place_cache(self, core: ModuleType, policy: Policy, placement: CachePlacement | None) -> None:
        # The kernel logs the placement (one line for every shim: "wids cache -> ...").
        placed = placement.path if placement is not None else None
        original_init = core.ShardListDataset.__init__
        default_localname = core.DefaultLocalname

        def __init__(self: Any, shards: Any, *args: Any, cache_dir: Any = None, localname: Any = None,
                     **kwargs: Any) -> None:
            if cache_dir is not None and policy.cache == "node-local":
                decision(f"wids cache stays at {cache_dir}: cache_dir= was given "
                         "(an explicit user setting wins over SHAREDFS_CACHE=node-local)")
            use_placed = placed is not None and cache_dir is None and localname is None
            if use_placed:
                localname = default_localname(placed)
            original_init(self, shards, *args, cache_dir=cache_dir, localname=localname, **kwargs)
            if use_placed:
                self.cache_dir = placed  # what wids would have reported for WIDS_CACHE

        __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
        __init__.__doc__ = original_init.__doc__
        self.patcher.setattr(core.ShardListDataset, "__init__", __init__)


def make_lock_file(policy: Policy) -> type:
    class SharedFSLockFile:
        """Drop-in for wids' ``ULockFile``: a :func:`sharedfs.lock` that never unlinks a lock others may hold.

        The lock file is ``path`` itself, as in wids, with the lock kind chosen for its filesystem.
        """

        def __init__(self, path: str) -> None:
            self.lockfile_path = path
            self._lock: Any = None

        def __enter__(self) -> Self:
            from sharedfs.types import lock

            self._lock = lock(self.lockfile_path, timeout=-1, policy=policy)
            self._lock.acquire()
            return self

        def __exit__(self, *exc: object) -> None:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    SharedFSLockFile.__qualname__ = "SharedFSLockFile"
    return SharedFSLockFile


def _downloader(dl: ModuleType, remote: str, handlers: Any, verbose: bool) -> Callable[[str], None]:
    def download(temp: str) -> None:
        if verbose:
            print("downloading", remote, "to", temp, file=sys.stderr)
        dl.download_file(remote, temp, handlers=handlers if handlers is not None else dl.default_cmds,
                         verbose=verbose)
        if not os.path.exists(temp):  # curl -o only creates the file once data arrives
            raise FileNotFoundError(f"downloading {remote} produced no file")

    return download


def make_download_and_open(dl: ModuleType, policy: Policy) -> Callable[..., Any]:
    def download_and_open(remote: str, local: str, mode: str = "rb", handlers: Any = None,
                          verbose: bool = False) -> Any:
        """sharedfs: wids' ``download_and_open`` with a per-shard sharedfs lock and atomic publication."""
        from sharedfs.types import open_shard

        stream, marker = open_shard(local, _downloader(dl, remote, handlers, verbose), mode=mode, policy=policy)
        marker.release()  # the caller holds an open file; a later unlink cannot take it away
        if dl.open_objects is not None:
            for k, v in list(dl.open_objects.items()):
                if v.closed:
                    del dl.open_objects[k]
            if len(dl.open_objects) > dl.max_open_objects:
                raise RuntimeError("Too many open objects")
            current_time = datetime.now().strftime("%Y%m%d%H%M%S")
            dl.open_objects[tuple(str(x) for x in [remote, local, mode, current_time])] = stream
        return stream

    return download_and_open


def make_get_shard(core: ModuleType, dl: ModuleType, policy: Policy) -> Callable[[Any, str], Any]:
    def get_shard(self: Any, url: str) -> Any:
        """sharedfs: wids' ``LRUShards.get_shard``; the shard is marked in use while it sits in the LRU."""
        from sharedfs.types import open_shard

        assert isinstance(url, str)
        self.accesses += 1
        if url not in self.lru:
            local = self.localname(url)
            stream, marker = open_shard(local, _downloader(dl, url, None, False), policy=policy)
            try:
                with stream:
                    itf = core.IndexedTarSamples(path=local, stream=stream)
            except BaseException:
                marker.release()
                raise
            itf._sharedfs_in_use = marker
            self.lru[url] = itf
            self.misses += 1
            self.last_missed = True
        else:
            self.last_missed = False
        return self.lru[url]

    return get_shard


def _release_handler(self: Any, key: Any, value: Any) -> None:
    try:
        value.close()
    finally:
        marker = getattr(value, "_sharedfs_in_use", None)
        if marker is not None:
            marker.release()


def make_keep_most_recent_files(policy: Policy) -> Callable[..., None]:
    def keep_most_recent_files(pattern: str, maxsize: int = int(1e12), maxfiles: int = 1000,
                               debug: bool = False) -> None:
        """sharedfs: wids' cleanup, but a shard in use (or being downloaded) is never deleted.

        Keeps the most recent files matching ``pattern`` within ``maxsize`` bytes and
        ``maxfiles`` files, like wids; one process per cache directory runs it at a time.
        """
        from sharedfs.types import NOT_SHARDS, evictor, try_evict

        directory = os.path.dirname(os.path.abspath(pattern))
        with evictor(directory, policy) as mine:
            if not mine:
                return  # another process is cleaning this cache right now
            files = []
            for fname in glob.glob(pattern):
                if os.path.basename(fname).endswith(NOT_SHARDS):
                    continue
                try:
                    st = os.stat(fname)
                except FileNotFoundError:
                    continue
                files.append((st.st_mtime, fname, st.st_size))
            files.sort(reverse=True)
            # Like wids: keep the newest files while their running total stays below maxsize and
            # their number below maxfiles; everything older goes, unless someone is using it.
            total, kept, keeping = 0, 0, True
            for _, fname, size in files:
                total += size
                keeping = keeping and total < maxsize and kept < maxfiles
                if keeping:
                    kept += 1
                    continue
                if try_evict(fname, policy) and debug:
                    print("deleted", fname, file=sys.stderr)

    return keep_most_recent_files


def make_exclusive_lock(policy: Policy) -> type:
    class SharedFSExclusiveLock:
        """Drop-in for ``wids_cleanup.ExclusiveLock``: non-blocking, and never unlinks a lock others may hold."""

        def __init__(self, lockfile: str) -> None:
            from sharedfs.types import lock

            self.lockfile = lockfile
            self._lock = lock(lockfile, timeout=0, policy=policy)

        def try_lock(self) -> bool:
            from sharedfs.errors import LockTimeout

            try:
                self._lock.acquire()
            except LockTimeout:
                return False
            return True

        def release_lock(self) -> None:
            self._lock.release()

    SharedFSExclusiveLock.__qualname__ = "SharedFSExclusiveLock"
    return SharedFSExclusiveLock


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [WidsShim()]
