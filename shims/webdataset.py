"""webdataset: one download per shard per cache, no partial shards, in-use-safe eviction, sane worker counts."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any, Callable
from urllib.parse import urlparse

from sharedfs.types import CachePlacement, Policy, Shim, ShimContext, decision, hookimpl

CHUNK = 1024 * 1024


class WebDatasetShim(Shim):
    name = "webdataset"
    distribution = "webdataset"
    # 0.2.x and 1.0.x share cache.py's FileCache/LRUCleanup/download shape (checked: 0.2.111, 1.0.2).
    supported = ">=0.2,<1.1"
    # webdataset reads WDS_CACHE once, at import (cache.py: default_cache_dir).
    cache_env = "WDS_CACHE"
    cache_default = "./_cache"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        from sharedfs.types import workers
        cache = sys.modules["webdataset.cache"]
        original_cleanup = cache.LRUCleanup
        cleanup = make_lru_cleanup(original_cleanup, policy)
        self.patcher.setattr(cache, "FileCache", make_file_cache(cache, cleanup, policy))
        self.patcher.setattr(cache, "download", make_download(cache))
        for owner in (cache, module):  # ``webdataset.LRUCleanup`` is re-exported by name
            if getattr(owner, "LRUCleanup", None) is original_cleanup:
                self.patcher.setattr(owner, "LRUCleanup", cleanup)
        if context.cache is not None:
            self._place_cache(cache, context.cache, policy)
        pipeline = getattr(module, "DataPipeline", None)
        if pipeline is not None:  # the torch shim caps DataLoaders over datasets a predicate claims
            self.patcher.setitem(workers.PREDICATES, self.name, lambda dataset: isinstance(dataset, pipeline))

    def _place_cache(self, cache: ModuleType, placement: CachePlacement, policy: Policy) -> None:
        # The kernel logs the placement (one line for every shim: "webdataset cache -> ...").
        if placement.path is not None:
            self.patcher.setattr(cache, "default_cache_dir", placement.path)


def _fetch(gopen: Callable[..., Any], url: str, path: str) -> None:
    with gopen(url) as stream, open(path, "wb") as out:
        while True:
            data = stream.read(CHUNK)
            if not data:
                break
            out.write(data)


def make_download(cache: ModuleType) -> Callable[..., None]:
    """webdataset's ``download(url, dest)`` through a unique temp file, fsync and rename."""
    gopen_module = sys.modules["webdataset.gopen"]

    def download(url: str, dest: str, chunk_size: int = CHUNK, verbose: bool = False) -> None:
        from sharedfs.types import download_atomic

        if verbose:
            print(f"# downloading {url} to {dest}", file=sys.stderr)
        download_atomic(dest, lambda temp: _fetch(gopen_module.gopen, url, temp))

    download.__doc__ = "sharedfs: " + (cache.download.__doc__ or "") + " (unique temp name, fsync, atomic rename)"
    return download


def make_lru_cleanup(original: type, policy: Policy) -> type:
    class SharedFSLRUCleanup(original):  # type: ignore[misc, valid-type]
        """sharedfs: LRU cleanup that never deletes a shard another process has open or is opening.

        One process per cache evicts at a time; a shard goes only under its lock and
        with no live in-use marker (webdataset's own ``LRUCleanup`` walks the cache in
        every worker and removes whatever is oldest, including others' temp files).
        """

        def cleanup(self) -> None:
            from sharedfs.types import evict

            if self.cache_dir is None:
                return
            for path in evict(os.fspath(self.cache_dir), self.cache_size, interval=self.interval, policy=policy):
                if self.verbose:
                    print(f"# deleting {path}", file=sys.stderr)

    return SharedFSLRUCleanup


def make_file_cache(cache: ModuleType, cleanup: type, policy: Policy) -> type:
    original = cache.FileCache
    gopen_module = sys.modules["webdataset.gopen"]
    reraise = sys.modules["webdataset.handlers"].reraise_exception

    class SharedFSFileCache(original):  # type: ignore[misc, valid-type]
        """sharedfs: webdataset's ``FileCache`` with one download per shard per cache.

        Same constructor and results as webdataset's; see :mod:`sharedfs.shardcache`
        for the protocol (lock, claim, unique temp + rename, in-use markers).
        """

        def __init__(self, cache_dir: str | None = None, **kwargs: Any) -> None:
            super().__init__(cache_dir, **kwargs)
            if cache_dir is not None and policy.cache == "node-local":
                decision(f"webdataset cache stays at {cache_dir}: cache_dir= (or WDS_CACHE) was given "
                         "(an explicit user setting wins over SHAREDFS_CACHE=node-local)")
            old: Any = getattr(self, "cleaner", None)
            if old is not None and not isinstance(old, cleanup):
                # A subclass that bound the original LRUCleanup before we patched it.
                self.cleaner = cleanup(old.cache_dir, old.cache_size, verbose=old.verbose, interval=old.interval)

        def _open(self, url: str) -> tuple[Any, str, Any]:
            from sharedfs.types import open_shard

            cache_name = self.url_to_name(url)
            assert "/" not in cache_name, f"bad cache name {cache_name} for {url}"
            dest = os.path.join(self.cache_dir, cache_name)

            def download(temp: str) -> None:
                if self.verbose:
                    print(f"# downloading {url} to {dest}", file=sys.stderr)
                if self.cleaner is not None:
                    self.cleaner.cleanup()
                _fetch(gopen_module.gopen, url, temp)

            def validate(temp: str) -> None:
                if self.validator and not self.validator(temp):
                    with open(temp, "rb") as fh:
                        data = fh.read(200)
                    raise ValueError(f"{dest} ({url}) is not a tar archive, contains {data!r}")

            stream, marker = open_shard(dest, download, validate=validate, policy=policy)
            return stream, dest, marker

        def get_file(self, url: str) -> str:
            assert isinstance(url, str)
            if cache.islocal(url):
                return urlparse(url).path
            stream, dest, marker = self._open(url)
            stream.close()
            marker.release()
            return dest

        def __call__(self, urls: Iterable[Any]) -> Iterator[dict]:
            import time

            handler = self.handler or reraise
            for url in urls:
                if isinstance(url, dict):
                    url = url["url"]
                delay = 1.0
                for _ in range(10):
                    marker = None
                    try:
                        if cache.islocal(url):
                            dest = urlparse(url).path
                            stream = open(dest, "rb")  # noqa: SIM115 - handed to the pipeline, which closes it
                        else:
                            stream, dest, marker = self._open(url)
                    except Exception as exn:  # noqa: BLE001 - webdataset's handler decides, as upstream
                        if handler(exn):
                            time.sleep(delay)
                            delay *= 1.5
                            continue
                        break
                    try:
                        # The shard stays marked in use until the pipeline asks for the next one.
                        yield {"url": url, "stream": stream, "local_path": dest}
                    finally:
                        if marker is not None:
                            marker.release()
                    break

    SharedFSFileCache.__module__ = original.__module__
    SharedFSFileCache.__qualname__ = "FileCache"
    return SharedFSFileCache


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [WebDatasetShim()]
