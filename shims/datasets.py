"""Hugging Face ``datasets``: every cache lock goes through :func:`sharedfs.lock`; caches follow the policy.

Also ``map`` once per cache, node-local datasets that survive pickling, team-cache group bits.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from sharedfs.errors import LockTimeout, SharedFSError
from sharedfs.types import (
    Policy,
    Shim,
    ShimContext,
    choices,
    current_umask,
    decision,
    drop_in,
    hookimpl,
    node_local_root,
    teamfiles,
)

#: Modules that bind ``FileLock`` by name at import time.
LOCK_SITES = (
    "datasets.utils._filelock",
    "datasets.utils.filelock",
    "datasets.builder",
    "datasets.utils.file_utils",
    "datasets.utils.extract",
)
#: Extra key in a pickled ``MemoryMappedTable`` state.  datasets' own ``__setstate__`` reads
#: only ``path`` and ``replays``, so a receiver without sharedfs ignores it.
STATE_KEY = "_sharedfs_origin"
#: What replacements copy from the function they replace: ``__module__`` stays ours, so
#: ``sharedfs status`` and a debugger show who is running.
_NAME_AND_DOC = ("__name__", "__qualname__", "__doc__")


class NodeLocalDatasetError(SharedFSError, FileNotFoundError):
    """A dataset pickled on one node refers to an Arrow file in that node's node-local cache.

    Subclasses FileNotFoundError, so code that already handles the bare error still does.
    """


class DatasetsShim(Shim):
    name = "datasets"
    distribution = "datasets"
    # utils/_filelock.py appeared in 2.14; tested with 3.6 and 5.2 (tests/integration/test_datasets.py).
    supported = ">=2.14,<6"
    cache_env = "HF_DATASETS_CACHE"
    cache_default = "~/.cache/huggingface/datasets"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        original = sys.modules["datasets.utils._filelock"].FileLock
        # datasets' own class (name hashing, umask-based mode) with sharedfs's kinds behind it; in a team
        # cache, what datasets made around a lock is the group's before the lock is tried or released.
        replacement = teamfiles.settling(drop_in(original, policy, __name__))
        for site in LOCK_SITES:
            site_module = sys.modules.get(site)
            if site_module is not None and getattr(site_module, "FileLock", None) is original:
                self.patcher.setattr(site_module, "FileLock", replacement)
        self._patch_map(sys.modules["datasets.arrow_dataset"].Dataset, replacement)
        self._patch_pickling(sys.modules["datasets.table"].MemoryMappedTable, policy)
        if context.cache is not None and context.cache.path:
            self._place_cache(Path(context.cache.path))
        self._patch_builder(sys.modules["datasets.builder"].DatasetBuilder, policy)
        teamfiles.watch(sys.modules["datasets.config"].HF_DATASETS_CACHE, policy, self.patcher)

    # -- team caches: what a builder writes becomes the group's ----------------------------------

    def _patch_builder(self, builder_cls: type, policy: Policy) -> None:
        original = builder_cls.__dict__["download_and_prepare"]
        patcher = self.patcher

        @functools.wraps(original, assigned=_NAME_AND_DOC)
        def download_and_prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
            root = getattr(self, "_cache_dir_root", None)
            team = teamfiles.watch(root, policy, patcher) if isinstance(root, str) and "://" not in root else None
            # num_proc workers write the Arrow shards and leave by os._exit, unseen by the recorder: when
            # this call prepares the dataset with them, its output directory is walked afterwards (once,
            # by the preparer; every later load finds it prepared and walks nothing).
            output = kwargs.get("output_dir") or getattr(self, "_output_dir", None)
            walk = (team is not None and kwargs.get("num_proc") is not None and isinstance(output, str)
                    and not os.path.exists(os.path.join(output, "dataset_info.json")))
            try:
                return original(self, *args, **kwargs)
            finally:
                if team is not None:
                    teamfiles.settle_pending()
                    if walk and os.path.isdir(str(output)):
                        teamfiles.give_tree(str(output))

        self.patcher.setattr(builder_cls, "download_and_prepare", download_and_prepare)

    # -- Dataset.map: one computation per input, the other ranks load it ---------------------

    def _patch_map(self, dataset_cls: type, lock_class: type) -> None:
        original = dataset_cls.__dict__["map"]
        self.patcher.setattr(dataset_cls, "map", make_locked_map(original, lock_class))

    # -- the multi-node pickle trap -----------------------------------------------------------

    def _patch_pickling(self, table_cls: type, policy: Policy) -> None:
        getstate, setstate = table_cls.__dict__["__getstate__"], table_cls.__dict__["__setstate__"]

        @functools.wraps(getstate, assigned=_NAME_AND_DOC)
        def __getstate__(self: Any) -> Any:
            state = getstate(self)
            if isinstance(state, dict) and "path" in state:
                origin = _origin(state["path"], policy)
                if origin is not None:  # shared paths pickle exactly as before (fingerprints stay stable)
                    state = {**state, STATE_KEY: origin}
            return state

        @functools.wraps(setstate, assigned=_NAME_AND_DOC)
        def __setstate__(self: Any, state: Any) -> None:
            if isinstance(state, dict) and STATE_KEY in state:
                state = dict(state)
                origin = state.pop(STATE_KEY)
                state["path"] = _reachable_path(state["path"], origin, policy)
            setstate(self, state)

        self.patcher.setattr(table_cls, "__getstate__", __getstate__)
        self.patcher.setattr(table_cls, "__setstate__", __setstate__)

    # -- cache placement ------------------------------------------------------------------------

    def _place_cache(self, root: Path) -> None:
        config = sys.modules["datasets.config"]
        for name, value in (
            ("HF_DATASETS_CACHE", root),
            ("DOWNLOADED_DATASETS_PATH", root / config.DOWNLOADED_DATASETS_DIR),
            ("EXTRACTED_DATASETS_PATH", root / config.DOWNLOADED_DATASETS_DIR / config.EXTRACTED_DATASETS_DIR),
        ):
            self.patcher.setattr(config, name, value)


_held = threading.local()


def make_locked_map(original: Callable[..., Any], lock_class: type) -> Callable[..., Any]:
    """``Dataset.map`` behind a lock per input dataset, so concurrent ranks compute a map once.

    ``lock_class`` is the class datasets' own locks now are (one class: filelock models its constructor once).
    The first rank computes under the lock (beside the input's cache files, named after its fingerprint); the
    others wait until it is free, let go at once and run ``map`` unlocked, loading the published result in
    parallel, or computing it if the first rank died.  In-memory datasets, ``keep_in_memory=True`` and
    disabled caching have no shared result, so they run unlocked.
    """

    @functools.wraps(original, assigned=_NAME_AND_DOC)
    def map(self: Any, *args: Any, **kwargs: Any) -> Any:
        lock_file = _map_lock_file(self, kwargs)
        held: set[str] = _held.__dict__.setdefault("paths", set())
        if lock_file is None or lock_file in held:  # a map inside a map function must not wait for itself
            return original(self, *args, **kwargs)
        shared = lock_class(lock_file, timeout=-1, mode=_umask_mode())
        try:
            shared.acquire(timeout=0)
        except LockTimeout:  # someone is computing it: wait for them, then load their result
            shared.acquire()
            shared.release()
            return _settled(original(self, *args, **kwargs), lock_file, kwargs)
        held.add(lock_file)
        try:
            return _settled(original(self, *args, **kwargs), lock_file, kwargs)
        finally:
            held.discard(lock_file)
            shared.release()  # in a team cache, the class settles first: the result is the group's before others get it

    return map


def _settled(result: Any, lock_file: str, kwargs: dict[str, Any]) -> Any:
    """``map``'s result, its cache files given to the group when they are in a watched team cache.

    The recorder sees what this process wrote; ``num_proc`` workers write their shards and
    leave by ``os._exit``, so their files are named here, from the result.
    """
    if teamfiles.WATCHED.root_of(os.path.abspath(lock_file)) is None:
        return result
    teamfiles.settle_pending()
    if kwargs.get("num_proc") is not None:  # datasets 5 maps in a worker pool for any num_proc, 1 included
        for entry in getattr(result, "cache_files", None) or ():
            name = entry.get("filename") if isinstance(entry, dict) else None
            if name:
                teamfiles.give(name)
    return result


def _map_lock_file(dataset: Any, kwargs: dict[str, Any]) -> str | None:
    if kwargs.get("keep_in_memory") or kwargs.get("load_from_cache_file") is False:
        return None
    explicit = kwargs.get("cache_file_name")
    if explicit:
        return os.fspath(explicit) + ".lock"
    from datasets.fingerprint import is_caching_enabled

    cache_files = getattr(dataset, "cache_files", None)
    if not cache_files or not is_caching_enabled():
        return None
    directory = os.path.dirname(cache_files[0]["filename"])
    return os.path.join(directory, f"cache-{dataset._fingerprint}.map.lock")


# -- pickling across nodes ------------------------------------------------------------------------


def _umask_mode() -> int:
    """datasets' own rule for its lock files: 0o666 filtered by the umask (datasets/utils/_filelock.py)."""
    # Read, never set: setting and restoring it would hand every other thread's files that umask meanwhile.
    return 0o666 & ~current_umask()


def _origin(path: str, policy: Policy) -> dict[str, Any] | None:
    """For a path other nodes may not see: who pickled it, and the node-local root of that node.

    ``None`` for a path on a shared filesystem outside the node-local root: its state stays
    byte-identical to datasets' own, because datasets hashes pickled objects into cache
    fingerprints, which must not depend on the node.
    """
    root = os.path.abspath(node_local_root(policy))
    try:
        shared: bool | None = choices.filesystem(os.path.dirname(path) or ".").shared
    except Exception:  # noqa: BLE001 - e.g. a dead FUSE mount elsewhere in the mount table
        shared = None
    if shared is not False and not _is_under(path, root):
        return None
    return {"node": policy.node_id, "root": root}


def _is_under(path: str, root: str) -> bool:
    return not os.path.relpath(os.path.abspath(path), root).startswith(os.pardir)


def _reachable_path(path: str, origin: dict[str, Any], current: Policy) -> str:
    """``path`` if it can be opened here; else this node's copy of it; else an explanatory error."""
    if os.path.exists(path):
        return path
    sender = str(origin.get("node"))
    if sender == current.node_id:
        return path  # same node: datasets' own FileNotFoundError is the honest answer
    sender_root = str(origin.get("root") or "")
    own_root = os.path.abspath(node_local_root(current))
    under_root = bool(sender_root) and _is_under(path, sender_root)
    if under_root:
        relative = os.path.relpath(path, sender_root)
        # One preparer per node: this node prepared the same dataset (same fingerprints, so
        # the same relative file names) under its own node-local root.
        candidate = os.path.join(own_root, relative)
        if os.path.exists(candidate):
            decision(f"datasets: a dataset pickled on node {sender} refers to its node-local cache; "
                     f"opening this node's copy under {own_root}")
            return candidate
    raise NodeLocalDatasetError(_trap_message(path, sender, current.node_id, under_root, sender_root))


def _trap_message(path: str, sender: str, receiver: str, under_root: bool, sender_root: str) -> str:
    where = f"node {sender}'s node-local storage ({sender_root})" if under_root else f"a path only node {sender} has"
    return (
        f"this datasets Dataset was memory-mapped on node {sender} from {path}, which is on {where} and does "
        f"not exist on this node ({receiver}). A datasets Dataset pickles its Arrow data as a file path "
        "(MemoryMappedTable), so a dataset prepared on one node and sent to another (torch.distributed "
        "broadcast_object_list, XTuner's process_hf_dataset) can only be opened where that file exists. "
        "Fix it in one of two ways: (1) put the datasets cache on a filesystem every node shares "
        "(SHAREDFS_CACHE=shared and no node-local HF_DATASETS_CACHE; sharedfs's locks make a shared cache "
        "safe), or (2) prepare the dataset once per node instead of sending it: run load_dataset/map on every "
        "rank inside `with sharedfs.main_process_first(per_node=True):` so each node's local rank 0 prepares "
        "its own copy and the others load it."
    )


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [DatasetsShim()]
