"""PyTorch: DataLoader worker caps, and compile caches (C++ extensions, Inductor) that survive shared storage.

One module, several shims, each on the torch module it patches, applied when that
module is imported (never imported to be patched: ``torch._inductor`` costs seconds):

``torch`` (``torch.utils.data``)
    ``num_workers=16`` copied from a workstation config onto a Slurm task that owns
    2 CPUs starts 16 processes on 2 cores, and for webdataset/wids every one of them
    opens, downloads and caches shards on its own.  ``DataLoader.__init__`` gets the
    worker count capped (:mod:`sharedfs.workers`: CPU affinity, ``SLURM_CPUS_PER_TASK``,
    the cgroup quota, or ``SHAREDFS_MAX_WORKERS``) -- only for datasets a framework
    shim claimed (webdataset and wids register a predicate); any other DataLoader is
    built exactly as the user wrote it.

``torch.cpp_ext`` (``torch.utils.cpp_extension``)
    ``load()`` -- how DeepSpeed JIT-compiles its ops -- serialises builds with a
    ``FileBaton``: ``<build_dir>/lock`` created ``O_EXCL`` and removed only on the
    normal path.  A builder killed by Slurm, the OOM killer or Ctrl-C leaves it, and
    every later ``load()`` of that extension, on every node, spins in
    ``FileBaton.wait()`` forever without a word (pytorch#189245).  The baton becomes
    :class:`SharedFSBaton`: a sharedfs lock (holder record, so a dead builder is
    recovered at once on its node and through Slurm elsewhere) around torch's own build,
    and every process runs that build step (ninja: a no-op once built) under the lock
    before it loads, so a build that died half-way is finished, never loaded.  The
    extensions root (``TORCH_EXTENSIONS_DIR``'s default) follows the cache placement.

``torch.filelock`` (``torch.utils._filelock``)
    Inductor, Dynamo's profile cache and the Triton bundler take
    ``torch.utils._filelock.FileLock`` (``filelock.FileLock``: flock) in the Inductor
    cache.  Lustre without ``-o flock`` makes filelock >= 3.24 swap the lock's class
    for ``SoftFileLock`` mid-acquire, after which torch's subclass fails in its own
    ``__exit__`` (``InductorError: TypeError: super(type, obj): obj must be an instance
    or subtype of type``); older filelock raises "FileSystem does not appear to support
    flock"; NFS without lockd raises ENOLCK; GPFS flock excludes one node.  The class
    becomes a :func:`sharedfs.locks.drop_in` of torch's own (its wait counters stay).

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

import errno
import functools
import inspect
import logging
import os
import re
import sys
import tempfile
import threading
import time
import uuid
from types import ModuleType
from typing import Any, Callable

from sharedfs import workers
from sharedfs._policy import Policy
from sharedfs.hookspecs import hookimpl
from sharedfs.log import decision
from sharedfs.records import HolderRecord
from sharedfs.safefile import create_exclusive, read_untrusted, write_all
from sharedfs.shim import Shim, ShimContext

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

#: The sharedfs lock beside torch's baton: ``<build_dir>/lock`` + this.  Not the baton's own name: a
#: native lock file stays on disk after release, and torch without sharedfs would wait for it forever.
GUARD_SUFFIX = ".sharedfs"
#: What sharedfs writes into the batons it creates (``HolderRecord.kind``): torch's own are empty.
BATON_KIND = "torch-baton"
#: A process waiting for a baton of torch without sharedfs says so after this long, then every REPORT_EVERY.
REPORT_AFTER = 30.0
REPORT_EVERY = 120.0
#: ``link(2)`` refusals that mean "this filesystem has no hard links", not "the name exists".
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK, errno.EXDEV})


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
      sharedfs builder that died (a live one would still hold the lock): it is removed;
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

        self._guard = lock(lock_file_path + GUARD_SUFFIX, timeout=-1, policy=self.policy)

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
                _unlink_if_same(self.lock_file_path, self._held)
                self._held = None
        finally:
            self._guard.release()

    # -- torch's baton, taken while the sharedfs lock is held -----------------------------------------

    def _take_baton(self) -> None:
        record = HolderRecord.mine(self.policy.node_id, BATON_KIND).to_bytes()
        while True:
            held = _create_with(self.lock_file_path, record)
            if held is not None:
                self._held = held
                return
            if not self._remove_if_dead_sharedfs_builder():
                self._wait_for_foreign_baton()

    def _remove_if_dead_sharedfs_builder(self) -> bool:
        """True when the baton is gone now: released meanwhile, or left by a dead sharedfs builder and removed."""
        seen = _read(self.lock_file_path)
        if seen is None:
            return True
        data, identity = seen
        record = HolderRecord.parse(data) if data else None
        if record is None or record.kind != BATON_KIND:
            return False
        # This process holds the lock every sharedfs builder holds while its baton exists: that builder is gone.
        decision(f"torch extension build in {os.path.dirname(self.lock_file_path)} was left unfinished by "
                 f"{record.describe()}, which is gone; building it again", level=logging.WARNING, every_rank=True)
        _unlink_if_same(self.lock_file_path, identity)
        return True

    def _wait_for_foreign_baton(self) -> None:
        """Wait, as torch does, while a baton of torch without sharedfs exists; say what it is after a while."""
        started = time.monotonic()
        report_at = started + REPORT_AFTER
        while True:
            seen = _read(self.lock_file_path)
            if seen is None:
                return
            data = seen[0]
            record = HolderRecord.parse(data) if data else None
            if record is not None and record.kind == BATON_KIND:
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


def _read(path: str) -> tuple[bytes, tuple[int, int]] | None:
    """The baton's bytes and identity; ``None`` when it is gone.  Never follows a planted symlink or FIFO."""
    try:
        got = read_untrusted(path)
    except FileNotFoundError:
        return None
    if got is None:
        return b"", (-1, -1)  # not a file sharedfs wrote: counts as a foreign baton
    data, st = got
    return data, (st.st_dev, st.st_ino)


def _create_with(path: str, data: bytes) -> tuple[int, int] | None:
    """Create ``path`` holding ``data`` in one step; its (st_dev, st_ino), or ``None`` when it exists.

    A hard link of a complete temporary file, so no waiter ever reads a half-written
    record (and a builder killed in between leaves no empty baton, which would read as
    torch's own).  NFS may retransmit a link whose reply was lost and answer EEXIST for
    our own success: the temporary file's link count then tells.  Without hard links the
    file is created ``O_EXCL`` and written at once.
    """
    temp = f"{path}.{uuid.uuid4().hex}.tmp"
    fd = create_exclusive(temp, 0o666)
    try:
        write_all(fd, data)
        st = os.fstat(fd)
        try:
            os.link(temp, path)
        except FileExistsError:
            if os.fstat(fd).st_nlink < 2:
                return None
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            return _create_unlinked(path, data)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)
        try:
            os.unlink(temp)
        except OSError:
            pass


def _create_unlinked(path: str, data: bytes) -> tuple[int, int] | None:
    try:
        fd = create_exclusive(path, 0o666)
    except FileExistsError:
        return None
    try:
        write_all(fd, data)
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def _unlink_if_same(path: str, identity: tuple[int, int]) -> None:
    """Remove ``path`` only while it is still the file ``identity`` names (never someone else's new baton)."""
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == identity:
            os.unlink(path)
    except FileNotFoundError:
        pass


class TorchExtensionsShim(Shim):
    name = "torch.cpp_ext"
    target = "torch.utils.cpp_extension"
    distribution = "torch"
    # _jit_compile's try_acquire/wait/release baton and get_default_build_root are unchanged since 1.x;
    # tested with 2.13.0 (tests/integration/test_torch.py).
    supported = ">=2.1,<3"
    cache_env = "TORCH_EXTENSIONS_DIR"
    # torch._appdirs.user_cache_dir("torch_extensions"); torch adds py<ver>_<accelerator>/ below it.
    cache_default = "~/.cache/torch_extensions"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        original = module.__dict__.get("FileBaton")
        # A torch whose _jit_compile took a real lock instead (pytorch#189245's fix) may keep FileBaton
        # imported for compatibility; it then takes torch.utils._filelock.FileLock, the next shim's.
        if isinstance(original, type) and not issubclass(original, SharedFSBaton):
            self.patcher.setattr(module, "FileBaton", baton_class(original, policy))
        _place_default(self, module, "get_default_build_root", _placed(context))


# -- torch.utils._filelock: Inductor's, Dynamo's and the Triton bundler's locks -------------------------


class TorchFileLockShim(Shim):
    name = "torch.filelock"
    target = "torch.utils._filelock"
    distribution = "torch"
    # torch.utils._filelock (filelock.FileLock plus wait counters) is what torch 2.x's compile caches
    # import, each inside the function that locks or at module level after this module; tested with 2.13.0.
    supported = ">=2.1,<3"

    #: Modules that bind FileLock by name at import: patched here only when already imported
    #: (sharedfs.enable() late); imported after this shim, they bind the replacement themselves.
    LOCK_SITES = ("torch._inductor.select_algorithm", "torch._inductor.triton_bundler", "torch._inductor.cache")

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
