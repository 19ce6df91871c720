"""Hugging Face ``datasets``: every cache lock goes through :func:`sharedfs.lock`; caches follow the policy.

datasets takes all its locks through ``datasets.utils._filelock.FileLock``
(a ``filelock.FileLock`` = BSD flock), imported by name into ``builder``,
``utils.file_utils`` and ``utils.extract``.  On Lustre without ``-o flock``
that raises "FileSystem does not appear to support flock" (datasets#6395), on
NFS without lockd "[Errno 37] No locks available" (datasets#1672), and on
GPFS / ``localflock`` / ``local_lock`` it silently excludes only one node.
The replacement keeps datasets' own behaviour (long-name hashing, umask-based
mode, wait forever by default) and lets the plugins choose the lock kind for
each path.

Four more changes, each for a failure no filelock release can fix:

* ``Dataset.map`` runs under a lock per input dataset (of the class datasets' own
  locks are, beside the input's cache files), so N ranks that map the
  same cached dataset compute it once and the others load the result
  (datasets writes map results to a temp file and renames it, so without the
  lock nothing is corrupted, but every rank redoes the work at once).
* The cache moves to a node-local directory under ``SHAREDFS_CACHE=node-local``.
* The multi-node pickle trap: a ``Dataset`` pickles its
  memory-mapped Arrow table as a *path* (``MemoryMappedTable.__getstate__``).
  XTuner's ``process_hf_dataset`` prepares on rank 0 and
  ``broadcast_object_list``\\ s the dataset; a rank on another node then gets a
  bare FileNotFoundError for a node-local path (LlamaFactory#3065,
  ms-swift#3667).  The pickled state now also carries the sender's node and
  node-local root; the receiver opens its own node's copy when that node
  prepared one, and otherwise raises :class:`NodeLocalDatasetError` explaining
  the cause and the two fixes.
* Team caches (a lab's ``HF_HOME`` in a setgid, group-writable directory; see
  ``plugins/teamcache.py``): under the default umask 022 datasets makes every
  directory there 2755 and every file 0644, so the next member of the group
  cannot add a dataset or a map result, nor open a lock file for writing
  (datasets#7900, datasets#6589, datasets#2065).  The cache root is watched
  (:mod:`sharedfs.cluster.teamfiles`): what this process creates under it is given to the
  group -- directories g+rwx and setgid, files g+rw, by descriptor and only this
  user's entries -- before each datasets lock is tried or released, when
  ``download_and_prepare`` and ``map`` return (including what ``num_proc``
  workers wrote), at exit, and otherwise within a second (so a job killed
  half-way through a preparation leaves it preparable by the next member).  The umask is never changed: it is the whole
  process's, and lowering it around a call would widen what every other thread
  creates meanwhile, anywhere.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from sharedfs.cluster import teamfiles
from sharedfs.cluster.dirs import node_local_root
from sharedfs.errors import LockTimeout, SharedFSError
from sharedfs.fs.umask import current_umask
from sharedfs.locks import drop_in
from sharedfs.machinery import choices
from sharedfs.machinery.log import decision
from sharedfs.types import Policy, Shim, ShimContext, hookimpl

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
    target = "datasets"
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

    ``lock_class`` is the class datasets' own locks now are (its ``FileLock`` with sharedfs's kinds
    and, in a team cache, the group given what was made before the lock is tried or released): a
    lock in datasets' cache named and moded by datasets' rules, and one class for filelock to model
    its constructor for (once per class and process, ~475 Python calls).

    The lock sits beside the input's cache files and is named after its fingerprint.  The
    first rank takes it and computes (datasets publishes the result by temp file + rename);
    every other rank waits until it is free, lets go at once, and then runs ``map`` unlocked,
    which finds the published cache file and loads it -- in parallel, instead of handing an
    exclusive lock from rank to rank for a cache hit.  If the first rank died without
    publishing, the others compute, as datasets would without sharedfs.  In-memory
    datasets, ``keep_in_memory=True`` and disabled caching have no shared result to reuse,
    so they run unlocked.
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
