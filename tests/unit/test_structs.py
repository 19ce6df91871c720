"""``sharedfs.model.structs`` against ``dataclasses``: the same class body behaves the same either way.

The kernel's records, policy and filesystem facts are declared with ``@frozen``/``@mutable``
instead of ``@dataclass`` (no methods compiled at import, see the module's docstring); every
assertion here runs on the stock dataclass and on ours, so the contract is dataclasses'.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import pprint
import sys
from typing import Any, Callable, ClassVar, Mapping

import pytest

from sharedfs.model import structs
from sharedfs.model.structs import frozen, mutable


def _frozen_body(name: str) -> type:
    class Point:
        """A frozen record with a default, a factory and fields left out of eq, hash and repr."""

        x: int
        y: str
        z: float = 0.5
        tags: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)
        note: str = dataclasses.field(default="", hash=False)

        def __post_init__(self) -> None:
            if self.x < 0:
                raise ValueError("x must not be negative")

    Point.__name__ = Point.__qualname__ = name  # module-level names: instances pickle
    return Point


def _mutable_body(name: str) -> type:
    class Box:
        """A mutable record."""

        size: int
        items: list[int] = dataclasses.field(default_factory=list)

    Box.__name__ = Box.__qualname__ = name
    return Box


PointDC: Any = dataclasses.dataclass(frozen=True)(_frozen_body("PointDC"))
PointS: Any = frozen(_frozen_body("PointS"))
FROZEN = {"dataclasses": PointDC, "sharedfs": PointS}
MUTABLE = {"dataclasses": dataclasses.dataclass(_mutable_body("BoxDC")), "sharedfs": mutable(_mutable_body("BoxS"))}


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", call())
    except Exception as exc:  # the type and message are the contract
        return ("raised", type(exc), str(exc).split("__init__() ")[-1])


def _shown(obj: object) -> str:
    return repr(obj).split("(", 1)[1]  # the class names differ


CALLS: list[tuple[tuple, dict]] = [
    ((1, "a"), {}),
    ((1,), {"y": "a", "note": "n"}),
    ((1, "a", 2.0), {"tags": {"k": "v"}}),
    ((), {"x": 1, "y": "a", "z": 1.0}),
    ((1,), {}),  # missing y
    ((), {}),  # missing x and y
    ((1, "a", 0.5, {}, "", 9), {}),  # too many
    ((1, "a"), {"x": 2}),  # x twice
    ((1, "a"), {"w": 2}),  # unknown
    ((-1, "a"), {}),  # __post_init__ refuses
]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_construction_matches_dataclasses(args: tuple, kwargs: dict) -> None:
    ours = _outcome(lambda: FROZEN["sharedfs"](*args, **kwargs))
    theirs = _outcome(lambda: FROZEN["dataclasses"](*args, **kwargs))
    assert ours[0] == theirs[0]
    if ours[0] == "raised":
        assert ours[1:] == theirs[1:]
    else:
        assert _shown(ours[1]) == _shown(theirs[1])
        assert dataclasses.asdict(ours[1]) == dataclasses.asdict(theirs[1])


def test_frozen_semantics_match_dataclasses() -> None:
    for kind, cls in FROZEN.items():
        a, b, c = cls(1, "a", tags={"k": "v"}), cls(1, "a", note="x"), cls(2, "a")
        assert a == cls(1, "a"), kind  # tags: compare=False
        assert a != b and a != c and a != (1, "a"), kind
        assert hash(a) == hash(b), kind  # note: hash=False
        assert hash(a) != hash(c), kind
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'x'"):
            a.x = 3
        with pytest.raises(dataclasses.FrozenInstanceError):
            del a.x
        assert dataclasses.is_dataclass(a) and dataclasses.is_dataclass(cls), kind
        assert dataclasses.replace(a, z=2.0) == cls(1, "a", 2.0), kind
        with pytest.raises(TypeError, match="unexpected keyword argument 'w'"):
            dataclasses.replace(a, w=1)
        assert [f.name for f in dataclasses.fields(a)] == ["x", "y", "z", "tags", "note"], kind
        assert [f.name for f in dataclasses.fields(cls)] == ["x", "y", "z", "tags", "note"], kind
        assert dataclasses.asdict(a) == {"x": 1, "y": "a", "z": 0.5, "tags": {"k": "v"}, "note": ""}, kind
        assert pprint.pformat(a) == repr(a), kind
        assert cls.z == 0.5 and cls.note == "" and not hasattr(cls, "tags"), kind  # class attributes as dataclasses leaves them
        assert pickle.loads(pickle.dumps(a)) == a and copy.deepcopy(a) == a, kind
        assert cls(1, "a").tags is not cls(1, "a").tags, kind  # a fresh factory value each time
    assert repr(PointS(1, "a")) == "PointS(x=1, y='a', z=0.5, note='')"
    assert _shown(PointS(1, "a")) == _shown(PointDC(1, "a"))


def test_mutable_semantics_match_dataclasses() -> None:
    for kind, cls in MUTABLE.items():
        box = cls(1)
        box.size = 2
        assert box == cls(2) and box != cls(3), kind
        assert cls.__hash__ is None, kind  # eq without frozen: unhashable, as dataclasses makes it
        with pytest.raises(TypeError, match="unhashable"):
            hash(box)


def test_init_assigns_through_a_mutable_classs_own_setattr_as_dataclasses_does() -> None:
    # Plain classes get their fields stored straight into __dict__ (a few C-level updates); a
    # class with its own __setattr__ or a data descriptor on a field must still see every
    # assignment, as the generated __init__ makes them.
    def body(name: str) -> type:
        class Audited:
            size: int
            label: str = "x"

            def __setattr__(self, name: str, value: Any) -> None:
                object.__setattr__(self, "seen", [*getattr(self, "seen", []), name])
                object.__setattr__(self, name, value)

        Audited.__name__ = Audited.__qualname__ = name
        return Audited

    ours_cls, theirs_cls = mutable(body("AuditedS")), dataclasses.dataclass(body("AuditedDC"))
    for args, kwargs in (((1,), {"label": "y"}), ((), {"label": "y", "size": 1}), ((1,), {})):
        ours, theirs = ours_cls(*args, **kwargs), theirs_cls(*args, **kwargs)
        assert ours.seen == theirs.seen == ["size", "label"], (args, kwargs)  # every field, in field order
        assert (ours.size, ours.label) == (theirs.size, theirs.label), (args, kwargs)
    assert PointS.__struct__.direct and not type(ours).__struct__.direct


def test_unsupported_fields_are_refused_when_the_class_is_made() -> None:
    class Late:
        """A required field after a defaulted one."""

        a: int = 0
        b: int  # type: ignore[misc]

    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        frozen(Late)

    class Skipped:
        """A field left out of __init__."""

        a: int = dataclasses.field(default=0, init=False)

    with pytest.raises(TypeError, match="plain fields only"):
        frozen(Skipped)

    class Counted:
        """A class variable among the fields."""

        a: int
        b: ClassVar[int] = 0

    with pytest.raises(TypeError, match="plain fields only"):
        frozen(Counted)

    @frozen
    class Base:
        """A struct."""

        a: int

    class Derived(Base):
        """A struct inheriting its fields."""

        b: int

    with pytest.raises(TypeError, match="does not support inheriting fields"):
        frozen(Derived)


def test_a_method_the_class_writes_is_kept() -> None:
    def body() -> type:
        class Named:
            """A record with its own repr and hash."""

            name: str

            def __repr__(self) -> str:
                return f"<{self.name}>"

            def __hash__(self) -> int:
                return 7

        return Named

    for cls in (dataclasses.dataclass(frozen=True)(body()), frozen(body())):
        assert repr(cls("a")) == "<a>" and hash(cls("a")) == 7


def test_without_dataclasses_private_field_mark_dataclasses_collects_the_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dataclasses._FIELD`` is private: a CPython without it (or not honouring it) gets dataclasses' fields."""
    monkeypatch.setattr(structs, "_MARKER_WORKS", False)
    cls: Any = frozen(_frozen_body("PointFallback"))
    box_cls: Any = mutable(_mutable_body("BoxFallback"))
    a = cls(1, "a", tags={"k": "v"})
    assert a == cls(1, "a") and hash(a) == hash(cls(1, "a", note="n")) and a != cls(2, "a")
    assert all(dataclasses.is_dataclass(x) for x in (cls, a, box_cls, box_cls(1)))
    assert [f.name for f in dataclasses.fields(a)] == ["x", "y", "z", "tags", "note"]
    assert [f.name for f in dataclasses.fields(box_cls)] == ["size", "items"]
    assert dataclasses.replace(a, z=2.0) == cls(1, "a", 2.0) and dataclasses.replace(box_cls(1), size=2) == box_cls(2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'w'"):
        dataclasses.replace(a, w=1)
    assert dataclasses.asdict(a) == {"x": 1, "y": "a", "z": 0.5, "tags": {"k": "v"}, "note": ""}
    assert dataclasses.asdict(box_cls(1, [2])) == {"size": 1, "items": [2]}
    assert cls.__dataclass_params__.frozen and not box_cls.__dataclass_params__.frozen
    assert cls.z == 0.5 and not hasattr(cls, "tags") and box_cls.__hash__ is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.x = 3
    assert _shown(a) == _shown(PointDC(1, "a"))

    class Counted:
        """A class variable among the fields: dataclasses leaves it out of fields(), structs refuses it."""

        a: int
        b: ClassVar[int] = 0

    with pytest.raises(TypeError, match="plain fields only"):
        frozen(Counted)


def test_the_private_field_mark_is_used_only_where_dataclasses_honours_it() -> None:
    # Every CPython this project supports keeps _FIELD (3.9..3.14 checked): the fast path runs there.
    assert structs._MARKER_WORKS or sys.version_info >= (3, 15)
    assert structs._marker_works(dataclasses._FIELD) is structs._MARKER_WORKS  # type: ignore[attr-defined]
    assert not structs._marker_works(None) and not structs._marker_works(object())  # one fields() would not keep


def test_a_site_plugin_replaces_fields_of_the_kernels_structs_with_dataclasses() -> None:
    """docs/architecture.md's plugin example: ``dataclasses.replace`` on the FsInfo the kernel built."""
    from sharedfs.model.fsinfo import COHERENT
    from sharedfs.model.mounts import mount_for
    from sharedfs.plugins.filesystem import classify

    info = classify(mount_for("/"))
    changed = dataclasses.replace(info, flock=COHERENT, notes=("site configuration",))
    assert changed.flock == COHERENT and changed.notes == ("site configuration",) and changed.mount == info.mount
