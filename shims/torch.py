"""PyTorch: DataLoader worker caps, and compile caches (C++ extensions, Inductor) that survive shared storage.

One module, several shims, each on the torch module it patches, applied when that
module is imported (never imported to be patched: ``torch._inductor`` costs seconds):

``torch`` (``torch.utils.data``)
    ``num_workers=16`` copied from a workstation config onto a Slurm task that owns
    2 CPUs starts 16 processes on 2 cores, and for webdataset/wids every one of them
    opens, downloads and caches shards on its own.  ``DataLoader.__init__`` gets the
    worker count capped (:mod:`sharedfs.cluster.workers`: CPU affinity, ``SLURM_CPUS_PER_TASK``,
    the cgroup quota, or ``SHAREDFS_MAX_WORKERS``) -- only for datasets a framework
    shim claimed (webdataset and wids register a predicate); any other DataLoader is
    built exactly as the user wrote it.

``torch.cpp_ext`` (``torch.utils.cpp_extension``)
    ``load()`` -- how DeepSpeed JIT-compiles its ops -- serialises builds with
    ``<build_dir>/lock``, in one of two ways, read from ``_jit_compile``'s code:

    torch < 2.14: a ``FileBaton``, the file created ``O_EXCL`` and removed only on the
    normal path.  A builder killed by Slurm, the OOM killer or Ctrl-C leaves it, and every
    later ``load()`` of that extension, on every node, spins in ``FileBaton.wait()`` forever
    without a word (pytorch#189245).  The baton becomes :class:`SharedFSBaton`: a sharedfs
    lock (holder record, so a dead builder is recovered at once on its node and through
    Slurm elsewhere) around torch's own build, and every process runs that build step
    (ninja: a no-op once built) under the lock before it loads, so a build that died
    half-way is finished, never loaded.

    torch >= 2.14 (pytorch#189245's fix): ``with torch.utils._filelock.FileLock(<build_dir>/lock)``,
    filelock's flock, which the kernel drops with a killed builder, and whoever takes it
    builds (ninja) before loading.  On local disks that is the whole fix; on cluster storage
    filelock's lock has the failures the ``torch.filelock`` shim below lists: NFS without
    lockd fails every ``load()`` (ENOLCK); Lustre without ``-o flock`` (ENOSYS) makes
    filelock >= 4.3 fall back to the file's existence, which a killed builder leaves and
    which filelock breaks only on the same host and only where the filesystem can exchange
    two names atomically (``renameat2``; NFS and most FUSE daemons cannot), so the rerun waits forever
    (filelock 3.24-4.2 instead breaks torch's subclass in ``__exit__``, older filelock
    raises); GPFS flock excludes one node only, so two nodes compile into one directory at
    once.  cpp_extension's ``FileLock`` (bound at its import, so also rebound when
    ``sharedfs.enable()`` comes after it) becomes a drop-in that holds the sharedfs lock and
    then -- unless that already is a flock of the same file -- torch's own
    ``<build_dir>/lock`` the way torch without sharedfs holds it on that filesystem (flock;
    its existence where flock answers ENOSYS; nothing where nobody can lock:
    :class:`~sharedfs.locks.stock.StockLockFile`), so a builder of another environment (or
    ``SHAREDFS_DISABLE``) sharing the directory waits for sharedfs's and is waited for.

    A lock file that torch without sharedfs polls changes hands otherwise only in one rename
    (:func:`~sharedfs.fs.polledfile.replace_foreign`): the dead sharedfs builder's baton or lock
    file is replaced, never removed and created again, so no poller finds it free in between.  The
    extensions root (``TORCH_EXTENSIONS_DIR``'s default) follows the cache placement.

``torch.filelock`` (``torch.utils._filelock``)
    Inductor, Dynamo's profile cache, the Triton bundler and (torch >= 2.14) cpp_extension
    take ``torch.utils._filelock.FileLock`` (``filelock.FileLock``: flock).  Lustre without
    ``-o flock`` makes filelock 3.24-4.2 swap the lock's class for ``SoftFileLock``
    mid-acquire, after which torch's subclass fails in its own ``__exit__`` (``TypeError:
    super(type, obj): obj must be an instance or subtype of type``); filelock 4.3 falls back
    without swapping (its soft lock then outlives a killed holder, see above); older filelock
    raises "FileSystem does not appear to support flock"; NFS without lockd raises ENOLCK
    with every filelock; GPFS flock excludes one node.  The class becomes a
    :func:`sharedfs.locks.drop_in` of torch's own (its wait counters stay).

``torch.inductor`` (``torch._inductor.runtime.cache_dir_utils``)
    ``TORCHINDUCTOR_CACHE_DIR``'s default (``<tmp>/torchinductor_<user>``) follows the
    cache placement.  Triton's cache under Inductor (``<inductor cache>/triton/<device>``
    unless ``TRITON_CACHE_DIR`` is set) follows with it.

A placement is applied by replacing the framework's *default* function with a
:class:`_PlacedDefault` that answers the placed directory, or the original default
while nothing is placed; a variable the user set is never touched (the cache plugin
keeps it).  Modules that bound the replacement by name at import keep a dispatcher
that follows re-application and ``unpatch``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import re
import sys
import tempfile
import threading
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from sharedfs.cluster import workers
from sharedfs.fs.polledfile import create_whole, read_with_identity, record_beside, replace_foreign, unlink_quietly
from sharedfs.fs.recordfile import identity as _identity
from sharedfs.fs.recordfile import unlink_if_same
from sharedfs.machinery.log import decision
from sharedfs.types import HolderRecord, Policy, Shim, ShimContext, hookimpl

if TYPE_CHECKING:
    from sharedfs.locks.stock import StockLockFile

log = logging.getLogger("sharedfs")

#: Written into a shim's replacement so ``sharedfs status``, a traceback or a debugger shows who runs.
_NAME_AND_DOC = ("__name__", "__qualname__", "__doc__")


# -- DataLoader worker caps -------------------------------------------------------------------------


class TorchDataLoaderShim(Shim):
    name = "torch"
    # Imported by `import torch`; DataLoader lives in its submodule dataloader.
    target = "torch.utils.data"
    distribution = "torch"
    # DataLoader.__init__'s parameters (dataset, num_workers, ...) are stable from 1.x to 2.x.
    supported = ">=1.13,<3"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        loader = module.DataLoader
        self.patcher.setattr(loader, "__init__", make_init(loader.__dict__["__init__"], policy))


def make_init(original: Any, policy: Policy) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if workers.PREDICATES:
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:
                bound = None  # let the real __init__ report the bad call in its own words
            if bound is not None:
                owner = workers.owner(bound.arguments.get("dataset"))
                asked = bound.arguments.get("num_workers", 0)
                if owner is not None and isinstance(asked, int) and asked > 0:
                    used = workers.capped(asked, owner, policy.max_workers)
                    if used != asked:
                        bound.arguments["num_workers"] = used
                        args, kwargs = bound.args[1:], bound.kwargs
        original(self, *args, **kwargs)

    return __init__


# -- cache placement: the framework's default, or the placed directory --------------------------------


class _PlacedDefault:
    """Stands in for a framework's default-directory function: the placed directory, else the original's answer.

    ``path`` is set through the shim's patcher, so ``unpatch`` resets it and a module that
    bound this object by name at import falls back to the framework's own default.
    """

    path: str | None = None

    def __init__(self, original: Callable[[], str]) -> None:
        self.original = original
        functools.update_wrapper(self, original, assigned=_NAME_AND_DOC, updated=())

    def __call__(self) -> str:
        return self.path or self.original()


#: One dispatcher per original function, reused when a shim is applied again (sharedfs.configure): modules
#: that bound it by name at import then follow the new placement too.
_dispatchers: dict[Callable[[], str], _PlacedDefault] = {}


def _place_default(shim: Shim, module: ModuleType, function: str, path: str | None) -> None:
    """Put a :class:`_PlacedDefault` in ``module.function``, answering ``path`` when one is placed."""
    current = module.__dict__[function]
    if not isinstance(current, _PlacedDefault):
        placed = _dispatchers.setdefault(current, _PlacedDefault(current))
        shim.patcher.setattr(module, function, placed)
    else:
        placed = current
    if path:
        shim.patcher.setattr(placed, "path", path)


def _placed(context: ShimContext) -> str | None:
    return context.cache.path if context.cache is not None else None


# -- torch.utils.cpp_extension: the build baton ------------------------------------------------------
#
# The names of the files (sharedfs.locks.names, which `sharedfs locks` reads back), how stock filelock holds a
# file (sharedfs.locks.stock) and when a waiter speaks (sharedfs.locks.reporting) are imported where they are
# used: sharedfs.locks loads filelock (44 M instructions), which a torch process pays for only once it builds
# or takes a lock (see TorchFileLockShim.apply).  The lock files' own protocol is sharedfs.fs.polledfile's.


class SharedFSBaton:
    """``FileBaton`` for ``cpp_extension._jit_compile``, whose protocol is kept: ``try_acquire`` ->
    build under the baton -> ``release``; else ``wait`` -> load.

    ``try_acquire`` waits for the sharedfs lock ``<build_dir>/lock.sharedfs`` (forever, as
    torch waits; its holder record lets sharedfs break it when the holder is dead, and a
    long wait names the holder) and then always answers True: every process runs torch's
    build step under the lock before it loads.  That step is ninja, which rebuilds exactly
    what a killed build left unfinished (an output without a ``.ninja_log`` entry) and is a
    no-op once the extension is built, so no process ever loads a half-built module.

    Inside the lock the process also holds torch's own baton ``<build_dir>/lock``, with its
    holder record in it, so torch without sharedfs (another environment, or
    ``SHAREDFS_DISABLE``) sharing the directory waits for sharedfs builders and is waited for:

    * a baton holding a sharedfs record while this process holds the lock was left by a
      sharedfs builder that died (a live one would still hold the lock): it is replaced by this
      process's in one rename (:func:`replace_foreign`), never removed first;
    * an empty baton is torch's own, from a builder without sharedfs that nobody can
      vouch for: it is waited out as torch does, saying after 30 s which file to remove.
    """

    #: The policy this class applies (set on the per-policy subclass :func:`baton_class` makes).
    policy: Policy

    def __init__(self, lock_file_path: str, wait_seconds: float = 0.1, warn_after_seconds: float | None = None) -> None:
        self.lock_file_path = lock_file_path
        self.wait_seconds = wait_seconds
        self.warn_after_seconds = warn_after_seconds
        self.fd = None  # torch's attribute; the baton holds no descriptor here
        self._held: tuple[int, int] | None = None  # (st_dev, st_ino) of the baton this process created
        from sharedfs.locks import lock  # see TorchFileLockShim.apply
        from sharedfs.locks.names import TORCH_GUARD_SUFFIX

        self._guard = lock(lock_file_path + TORCH_GUARD_SUFFIX, timeout=-1, policy=self.policy)

    def try_acquire(self) -> bool:
        self._guard.acquire()
        try:
            self._take_baton()
        except BaseException:
            self._guard.release()
            raise
        return True

    def wait(self) -> None:
        """Unused (:meth:`try_acquire` always builds); kept for callers of torch's interface: wait until free."""
        with self._guard:
            self._wait_for_foreign_baton()

    def release(self) -> None:
        try:
            if self._held is not None:
                unlink_if_same(self.lock_file_path, self._held)
                self._held = None
        finally:
            self._guard.release()

    # -- torch's baton, taken while the sharedfs lock is held -----------------------------------------

    def _take_baton(self) -> None:
        from sharedfs.locks.names import TORCH_BATON_KIND

        record = HolderRecord.mine(self.policy.node_id, TORCH_BATON_KIND).to_bytes()
        while True:
            held = create_whole(self.lock_file_path, record)
            if held is None:
                held = self._take_over_from_dead_sharedfs_builder(record)
            if held is not None:
                self._held = held
                return
            self._wait_for_foreign_baton()

    def _take_over_from_dead_sharedfs_builder(self, record: bytes) -> tuple[int, int] | None:
        """This process's baton in place of one a dead sharedfs builder left (identity), else ``None``.

        Replaced in one rename (:func:`replace_foreign`), never removed and created again: torch
        without sharedfs waiting in ``FileBaton.wait()`` would see it gone in between and load the
        extension the dead builder left half-built.
        """
        from sharedfs.locks.names import TORCH_BATON_KIND

        seen = read_with_identity(self.lock_file_path)
        if seen is None:
            return None  # released meanwhile: the next attempt creates it
        data, identity = seen
        left = HolderRecord.parse(data) if data else None
        if left is None or left.kind != TORCH_BATON_KIND:
            return None
        # This process holds the lock every sharedfs builder holds while its baton exists: that builder is gone.
        ours = record_beside(self.lock_file_path, record)
        try:
            mine = _identity(os.lstat(ours))
            if not replace_foreign(self.lock_file_path, identity, ours):
                return None
        finally:
            unlink_quietly(ours)
        decision(f"torch extension build in {os.path.dirname(self.lock_file_path)} was left unfinished by "
                 f"{left.describe()}, which is gone; building it again", level=logging.WARNING, every_rank=True)
        return mine

    def _wait_for_foreign_baton(self) -> None:
        """Wait, as torch does, while a baton of torch without sharedfs exists; say what it is after a while."""
        from sharedfs.locks.names import TORCH_BATON_KIND
        from sharedfs.locks.reporting import REPORT_AFTER, REPORT_EVERY

        started = time.monotonic()
        report_at = started + REPORT_AFTER
        while True:
            seen = read_with_identity(self.lock_file_path)
            if seen is None:
                return
            data = seen[0]
            record = HolderRecord.parse(data) if data else None
            if record is not None and record.kind == TORCH_BATON_KIND:
                return  # a sharedfs baton: the caller decides about it under the lock
            now = time.monotonic()
            if now >= report_at:
                report_at = now + REPORT_EVERY
                log.warning("still waiting after %.0f s for %s, the build lock of a torch process without sharedfs "
                            "(another environment, or SHAREDFS_DISABLE): it holds no record, so nobody can tell "
                            "whether its builder still runs, and torch waits for it forever. If no build of this "
                            "extension runs on any node, remove it: rm -f %s",
                            now - started, self.lock_file_path, self.lock_file_path)
            time.sleep(self.wait_seconds)


_baton_classes: dict[tuple[type, Policy], type] = {}
_baton_lock = threading.Lock()


def baton_class(original: type, policy: Policy) -> type:
    """``SharedFSBaton`` under ``policy``, a subclass of torch's ``FileBaton`` (``isinstance`` keeps working)."""
    with _baton_lock:
        made = _baton_classes.get((original, policy))
        if made is None:
            made = type(original.__name__, (SharedFSBaton, original), {
                "__module__": __name__, "__qualname__": original.__qualname__, "policy": policy,
                "__doc__": f"sharedfs drop-in for {original.__module__}.{original.__qualname__}: " +
                           (SharedFSBaton.__doc__ or ""),
            })
            _baton_classes[(original, policy)] = made
        return made


# -- torch >= 2.14: torch.utils._filelock.FileLock(<build_dir>/lock) ------------------------------------


class SharedFSBuildLock:
    """In front of a drop-in of ``torch.utils._filelock.FileLock``: cpp_extension's build lock (torch >= 2.14).

    ``acquire`` takes the sharedfs lock on ``<build_dir>/lock`` (its kind chosen for the
    filesystem, with a holder record: a dead builder is recognised on any node), then --
    unless that already is a flock of the file itself -- torch's own ``<build_dir>/lock`` the
    way torch without sharedfs holds it there (:class:`~sharedfs.locks.stock.StockLockFile`), waiting for it as
    torch waits.  So a builder of another environment (or ``SHAREDFS_DISABLE``) sharing the
    directory waits for sharedfs's builders and is waited for.  The last release lets go of
    torch's file first.
    """

    lock_file: str
    kind: str
    timeout: float
    _context: Any
    _sharedfs_policy: Policy | None

    def acquire(self, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        if not self.__dict__.get("_sharedfs_fitted"):
            self._fit_kind_to_stock_lock()
        proxy = super().acquire(*args, **kwargs)  # type: ignore[misc]
        fd = self._context.lock_file_fd
        holds: dict[int, StockLockFile | None] = self.__dict__.setdefault("_sharedfs_stock", {})
        if fd is None or fd in holds:
            return proxy  # re-entered: this hold already has torch's file
        try:
            holds[fd] = self._hold_stock_file(started, args, kwargs)
        except BaseException:
            self.release()  # type: ignore[attr-defined]
            raise
        return proxy

    def _fit_kind_to_stock_lock(self) -> None:
        """Where torch's own lock is the file's existence (flock answers ENOSYS), sharedfs's lock on that file is an
        existence lock (its marker) too: a native kind would open the file to lock it, create it, and leave it
        behind, which torch without sharedfs takes for a lock held forever (a record-less marker)."""
        from sharedfs.locks.stock import EXISTENCE, stock_mechanism

        try:
            mechanism = stock_mechanism(os.path.dirname(os.path.abspath(self.lock_file)))
        except FileNotFoundError:
            return  # the build directory is not there yet: decided at the next acquire
        self.__dict__["_sharedfs_fitted"] = True
        policy = self._sharedfs_policy
        if mechanism == EXISTENCE and policy is not None and policy.lock not in ("soft", "lease"):
            self._sharedfs_policy = dataclasses.replace(policy, lock="soft", sources={
                **policy.sources, "lock": "torch's build lock (torch's own lock file is its existence here)"})

    def _release(self) -> None:
        held = self.__dict__.get("_sharedfs_stock", {}).pop(self._context.lock_file_fd, None)
        try:
            if held is not None:
                held.release()
        finally:
            super()._release()  # type: ignore[misc]

    def _hold_stock_file(self, started: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> StockLockFile | None:
        from sharedfs.locks.reporting import REPORT_AFTER, REPORT_EVERY
        from sharedfs.locks.stock import FLOCK, StockLockFile, stock_mechanism

        if self.kind == FLOCK:
            return None  # the sharedfs lock is a flock of this very file: torch's own way already
        path = os.path.abspath(self.lock_file)
        mechanism = stock_mechanism(os.path.dirname(path))
        if mechanism is None:
            return None  # torch without sharedfs cannot lock here at all
        how = "flock" if mechanism == FLOCK else "its existence"
        decision(f"torch extension builds in {os.path.dirname(os.path.dirname(path))} also hold each build's "
                 f"lock file as torch without sharedfs does there ({how}): builders in an environment without "
                 "sharedfs wait for them and are waited for")
        held = StockLockFile(path, mechanism)
        timeout = kwargs.get("timeout", args[0] if args else None)
        if timeout is None:
            timeout = getattr(self, "timeout", -1)
        blocking = kwargs.get("blocking", getattr(self, "blocking", True))
        report_at = time.monotonic() + REPORT_AFTER
        while not held.try_acquire():
            now = time.monotonic()
            if blocking is False or (timeout is not None and 0 <= timeout <= now - started):
                from sharedfs.errors import LockTimeout

                raise LockTimeout(path, f"The file lock '{path}' could not be acquired: sharedfs holds its own lock "
                                        f"on it, and torch's own lock file is held by {held.holder()}, a torch "
                                        "process without sharedfs (another environment, or SHAREDFS_DISABLE).")
            if now >= report_at:
                report_at = now + REPORT_EVERY
                hint = ("" if mechanism == FLOCK else
                        f" If no build of this extension runs on any node, remove it: rm -f {path}")
                log.warning("still waiting after %.0f s for %s, the build lock of a torch process without sharedfs "
                            "(another environment, or SHAREDFS_DISABLE), held by %s; torch waits for it as long.%s",
                            now - started, path, held.holder(), hint)
            time.sleep(0.1)
        if held.took_over:
            decision(f"{path} was left by a sharedfs builder that is gone (its second name {held.took_over}); "
                     "taken over in one rename, building again", level=logging.WARNING, every_rank=True)
        return held


_build_lock_classes: dict[tuple[type, Policy], type] = {}


def build_lock_class(own: type, policy: Policy) -> type:
    """cpp_extension's ``FileLock`` under ``policy``: :class:`SharedFSBuildLock` on a drop-in of torch's ``own``."""
    from sharedfs.locks import drop_in  # torch imported filelock for its own lock module already

    with _baton_lock:
        made = _build_lock_classes.get((own, policy))
        if made is None:
            made = type(own.__name__, (SharedFSBuildLock, drop_in(own, policy, __name__)), {
                "__module__": __name__, "__qualname__": own.__qualname__,
                "__doc__": f"sharedfs drop-in for {own.__module__}.{own.__qualname__} in torch.utils.cpp_extension: " +
                           (SharedFSBuildLock.__doc__ or ""),
            })
            _build_lock_classes[(own, policy)] = made
        return made


def _torch_lock_class(current: type) -> type:
    """torch's own class behind ``current`` (which may be a sharedfs drop-in bound at cpp_extension's import)."""
    from sharedfs.locks import SharedFSLockMixin

    for cls in current.__mro__:
        if not issubclass(cls, (SharedFSLockMixin, SharedFSBuildLock)):
            return cls
    return current  # pragma: no cover - a drop-in always derives from the framework's class


def _build_lock_in_use(module: ModuleType) -> str | None:
    """Which build lock ``_jit_compile`` takes: ``"FileBaton"`` (torch < 2.14), ``"FileLock"`` (>= 2.14), or neither."""
    code = getattr(module.__dict__.get("_jit_compile"), "__code__", None)
    names = code.co_names if code is not None else ()
    for name in ("FileLock", "FileBaton"):
        if name in names and isinstance(module.__dict__.get(name), type):
            return name
    return None


class TorchExtensionsShim(Shim):
    name = "torch.cpp_ext"
    target = "torch.utils.cpp_extension"
    distribution = "torch"
    # _jit_compile's try_acquire/wait/release baton (< 2.14), its `with FileLock(<build_dir>/lock)` (>= 2.14)
    # and get_default_build_root; tested with 2.13.0, 2.14.1 and 2.15.0 (tests/integration/test_torch.py).
    supported = ">=2.1,<3"
    cache_env = "TORCH_EXTENSIONS_DIR"
    # torch._appdirs.user_cache_dir("torch_extensions"); torch adds py<ver>_<accelerator>/ below it.
    cache_default = "~/.cache/torch_extensions"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        # Which lock _jit_compile takes, read from its code: a release may keep the other name imported.
        in_use = _build_lock_in_use(module)
        if in_use == "FileBaton":
            original = module.__dict__["FileBaton"]
            if not issubclass(original, SharedFSBaton):
                self.patcher.setattr(module, "FileBaton", baton_class(original, policy))
        elif in_use == "FileLock":
            # cpp_extension binds torch.utils._filelock.FileLock at its import: torch's own class when
            # sharedfs.enable() comes later, the torch.filelock shim's drop-in otherwise.  Put back first
            # what torch binds without sharedfs, so that unpatch() leaves torch's own class (that
            # drop-in's policy is not this shim's to keep).
            current = module.__dict__["FileLock"]
            own = _torch_lock_class(current)
            if current is not own:
                module.__dict__["FileLock"] = own
            self.patcher.setattr(module, "FileLock", build_lock_class(own, policy))
        _place_default(self, module, "get_default_build_root", _placed(context))


# -- torch.utils._filelock: Inductor's, Dynamo's and the Triton bundler's locks -------------------------


class TorchFileLockShim(Shim):
    name = "torch.filelock"
    target = "torch.utils._filelock"
    distribution = "torch"
    # torch.utils._filelock (filelock.FileLock plus wait counters) is what torch 2.x's compile caches
    # import, each inside the function that locks or at module level after this module, and what
    # cpp_extension builds under from 2.14; tested with 2.13.0, 2.14.1 and 2.15.0.
    supported = ">=2.1,<3"

    #: Modules that bind FileLock by name at import: patched here only when already imported
    #: (sharedfs.enable() late); imported after this shim, they bind the replacement themselves.
    #: cpp_extension (torch >= 2.14) then gets the torch.cpp_ext shim's build lock on top, unless
    #: that shim is off.
    LOCK_SITES = ("torch._inductor.select_algorithm", "torch._inductor.triton_bundler", "torch._inductor.cache",
                  "torch.utils.cpp_extension")

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        # sharedfs.locks (and filelock, 44 M instructions) load when torch loads its own lock
        # module, not with every `import torch`: most torch processes never take one.
        from sharedfs.locks import drop_in

        original = module.FileLock
        replacement = drop_in(original, policy, __name__)
        self.patcher.setattr(module, "FileLock", replacement)
        for site in self.LOCK_SITES:
            site_module = _loaded(site)
            if site_module is not None and site_module.__dict__.get("FileLock") is original:
                self.patcher.setattr(site_module, "FileLock", replacement)


def _loaded(name: str) -> ModuleType | None:
    return sys.modules.get(name)


# -- torch._inductor.runtime.cache_dir_utils: where Inductor (and Triton under it) cache -----------------


class TorchInductorShim(Shim):
    name = "torch.inductor"
    target = "torch._inductor.runtime.cache_dir_utils"
    distribution = "torch"
    # cache_dir() -> TORCHINDUCTOR_CACHE_DIR or default_cache_dir() since torch 2.1; tested with 2.13.0.
    supported = ">=2.1,<3"
    cache_env = "TORCHINDUCTOR_CACHE_DIR"

    @property
    def cache_default(self) -> str:  # type: ignore[override]
        """torch's default_cache_dir(): ``<tempfile.gettempdir()>/torchinductor_<user>``, computed as torch does.

        A property: ``gettempdir()`` probes the temporary directories, which only a process that
        uses Inductor should pay for.
        """
        try:
            import getpass  # here, not at every `import torch`

            user = getpass.getuser()
        except (KeyError, ModuleNotFoundError, OSError):
            user = f"uid_{os.getuid()}"
        return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))

    #: The directory this shim placed last (bookkeeping for re-application, not a patch).
    _exported: str | None = None

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        # cache_dir() calls default_cache_dir() only while TORCHINDUCTOR_CACHE_DIR is unset, then exports
        # its answer to that variable itself (already while torch._inductor imports), so compile workers
        # inherit the placement.  Re-applied later (sharedfs.configure), the kernel sees that variable set
        # and places nothing: Inductor keeps working where it started, and so must its other users of
        # default_cache_dir() (precompiled headers), instead of falling back to torch's /tmp default.
        path = _placed(context)
        if not path and self._exported and os.environ.get(self.cache_env or "") == self._exported:
            path = self._exported
        _place_default(self, module, "default_cache_dir", path)
        self._exported = path


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [TorchDataLoaderShim(), TorchExtensionsShim(), TorchFileLockShim(), TorchInductorShim()]
