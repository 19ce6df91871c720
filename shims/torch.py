"""PyTorch: DataLoader worker caps, compile caches placed on shared storage, and torch's locks made safe there.

Why each shim does what it does: docs/architecture.md, "The torch shims".
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import tempfile
from types import ModuleType
from typing import Any, Callable

from sharedfs.types import Policy, Shim, ShimContext, hookimpl, workers

#: Written into a shim's replacement so ``sharedfs status``, a traceback or a debugger shows who runs.
_NAME_AND_DOC = ("__name__", "__qualname__", "__doc__")


# -- DataLoader worker caps -------------------------------------------------------------------------


class TorchDataLoaderShim(Shim):
    name = "torch"
    # Imported by `import torch`; DataLoader lives in its submodule dataloader.
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


# -- torch.utils.cpp_extension: the build lock ---------------------------------------------------------
#
# The lock protocols are sharedfs.locks.torchbaton's, imported in apply: sharedfs.locks loads filelock
# (44 M instructions), which a torch process pays for only once it imports cpp_extension or takes a lock.


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
        if in_use is not None:
            from sharedfs.types import SharedFSBaton, baton_class, build_lock_class, torch_lock_class
        if in_use == "FileBaton":
            original = module.__dict__["FileBaton"]
            if not issubclass(original, SharedFSBaton):
                self.patcher.setattr(module, "FileBaton", baton_class(original, policy, __name__))
        elif in_use == "FileLock":
            # cpp_extension binds torch.utils._filelock.FileLock at its import: torch's own class when
            # sharedfs.enable() comes later, the torch.filelock shim's drop-in otherwise.  Put back first
            # what torch binds without sharedfs, so that unpatch() leaves torch's own class (that
            # drop-in's policy is not this shim's to keep).
            current = module.__dict__["FileLock"]
            own = torch_lock_class(current)
            if current is not own:
                module.__dict__["FileLock"] = own
            self.patcher.setattr(module, "FileLock", build_lock_class(own, policy, __name__))
        _place_default(self, module, "get_default_build_root", _placed(context))


# -- torch.utils._filelock: Inductor's, Dynamo's and the Triton bundler's locks -------------------------


class TorchFileLockShim(Shim):
    name = "torch.filelock"
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
        from sharedfs.types import drop_in

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
