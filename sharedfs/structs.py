"""Dataclasses that cost no code generation at import.

``dataclasses.dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` as source text and compiles it: about 0.8 ms a frozen class on
CPython 3.11, 13 ms for the twenty classes sharedfs loads when a framework is first imported --
a third of its activation (``benchmarks/startup.py``, "activation alone").  :func:`frozen` and
:func:`mutable` let ``dataclasses`` collect the fields, so ``dataclasses.field``, ``fields``,
``replace`` and ``asdict`` work as usual, and give the class shared methods that behave as the
generated ones do (same arguments, errors, equality, hash and repr); building an instance costs
about 0.3 us more.  Only what sharedfs uses is supported: no ``InitVar``, ``kw_only`` or
``init=False`` fields (refused when the class is made), no ordering.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, TypeVar

_C = TypeVar("_C", bound=type)
_MISSING = dataclasses.MISSING
_set = object.__setattr__

if TYPE_CHECKING:  # pragma: no cover - the type checker reads these as dataclass decorators
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Callable[[_C], _C]:
        return lambda decorator: decorator


class _Spec:
    """One class's fields, read once when it is made."""

    __slots__ = ("names", "defaults", "factories", "compared", "hashed", "shown", "post_init")

    def __init__(self, cls: type) -> None:
        found = dataclasses.fields(cls)
        self.names = tuple(f.name for f in found)
        self.defaults = {f.name: f.default for f in found if f.default is not _MISSING}
        self.factories = {f.name: f.default_factory for f in found if f.default_factory is not _MISSING}
        self.compared = tuple(f.name for f in found if f.compare)
        self.hashed = tuple(f.name for f in found if (f.compare if f.hash is None else f.hash))
        self.shown = tuple(f.name for f in found if f.repr)
        self.post_init = hasattr(cls, "__post_init__")
        optional = False
        for f in found:
            if not f.init or getattr(f, "kw_only", False) or f._field_type is not dataclasses._FIELD:  # type: ignore[attr-defined]
                raise TypeError(f"{cls.__qualname__}.{f.name}: sharedfs.structs supports plain fields only")
            if f.name in self.defaults or f.name in self.factories:
                optional = True
            elif optional:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    spec: _Spec = self.__struct__
    names = spec.names
    if len(args) > len(names):
        required = len(names) - len(spec.defaults) - len(spec.factories)
        takes = f"{len(names) + 1}" if required == len(names) else f"from {required + 1} to {len(names) + 1}"
        raise TypeError(f"{type(self).__qualname__}.__init__() takes {takes} positional arguments "
                        f"but {len(args) + 1} were given")
    for name, value in zip(names, args):
        _set(self, name, value)
    for name, value in kwargs.items():
        if name not in names:
            raise TypeError(f"{type(self).__qualname__}.__init__() got an unexpected keyword argument {name!r}")
        if names.index(name) < len(args):
            raise TypeError(f"{type(self).__qualname__}.__init__() got multiple values for argument {name!r}")
        _set(self, name, value)
    if len(args) + len(kwargs) < len(names):
        missing = []
        for name in names[len(args):]:
            if name in kwargs:
                continue
            if name in spec.defaults:
                _set(self, name, spec.defaults[name])
            elif name in spec.factories:
                _set(self, name, spec.factories[name]())
            else:
                missing.append(name)
        if missing:
            quoted = [repr(m) for m in missing]
            listed = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + ("," if len(quoted) > 2 else "") \
                + f" and {quoted[-1]}"
            raise TypeError(f"{type(self).__qualname__}.__init__() missing {len(missing)} required positional "
                            f"argument{'s' if len(missing) > 1 else ''}: {listed}")
    if spec.post_init:
        self.__post_init__()


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__struct__.shown)
    return f"{type(self).__qualname__}({shown})"


def _eq(self: Any, other: object) -> bool:
    compared: tuple[str, ...] = self.__struct__.compared
    if other.__class__ is not self.__class__:
        return NotImplemented
    # As tuples, as the generated method compares (identity first, then ==).
    return tuple(getattr(self, n) for n in compared) == tuple(getattr(other, n) for n in compared)


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, name) for name in self.__struct__.hashed))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _make(cls: Any, frozen: bool) -> Any:
    cls = dataclasses.dataclass(init=False, repr=False, eq=False)(cls)  # fields only: nothing compiled
    cls.__struct__ = _Spec(cls)
    methods: dict[str, Any] = {"__init__": _init, "__repr__": _repr, "__eq__": _eq}
    if frozen:
        methods.update(__setattr__=_frozen_setattr, __delattr__=_frozen_delattr)
        for name in ("__setattr__", "__delattr__"):
            if name in cls.__dict__:
                raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
    # dataclasses' rule for eq=True: a __hash__ the class body writes is kept; otherwise a frozen
    # class hashes its compared fields and a mutable one is unhashable.  (A body that defines
    # __eq__ alone gets __hash__ = None from Python itself: that is not "written".)
    body_hash = cls.__dict__.get("__hash__", _MISSING)
    if body_hash is _MISSING or (body_hash is None and "__eq__" in cls.__dict__):
        methods["__hash__"] = _hash if frozen else None
    for name, method in methods.items():
        if name == "__hash__" or name not in cls.__dict__:
            setattr(cls, name, method)
    return cls


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def frozen(cls: _C) -> _C:
    """``@dataclass(frozen=True)``, without compiling its methods."""
    return _make(cls, frozen=True)


@dataclass_transform(field_specifiers=(dataclasses.field,))
def mutable(cls: _C) -> _C:
    """``@dataclass``, without compiling its methods."""
    return _make(cls, frozen=False)
