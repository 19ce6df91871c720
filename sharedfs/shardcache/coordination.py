"""The coordination tree's records (download claims, readers) read back for ``sharedfs locks``, beside their writer."""

from __future__ import annotations

import os
import re

from sharedfs.fs.directory import Directory
from sharedfs.locks.rows import DEAD, FREE, SHARD_CLAIM, SHARD_READER, UNKNOWN, Looker, Row, judge, not_a_record, read
from sharedfs.shardcache.tree import META, SIBLING_SUFFIX
from sharedfs.shardcache.treenames import sibling

__all__ = ["PARTS", "in_coordination_tree", "shard_record_row", "sibling_name"]

#: The parts of the tree whose files are holder records: download claims and readers.
PARTS = ("claims", "inuse")
#: The shard cache's coordination tree (sharedfs.shardcache's layout): ``<parent>/.<cache>.sharedfs/``
#: or ``<cache>/.sharedfs/``, with ``claims/`` (download claims) and ``inuse/`` (readers).
_SHARD_TREE = re.compile(r"\..+" + re.escape(SIBLING_SUFFIX) + "|" + re.escape(META))


def in_coordination_tree(directory: str) -> bool:
    """Whether ``directory`` is a part (``claims/``, ``tmp/``, ...) of a coordination tree."""
    return _SHARD_TREE.fullmatch(os.path.basename(os.path.dirname(directory))) is not None


def sibling_name(cache: str) -> str:
    """The name of the coordination tree beside the cache directory ``cache``, in its parent."""
    return sibling(os.path.basename(cache.rstrip(os.sep)) or "root")


def shard_record_row(where: Directory, name: str, part: str, walk: Looker) -> Row | None:
    kind = SHARD_CLAIM if part == "claims" else SHARD_READER
    path = lock = where.join(name)
    seen = read(where, name, walk)
    if seen is None:
        return None
    record = seen.record
    if record is None:
        what = "an empty or garbled record" if seen.readable else not_a_record(where, name, walk)[0]
        return Row(lock, kind, UNKNOWN, f"{what}: the shard cache keeps its shard for a minute after it last "
                   "changed, then removes it", path, owner=seen.owner)
    if record.kind == "published":
        return Row(lock, kind, FREE, "the shard's download finished (published); the claim lives as long as "
                   "the shard", path, record=record, owner=seen.owner)
    state, evidence = judge(record)
    if kind == SHARD_CLAIM:
        what = "a shard download in progress" if state != DEAD else "a download whose downloader is gone"
        after = "; the next download of the shard takes it over under the shard's lock" if state == DEAD else ""
    else:
        what = "a reader keeping its shard from eviction" if state != DEAD else "a reader that is gone"
        after = "; the next eviction removes it" if state == DEAD else ""
    return Row(lock, kind, state, f"{what}: {evidence}{after}", path, record=record, owner=seen.owner)
