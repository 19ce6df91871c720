"""Stand-ins: a framework's lock class (or function) replaced at import by one that activates sharedfs on first use.

Standard library only, and failing closed: a refused activation raises, never falls back to the unpatched class.
"""

from __future__ import annotations

import functools
import threading
from types import FunctionType, ModuleType
from typing import Any, Callable

_lock = threading.RLock()  # the tables below; held briefly, never while calling out
_activating = threading.RLock()  # a stand-in's activation in progress
#: The class attribute naming where a stand-in stands: (module, attribute name).
HOME = "_sharedfs_stands_in_for"


class _Entry:
    __slots__ = ("module", "attr", "shim", "standin", "activate")

    def __init__(self, module: ModuleType, attr: str, shim: str, standin: Any,
                 activate: Callable[[], object]) -> None:
        self.module, self.attr, self.shim, self.standin, self.activate = module, attr, shim, standin, activate

    @property
    def original(self) -> Any:
        return unwrap(self.standin)


#: (module name, attribute) -> the stand-in in place there now.
_pending: dict[tuple[str, str], _Entry] = {}
#: One metaclass per metaclass of the classes stood in for (filelock 3: ABCMeta; 4: FileLockMeta).
_metas: dict[type, type] = {}


def install(module: ModuleType, attr: str, shim: str, activate: Callable[[], object]) -> bool:
    """Put a stand-in for ``module.attr`` (a class) in its place; ``activate`` runs on its first call.

    Returns False, changing nothing, when ``module.attr`` is not a class (the shim
    then finds out for itself when it is activated).
    """
    original = getattr(module, attr, None)
    if not isinstance(original, (type, FunctionType)):
        return False
    with _lock:
        key = (module.__name__, attr)
        if key in _pending:
            return True
        if isinstance(original, type):
            standin: Any = _meta(type(original))(original.__name__, (original,), {
                "__module__": __name__,
                "__qualname__": original.__qualname__,
                "__doc__": original.__doc__,
                HOME: (module, attr),
            })
        else:
            standin = _function(original, module, attr)
        _pending[key] = _Entry(module, attr, shim, standin, activate)
        setattr(module, attr, standin)
    return True


def _function(original: FunctionType, module: ModuleType, attr: str) -> Any:
    """A stand-in for a function (``torch.hub.load_state_dict_from_url``): its first call activates, then calls
    what the module holds now (the shim's wrapper, or the original put back)."""

    @functools.wraps(original)  # __wrapped__: unwrap() gives the shim the original to wrap, never this
    def standin(*args: Any, **kwargs: Any) -> Any:
        _resolve(standin)
        current = getattr(module, attr, original)
        return (original if current is standin else current)(*args, **kwargs)

    setattr(standin, HOME, (module, attr))
    return standin


def unwrap(cls: Any) -> Any:
    """The class a stand-in stands for (its one base); anything else unchanged.

    A shim wraps ``module.FileLock`` while the stand-in is still in that place (so that
    no other thread can ever read the unpatched class there); :func:`sharedfs.locks.drop_in`
    and the shim's patch record unwrap it, so the replacement derives from the framework's
    own class and ``unpatch`` restores that class.
    """
    if isinstance(cls, type) and HOME in cls.__dict__:
        return cls.__bases__[0]
    if isinstance(cls, FunctionType) and HOME in cls.__dict__:
        return cls.__wrapped__  # type: ignore[attr-defined]
    return cls


def withdraw(shim: str) -> list[_Entry]:
    """Stop ``shim``'s stand-ins from activating (it is being activated); what was withdrawn.

    The stand-ins stay in place until :func:`settle`: the shim replaces them, or settle
    puts the original back, so the module never holds the unpatched class meanwhile.
    """
    with _lock:
        gone = [entry for entry in _pending.values() if entry.shim == shim]
        for entry in gone:
            del _pending[(entry.module.__name__, entry.attr)]
        return gone


def settle(entries: list[_Entry]) -> None:
    """After an activation: a stand-in the shim did not replace (it stays off) gives way to the original."""
    with _lock:
        for entry in entries:
            if getattr(entry.module, entry.attr, None) is entry.standin:
                setattr(entry.module, entry.attr, entry.original)


def reinstate(entries: list[_Entry]) -> None:
    """After a refused activation: the stand-ins activate again on their next call (failing closed)."""
    with _lock:
        for entry in entries:
            if getattr(entry.module, entry.attr, None) in (entry.original, entry.standin):
                setattr(entry.module, entry.attr, entry.standin)
                _pending[(entry.module.__name__, entry.attr)] = entry


def withdraw_all() -> None:
    """Put back every original (``sharedfs.disable()``)."""
    with _lock:
        for shim in {entry.shim for entry in _pending.values()}:
            settle(withdraw(shim))


def waiting() -> set[str]:
    """The shims whose stand-ins wait for their first use (``sharedfs status``)."""
    with _lock:
        return {entry.shim for entry in _pending.values()}


def _resolve(standin: Any) -> None:
    # One activation at a time, and never under _lock: the activation takes the kernel's own lock
    # and then _lock (activation.apply), as an eager activation in another thread does.
    with _activating:
        with _lock:
            entry = next((e for e in _pending.values() if e.standin is standin), None)
        if entry is None:  # activated already (another thread, another stand-in of the shim, or enable())
            return
        # Applying the shim withdraws its stand-ins and replaces them (activation.apply); a refused
        # activation raises and leaves them waiting, so the next lock fails the same way and never
        # gets the unpatched class.
        entry.activate()
        # Still waiting: the shim was never applied (blocked, or start-up failed and was reported).
        settle(withdraw(entry.shim))


def _meta(base: type) -> type:
    """A metaclass deriving from ``base`` whose ``__call__`` (the lock's construction) activates first."""
    meta = _metas.get(base)
    if meta is None:

        def __call__(cls: type, *args: Any, **kwargs: Any) -> Any:
            home = cls.__dict__.get(HOME)
            if home is None:  # a subclass of a stand-in: activate, then build it as its own bases say
                _resolve(next(k for k in cls.__mro__ if HOME in k.__dict__))
                return base.__call__(cls, *args, **kwargs)  # type: ignore[arg-type]
            _resolve(cls)
            module, attr = home
            built = getattr(module, attr, cls)
            if built is cls:  # never the case after _resolve; never recurse if it were
                return base.__call__(cls, *args, **kwargs)  # type: ignore[arg-type]
            return built(*args, **kwargs)

        meta = type(f"StandIn{base.__name__}", (base,), {"__call__": __call__, "__module__": __name__})
        _metas[base] = meta
    return meta
