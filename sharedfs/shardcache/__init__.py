"""A shard cache that many processes on many nodes fill, read and evict at once (the webdataset and wids shims').

Its layout, guarantees and defences against group members: docs/architecture.md, "The shard cache"."""

from __future__ import annotations

from sharedfs.shardcache.claims import GARBLED_GRACE, InUse, readers
from sharedfs.shardcache.downloads import Download, download_atomic
from sharedfs.shardcache.eviction import evict, evictor, try_evict
from sharedfs.shardcache.fetch import ensure, open_shard, shard_lock
from sharedfs.shardcache.tree import (
    KEY_PATTERN,
    META,
    NOT_SHARDS,
    SIBLING_SUFFIX,
    SUBDIRS,
    Layout,
    forget,
    key,
    layout,
    stripe,
)

__all__ = ["GARBLED_GRACE", "KEY_PATTERN", "META", "NOT_SHARDS", "SIBLING_SUFFIX", "SUBDIRS", "Download", "InUse",
           "Layout", "download_atomic", "ensure", "evict", "evictor", "forget", "key", "layout", "open_shard",
           "readers", "shard_lock", "stripe", "try_evict"]
