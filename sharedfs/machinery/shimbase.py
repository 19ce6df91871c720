"""The uniform shape of a shim: what it targets, which versions, ``patch`` / ``unpatch``.

Every change goes through a :class:`Patcher`, so ``unpatch`` restores exactly what was there.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, ClassVar, MutableMapping

import _sharedfs_bootstrap as _bootstrap
from sharedfs.machinery import pending
from sharedfs.machinery.standin import unwrap
from sharedfs.model.policy import CachePlacement, Policy
from sharedfs.model.structs import frozen

_MISSING = object()


class Patcher:
    """Records every attribute and mapping item it changes, and restores them in reverse."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Any, Any, Any]] = []

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        # Remember the object's *own* value: an inherited attribute is restored by deletion.
        own = getattr(obj, "__dict__", None)
        old = own.get(name, _MISSING) if own is not None else getattr(obj, name, _MISSING)
        # A stand-in or a pending guard (sharedfs's, waiting for this patch): restoring gives the original.
        old = pending.unwrap(unwrap(old))
        self._undo.append(("attr", obj, name, old))
        setattr(obj, name, value)

    def setitem(self, mapping: MutableMapping[str, Any], key: str, value: Any) -> None:
        self._undo.append(("item", mapping, key, mapping.get(key, _MISSING)))
        mapping[key] = value

    def restore(self) -> None:
        while self._undo:
            kind, obj, key, old = self._undo.pop()
            if kind == "attr":
                if old is _MISSING:
                    delattr(obj, key)
                else:
                    setattr(obj, key, old)
            elif old is _MISSING:
                obj.pop(key, None)
            else:
                obj[key] = old

    def changes(self) -> list[str]:
        """Human-readable list of what is patched, for ``sharedfs status``."""
        out = []
        for kind, obj, key, _ in self._undo:
            owner = getattr(obj, "__name__", type(obj).__name__)
            out.append(f"{owner}.{key}" if kind == "attr" else f"{owner}[{key!r}]")
        return out


@frozen
class ShimContext:
    """The plugins' decisions for one shim, made by the kernel before :meth:`Shim.apply` runs.

    ``cache`` is where the framework's cache goes (``None`` when the shim declares no
    cache variable).  Deciding it may raise :class:`sharedfs.UnsafeDirectoryError`: the
    import then fails with that error instead of falling back to an unsafe default.
    """

    cache: CachePlacement | None = None
    #: True when the shim is applied at its framework's first lock (a stand-in's first call,
    #: :mod:`sharedfs.machinery.standin`) rather than at its import: what the framework made before then
    #: (the directories around that first lock) was made while sharedfs was not watching.
    late: bool = False


class Shim:
    """Base class of every shim.

    Subclasses set the class attributes and implement :meth:`apply`; callers use
    :meth:`patch` and :meth:`unpatch`, which make the shim idempotent.
    """

    #: Shim name: the plugin name, and what ``SHAREDFS_DISABLE=name`` blocks.
    name: ClassVar[str]
    #: The module whose import triggers this shim: a built-in shim's is its row of the bootstrap's table
    #: (set here, never repeated); a third-party shim names its own.
    target: ClassVar[str]
    #: The distribution whose installed metadata gives the version; ``None`` for a shim of the
    #: standard library, gated on the interpreter instead (``supported`` is then a range of CPython
    #: versions: the standard library's code is what it changes).
    distribution: ClassVar[str | None]
    #: PEP 440 specifier set of the versions this shim was written and tested for.
    supported: ClassVar[str]
    #: The environment variable through which users choose this framework's cache
    #: directory (``HF_DATASETS_CACHE``), and the framework's default when it is unset;
    #: ``None`` for a framework without a cache sharedfs places.
    cache_env: ClassVar[str | None] = None
    cache_default: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        row = _bootstrap.SHIMS.get(cls.__dict__.get("name", ""))
        if row is not None and "target" not in cls.__dict__:
            cls.target = row[0]

    def __init__(self) -> None:
        self.patcher = Patcher()
        self.policy: Policy | None = None

    @property
    def applied(self) -> bool:
        return self.policy is not None

    def patch(self, policy: Policy, context: ShimContext | None = None) -> None:
        """Apply ``policy`` to the (already imported) target.  Re-applies if the policy changed."""
        if self.policy == policy:
            return
        if self.applied:
            self.unpatch()
        module = self.module()
        try:
            self.apply(module, policy, context or ShimContext())
        except BaseException:
            self.patcher.restore()  # never leave a framework half-patched
            raise
        self.policy = policy

    def module(self) -> ModuleType:
        """What :meth:`apply` changes: the target, which is imported by the time a shim is applied.

        A shim of the standard library (:attr:`distribution` ``None``) may be applied before its
        target is imported (``startup/activation.py``'s ``COMPANIONS``) and names its module itself.
        """
        return sys.modules[self.target]

    def unpatch(self) -> None:
        """Restore every attribute and setting :meth:`patch` changed."""
        self.patcher.restore()
        self.policy = None

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:  # pragma: no cover
        """Change ``module`` (through ``self.patcher``) so it follows ``policy`` and ``context``."""
        raise NotImplementedError(f"{type(self).__name__}.apply")


class RebindingShim(Shim):
    """A shim that replaces one function its framework's modules bind by name (``from pkg.utils import f``).

    The target module's attribute is replaced first; a module of :attr:`package` that had
    already bound the original gets the replacement too, and on :meth:`unpatch` every module
    of the package holding the replacement (including those imported after the patch, which
    bound it themselves) gets the original back.
    """

    #: The function's name in the target module (``wait_for``).
    function: ClassVar[str]
    #: The framework's top-level package, whose modules may have bound the function by name.
    package: ClassVar[str]

    _original: Any = None
    _replacement: Any = None

    def replacement(self, original: Any, policy: Policy) -> Any:  # pragma: no cover
        """What stands in for ``original`` under ``policy``."""
        raise NotImplementedError(f"{type(self).__name__}.replacement")

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        original = getattr(module, self.function)
        self._original, self._replacement = original, self.replacement(original, policy)
        self.patcher.setattr(module, self.function, self._replacement)
        for owner in self._package_modules():
            if owner is not module and getattr(owner, self.function, None) is original:
                self.patcher.setattr(owner, self.function, self._replacement)

    def unpatch(self) -> None:
        if self._replacement is not None:
            for owner in self._package_modules():
                if getattr(owner, self.function, None) is self._replacement:
                    setattr(owner, self.function, self._original)
            self._replacement = None
        super().unpatch()

    def _package_modules(self) -> list[ModuleType]:
        """The package's modules imported so far (nothing is imported here)."""
        prefix = self.package + "."
        return [m for name, m in list(sys.modules.items())
                if isinstance(m, ModuleType) and (name == self.package or name.startswith(prefix))]
