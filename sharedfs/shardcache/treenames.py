"""The names in a shard cache's coordination tree (its parts, a shard's key and lock stripe) and a cache's Layout."""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from sharedfs.model.structs import frozen

if TYPE_CHECKING:  # pragma: no cover
    from sharedfs.model.policy import TeamCache

#: The fallback place of the coordination tree, inside the cache (sharedfs 0.1 always used it).
META = ".sharedfs"
#: The sibling of ``<parent>/<cache>`` is ``<parent>/.<cache>.sharedfs``.
SIBLING_SUFFIX = ".sharedfs"
SUBDIRS = ("stripes", "claims", "inuse", "tmp")
#: Lock stripes per cache.  Part of the on-disk protocol: every process of a cache must agree.
STRIPES = 1024
#: A file published this long ago that is still invisible is gone, not lagging (NFS acdirmax is 60 s).
LAG_BOUND = 60.0
#: Files in a cache directory that are never shards (wids' and webdataset's own bookkeeping).
NOT_SHARDS = (".lock", ".part", ".db", ".db-journal")

#: What :func:`key` makes; names in the coordination tree that do not match were not made by sharedfs.
KEY_PATTERN = r"[A-Za-z0-9_-]{0,60}-[0-9a-f]{16}"  # for re.fullmatch (compiled on first use, then cached by re)


def key(name: str) -> str:
    """A file-name-safe, length-bounded key for a shard's coordination files."""
    digest = hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    readable = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:60]
    return f"{readable}-{digest}"


def sibling(name: str) -> str:
    """The coordination tree's name beside a cache directory named ``name``, in their parent.

    ``.<name>.sharedfs``, or, where that would pass NAME_MAX (255 on every filesystem we meet), the
    name cut short and a hash of it: the one rule, for the tree's maker and for ``sharedfs locks``.
    """
    full = f".{name}{SIBLING_SUFFIX}"
    return full if len(full) <= 240 else f".{name[:160]}-{key(name)[-16:]}{SIBLING_SUFFIX}"


def stripe(shard_key: str) -> str:
    """The lock stripe of a shard key (the key's hash, so it can be computed from a claim's name)."""
    return f"{int(shard_key.rsplit('-', 1)[-1][:8], 16) % STRIPES:03x}"


@frozen
class Layout:
    """Where one cache keeps its coordination files (:func:`sharedfs.shardcache.tree.layout`)."""

    cache: str  # the cache directory, symlinks resolved
    root: str  # the coordination tree: the sibling, or <cache>/.sharedfs
    inside: bool  # True for the fallback inside the cache
    #: The cache is a team cache (a group shares it): what this module makes there is the group's.
    team: TeamCache | None = None

    def part(self, name: str) -> str:
        return os.path.join(self.root, name)

    def stripe_lock(self, shard_key: str) -> str:
        return os.path.join(self.root, "stripes", stripe(shard_key))

    def claim(self, shard_key: str) -> str:
        return os.path.join(self.root, "claims", shard_key)
