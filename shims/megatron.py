"""Megatron (``megatron-core``): the GPT dataset's index cache is published whole and waited for.

Stock writes the ``.npy`` files in place and other nodes check once (the failures: docs/frameworks/megatron.md).
"""

from __future__ import annotations

import copy
import functools
import math
import os
import re
import stat
import sys
import tempfile
from types import ModuleType
from typing import Any, Callable

from sharedfs.errors import SharedFSError
from sharedfs.types import Directory, Policy, Shim, ShimContext, choices, decision, fsync_dir, hookimpl, wait_for

#: The files of one dataset split in ``path_to_cache``, after ``<md5>-GPTDataset-<split>-``.
ARRAYS = ("document_index.npy", "sample_index.npy", "shuffle_index.npy")
DESCRIPTION = "description.txt"
#: How much of a ``.npy`` file is read for its header: numpy pads a plain array's header to 128 bytes
#: (64 before numpy 1.21); a longer one describes a dtype this does not read anyway.
HEADER_LIMIT = 512
MAGIC = b"\x93NUMPY"
#: What sizes an array in a ``.npy`` header: a plain dtype (``'<i4'``) and the shape (``(12, 2)``).
DESCR = re.compile(r"'descr':\s*'([<>|=]?[a-zA-Z]\d{0,2})'")
SHAPE = re.compile(r"'shape':\s*\(([\d,\s]*)\)")


class NodeLocalIndexCacheError(SharedFSError, FileNotFoundError):
    """Megatron's ``path_to_cache`` is on node-local storage and rank 0 built the index files on another node.

    Subclasses FileNotFoundError, so code that already handles the bare error still does.
    """


class MegatronShim(Shim):
    name = "megatron"
    distribution = "megatron-core"
    # The cache protocol (isfile after the barrier, numpy.save at the final names) read in 0.16.1;
    # tested with 0.16.1 (tests/integration/test_megatron.py); 0.17 and later need Python >= 3.12.
    supported = ">=0.16,<0.17"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        dataset = module.GPTDataset
        original = dataset.__dict__["_build_document_sample_shuffle_indices"]
        self.patcher.setattr(dataset, "_build_document_sample_shuffle_indices", make_build(original, policy))


def make_build(original: Callable[[Any], Any], policy: Policy) -> Callable[[Any], Any]:
    @functools.wraps(original, assigned=("__name__", "__qualname__", "__doc__"))  # __module__ stays ours
    def _build_document_sample_shuffle_indices(self: Any) -> Any:
        """sharedfs: megatron's index cache, each file published whole, waited for on the other ranks."""
        config = self.config
        cache = _cache_dir(self)
        if cache is None or getattr(config, "fast_cache_load", False) or getattr(config, "defer_npy_index_mmap", False):
            return original(self)
        base = f"{self.unique_description_hash}-{type(self).__name__}-{self.index_split.name}-"
        names = [base + name for name in (DESCRIPTION, *ARRAYS)]
        if _is_builder():
            if all(_whole(os.path.join(cache, name)) for name in names):
                return original(self)  # a hit: megatron loads what is there
            return _build_and_publish(self, original, cache, names)
        for name in names:
            _wait_whole(os.path.join(cache, name), policy)
        return original(self)  # every file is there and whole: megatron's own check finds them

    return _build_document_sample_shuffle_indices


def _cache_dir(dataset: Any) -> str | None:
    """Where megatron keeps this dataset's index files (its own rule), or ``None``: no cache to guard."""
    config = dataset.config
    path = config.path_to_cache
    if path is None and not config.mock:
        path = os.path.join(dataset.dataset.path_prefix, "cache", f"{type(dataset).__name__}_indices")
    if not path or "://" in str(path):
        return None
    return os.path.abspath(os.fspath(path))


def _is_builder() -> bool:
    """Megatron's own rule: global rank 0 builds, or the only process when torch.distributed is not up."""
    dist = sys.modules.get("torch.distributed")
    return dist is None or not dist.is_initialized() or dist.get_rank() == 0


def _whole(path: str) -> bool:
    """Whether ``path`` is a regular file that is complete: a ``.npy`` exactly as long as its header says.

    Read without trusting it: no symlink followed, no blocking open, one bounded read of the header;
    anything else (an object array, a header this does not parse, a pickle) is not whole: rebuilt.
    """
    try:
        if not path.endswith(".npy"):
            return stat.S_ISREG(os.lstat(path).st_mode)  # the description: megatron never reads it back
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        return stat.S_ISREG(info.st_mode) and info.st_size == _npy_size(os.pread(fd, HEADER_LIMIT, 0))
    except OSError:
        return False
    finally:
        os.close(fd)


def _npy_size(head: bytes) -> int | None:
    """The size of the whole ``.npy`` file that begins with ``head`` (numpy's format 1.0 to 3.0), else ``None``.

    Parsed by two patterns rather than numpy's reader, which evaluates the header (a tenth of a
    cached load each); megatron's arrays are plain integers, which is all this has to read.
    """
    if head[:6] != MAGIC or head[6:7] not in (b"\x01", b"\x02", b"\x03"):
        return None
    width = 2 if head[6] == 1 else 4
    start = 8 + width
    end = start + int.from_bytes(head[8:start], "little")
    text = head[start:end].decode("latin-1")
    descr, shape = DESCR.search(text), SHAPE.search(text)
    if end > len(head) or descr is None or shape is None:
        return None
    try:
        import numpy

        dtype = numpy.dtype(descr.group(1))
        count = math.prod(int(n) for n in shape.group(1).split(",") if n.strip())
    except (TypeError, ValueError):
        return None
    return None if dtype.hasobject else end + count * dtype.itemsize


def _wait_whole(path: str, policy: Policy) -> None:
    """Until rank 0's file is visible and whole here; a node-local cache that lacks it is explained.

    On node-local storage there is no lag to wait out: rank 0 published the file before the barrier,
    so one missing or short here was built on another node's disk (a short one is another job's leftover).
    """
    if _whole(path):
        return
    if _node_local(os.path.dirname(path)):
        raise NodeLocalIndexCacheError(_node_local_message(path, policy))
    wait_for(path, what=f"megatron's index file {path}")
    wait_for(lambda: _whole(path), what=f"megatron's index file {path} to be whole (rank 0 writes it)")


def _node_local(directory: str) -> bool:
    """Whether ``directory`` is on storage only this node has (the plugins' classification of its filesystem)."""
    try:
        return choices.filesystem(directory).shared is False
    except OSError:
        return False  # cannot tell: wait, as for a shared filesystem


def _node_local_message(path: str, policy: Policy) -> str:
    return (
        f"megatron's dataset index file {path} is missing or incomplete on this node ({policy.node_id}): its "
        f"path_to_cache, {os.path.dirname(path)}, is on node-local storage, and global rank 0 built the "
        "index files there on its own node before the barrier. Every rank loads them from path_to_cache, "
        "so in a multi-node job it must be a directory every node shares: set path_to_cache "
        "(--data-cache-path) to one on the shared filesystem (sharedfs publishes each file whole and makes "
        "the other ranks wait until they see it), or build the cache once beforehand and copy it to every node."
    )


def _build_and_publish(dataset: Any, original: Callable[[Any], Any], cache: str, names: list[str]) -> Any:
    """Megatron builds the index files into a private directory beside ``cache``; each is renamed into place whole."""
    os.makedirs(cache, exist_ok=True)
    private = tempfile.mkdtemp(prefix=f".{names[0].rpartition('-')[0]}.", suffix=".sharedfs", dir=cache)
    config = dataset.config
    dataset.config = copy.copy(config)  # this dataset's own copy: other datasets keep theirs
    dataset.config.path_to_cache = private
    try:
        result = original(dataset)
    except BaseException:
        _discard(cache, os.path.basename(private), names)
        raise
    finally:
        dataset.config = config
    _publish(cache, os.path.basename(private), names)
    decision(f"megatron: index files {names[0].rpartition('-')[0]}-* built and published whole in {cache}")
    return result


def _publish(cache: str, private: str, names: list[str]) -> None:
    """Each file fsynced and renamed from ``private`` into ``cache``, by descriptor; the description last."""
    with Directory.open(cache) as parent, parent.subdirectory(private) as built:
        for name in [*names[1:], names[0]]:
            fd = built.open_file(name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(name, name, src_dir_fd=built.fd, dst_dir_fd=parent.fd)
        fsync_dir(cache)
        os.rmdir(private, dir_fd=parent.fd)


def _discard(cache: str, private: str, names: list[str]) -> None:
    """What a failed build left in its private directory, by descriptor; never raises."""
    try:
        with Directory.open(cache) as parent, parent.subdirectory(private) as built:
            for name in names:
                built.unlink_quietly(name)
            os.rmdir(private, dir_fd=parent.fd)
    except OSError:
        pass


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [MegatronShim()]
