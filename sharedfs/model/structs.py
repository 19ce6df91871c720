"""Dataclasses that cost nothing to define: shared methods instead of six compiled per class.

Only what sharedfs uses is supported; anything else is refused when the class is made.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import MISSING, Field, FrozenInstanceError, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, TypeVar, get_origin

__all__ = ["frozen", "mutable"]

_C = TypeVar("_C", bound=type)
_set = object.__setattr__


def _marker_works(marker: object) -> bool:
    """Whether ``dataclasses.fields`` keeps a field carrying ``marker`` as its ``_field_type``.

    That private mark is how ``fields()`` (and so ``asdict``, ``astuple``, ``replace``) tells regular
    fields from ``ClassVar``/``InitVar`` pseudo-fields; structs writes it on the fields it builds.  It
    is in every CPython from 3.7 to 3.14; asked once (a few microseconds) rather than assumed, so a
    CPython that drops or reinterprets it gets the public path instead of dataclasses without fields.
    """
    if marker is None:
        return False
    probe = field()
    probe.name, probe.type = "probe", int
    probe._field_type = marker  # type: ignore[attr-defined]
    holder: Any = SimpleNamespace(__dataclass_fields__={"probe": probe})  # fields() reads only this attribute
    try:
        return dataclasses.fields(holder) == (probe,)
    except Exception:  # whatever a future dataclasses objects to: not the behaviour this path relies on
        return False


#: dataclasses' mark of a regular field (private).  Where it works as above, structs builds the
#: fields itself; elsewhere dataclasses collects them (public, ~0.16 ms a class on 3.11).
_FIELD = getattr(dataclasses, "_FIELD", None)
_MARKER_WORKS = _marker_works(_FIELD)

if sys.version_info >= (3, 14):
    # PEP 649/749: without `from __future__ import annotations` a class's __dict__ has no
    # __annotations__, only an annotate function that computes them (kept under a private key:
    # annotationlib is the supported way in).  FORWARDREF is the format dataclasses asks for on
    # 3.14: values where every name is defined, ForwardRef objects where one is not (VALUE would
    # raise NameError), the strings themselves under the future import.  dataclasses imports
    # annotationlib already, so this costs no import.
    import annotationlib

    def _annotations(cls: type) -> Mapping[str, Any]:
        """The class's own annotations (never inherited ones), as dataclasses reads them."""
        return annotationlib.get_annotations(cls, format=annotationlib.Format.FORWARDREF)

else:

    def _annotations(cls: type) -> Mapping[str, Any]:
        """The class's own annotations (never inherited ones), as dataclasses reads them up to 3.13."""
        return cls.__dict__.get("__annotations__", {})  # type: ignore[no-any-return]


#: How a pseudo-field's annotation starts, spelled in the source (under the future import, or for a
#: 3.14 forward reference): those are not fields and structs refuses them.
_PSEUDO = ("ClassVar", "typing.ClassVar", "InitVar", "dataclasses.InitVar", "KW_ONLY", "dataclasses.KW_ONLY")


def _is_pseudo_field(annotation: Any) -> bool:
    """``ClassVar[...]``, ``InitVar[...]`` or ``KW_ONLY``, whether a string, a forward reference or the object."""
    spelled = annotation if isinstance(annotation, str) else getattr(annotation, "__forward_arg__", None)
    if isinstance(spelled, str):
        return spelled.startswith(_PSEUDO)
    # An evaluated annotation (a module without the future import).
    return annotation is ClassVar or get_origin(annotation) is ClassVar or \
        annotation is dataclasses.InitVar or isinstance(annotation, dataclasses.InitVar) or \
        annotation is getattr(dataclasses, "KW_ONLY", MISSING)


if TYPE_CHECKING:  # pragma: no cover - the type checker reads these as dataclass decorators
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Callable[[_C], _C]:
        return lambda decorator: decorator


def _params(cls: Any, frozen: bool) -> None:
    # What dataclass(frozen=...) records; read by dataclasses when a dataclass subclasses this one.
    cls.__dataclass_params__ = SimpleNamespace(init=True, repr=True, eq=True, order=False, unsafe_hash=False,
                                               frozen=frozen, match_args=False, kw_only=False, slots=False,
                                               weakref_slot=False)


def _collect(cls: Any, frozen: bool) -> dict[str, Field[Any]]:
    """The class's fields as ``dataclasses.Field`` objects, set where dataclasses keeps them."""
    if not _MARKER_WORKS:  # the public path: dataclasses finds the fields (no methods: init/repr/eq are ours)
        dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
        kept = {spec.name: spec for spec in dataclasses.fields(cls)}
        if len(kept) != len(cls.__dataclass_fields__):  # ClassVar/InitVar pseudo-fields, refused as below
            raise TypeError(f"{cls.__qualname__}: sharedfs.model.structs supports plain fields only")
        _params(cls, frozen)
        return kept
    found: dict[str, Field[Any]] = {}
    for name, annotation in _annotations(cls).items():
        if _is_pseudo_field(annotation):
            raise TypeError(f"{cls.__qualname__}.{name}: sharedfs.model.structs supports plain fields only")
        value = cls.__dict__.get(name, MISSING)
        if isinstance(value, Field):
            spec = value
            if spec.default is MISSING:
                delattr(cls, name)  # as dataclasses: no class attribute for a field without a plain default
            else:
                setattr(cls, name, spec.default)
        else:
            spec = field(default=value)
        spec.name, spec.type = name, annotation
        spec._field_type = _FIELD  # type: ignore[attr-defined]
        if getattr(spec, "kw_only", False) is MISSING:
            spec.kw_only = False  # type: ignore[attr-defined]
        found[name] = spec
    cls.__dataclass_fields__ = found
    _params(cls, frozen)
    return found


class _Spec:
    """One class's fields, read once, when it is made."""

    __slots__ = ("names", "positions", "defaults", "factories", "compared", "hashed", "shown", "post_init", "direct",
                 "assign")

    def __init__(self, cls: Any, frozen: bool) -> None:
        if any(hasattr(base, "__struct__") for base in cls.__mro__[1:]):
            raise TypeError(f"{cls.__qualname__}: sharedfs.model.structs does not support inheriting fields")
        self.defaults: dict[str, Any] = {}
        self.factories: dict[str, Callable[[], Any]] = {}
        names: list[str] = []
        compared: list[str] = []
        hashed: list[str] = []
        shown: list[str] = []
        for name, spec in _collect(cls, frozen).items():
            if not spec.init or getattr(spec, "kw_only", False) is True:
                raise TypeError(f"{cls.__qualname__}.{name}: sharedfs.model.structs supports plain fields only")
            if spec.default is not MISSING:
                self.defaults[name] = spec.default
            elif spec.default_factory is not MISSING:
                self.factories[name] = spec.default_factory
            elif self.defaults or self.factories:
                raise TypeError(f"non-default argument {name!r} follows default argument")
            names.append(name)
            in_hash = spec.compare if spec.hash is None else spec.hash
            for wanted, into in ((spec.compare, compared), (in_hash, hashed), (spec.repr, shown)):
                if wanted:
                    into.append(name)
        self.names, self.compared, self.hashed, self.shown = tuple(names), tuple(compared), tuple(hashed), tuple(shown)
        self.positions = {name: at for at, name in enumerate(names)}
        self.post_init = hasattr(cls, "__post_init__")
        # The generated __init__ assigns through object.__setattr__ (frozen) or ``self.name = value``
        # (the class's own __setattr__, if any); for a class whose fields are plain instance
        # attributes either is a store into the instance's __dict__, which a few C-level updates do
        # at once (Mount: one per mount-table line parsed).
        self.assign = _set if frozen else setattr
        plain = frozen or all("__setattr__" not in vars(base) for base in cls.__mro__[:-1])
        self.direct = plain and not any(hasattr(getattr(cls, name, None), "__set__") for name in names) and \
            "__slots__" not in cls.__dict__


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    spec: _Spec = self.__struct__
    names = spec.names
    given = len(args)
    if given > len(names):
        required = len(names) - len(spec.defaults) - len(spec.factories)
        takes = f"{len(names) + 1}" if required == len(names) else f"from {required + 1} to {len(names) + 1}"
        raise TypeError(f"{type(self).__qualname__}.__init__() takes {takes} positional arguments "
                        f"but {given + 1} were given")
    positions = spec.positions
    for name in kwargs:
        at = positions.get(name)
        if at is None:
            raise TypeError(f"{type(self).__qualname__}.__init__() got an unexpected keyword argument {name!r}")
        if at < given:
            raise TypeError(f"{type(self).__qualname__}.__init__() got multiple values for argument {name!r}")
    bound = dict(zip(names, args))
    if given < len(names):  # keywords and defaults, in field order as the generated __init__ assigns them
        defaults, factories = spec.defaults, spec.factories
        made: list[str] = []  # factories run once every argument is known to be there, as after binding
        missing: list[str] = []
        for name in names[given:]:
            if name in kwargs:
                bound[name] = kwargs[name]
            elif name in defaults:
                bound[name] = defaults[name]
            elif name in factories:
                bound[name] = None
                made.append(name)
            else:
                missing.append(name)
        if missing:
            quoted = [repr(m) for m in missing]
            listed = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + ("," if len(quoted) > 2 else "") \
                + f" and {quoted[-1]}"
            raise TypeError(f"{type(self).__qualname__}.__init__() missing {len(missing)} required positional "
                            f"argument{'s' if len(missing) > 1 else ''}: {listed}")
        for name in made:
            bound[name] = factories[name]()
    if spec.direct:
        self.__dict__.update(bound)
    else:
        assign = spec.assign
        for name, value in bound.items():
            assign(self, name, value)
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
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _make(cls: Any, frozen: bool) -> Any:
    cls.__struct__ = spec = _Spec(cls, frozen)
    if not cls.__doc__:
        cls.__doc__ = f"{cls.__name__}({', '.join(spec.names)})"
    methods: dict[str, Any] = {"__init__": _init, "__repr__": _repr, "__eq__": _eq, "__replace__": dataclasses.replace}
    if frozen:
        methods.update(__setattr__=_frozen_setattr, __delattr__=_frozen_delattr)
        for name in ("__setattr__", "__delattr__"):
            if name in cls.__dict__:
                raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
    # dataclasses' rule for eq=True: a __hash__ the class body writes is kept; otherwise a frozen
    # class hashes its compared fields and a mutable one is unhashable.  (A body that defines
    # __eq__ alone gets __hash__ = None from Python itself: that is not "written".)
    body_hash = cls.__dict__.get("__hash__", MISSING)
    if body_hash is MISSING or (body_hash is None and "__eq__" in cls.__dict__):
        methods["__hash__"] = _hash if frozen else None
    for name, method in methods.items():
        if name == "__hash__" or name not in cls.__dict__:
            setattr(cls, name, method)
    return cls


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def frozen(cls: _C) -> _C:
    """``@dataclass(frozen=True)``, without compiling its methods."""
    return _make(cls, frozen=True)


@dataclass_transform(field_specifiers=(field,))
def mutable(cls: _C) -> _C:
    """``@dataclass``, without compiling its methods."""
    return _make(cls, frozen=False)

