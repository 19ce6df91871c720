"""Every class the kernel makes with ``sharedfs.model.structs`` has the fields ``dataclasses`` finds in its body.

``structs`` reads each class's annotations itself.  Up to Python 3.13 they are a dict in the class's
``__dict__``; from 3.14 (PEP 649/749) a module without ``from __future__ import annotations`` gets
classes whose ``__dict__`` holds an annotate function instead, called on demand -- a reader of
``__dict__["__annotations__"]`` then sees no fields and makes a class that takes no arguments.
Nothing enforces the future import, so this file checks the outcome, on every Python: for each
class of sharedfs/, plugins/ and shims/ decorated with ``frozen``/``mutable``,

* the field names structs gave it are the annotated names of its body in the source (``ast``, the
  same on every Python: catches a structs that cannot see the annotations), and
* its fields are those the real ``dataclasses.dataclass`` makes of a copy of the class (the body
  compiled again without its decorators, with the module's own future imports), attribute by
  attribute, and so are the class attributes and frozenness left behind.

A class as 3.14 builds it is simulated (a ``__dict__`` with an annotate function and no
``__annotations__``, an ``annotationlib`` giving its annotations, ``sys.version_info`` saying 3.14
while structs is imported afresh), so the 3.14 path runs on the Pythons this project can install.

Deliberately no ``from __future__ import annotations`` here: the classes below have evaluated
annotations (and on 3.14, lazy ones), the form the future import hides from the kernel's tests.
"""

import ast
import dataclasses
import enum
import importlib
import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple

import pytest

import sharedfs
from sharedfs.model import structs

ROOT = Path(__file__).resolve().parents[2]
#: Source folder -> the package it is installed as (plugins/ and shims/ are sharedfs.plugins/.shims).
PACKAGES = {"sharedfs": "sharedfs", "plugins": "sharedfs.plugins", "shims": "sharedfs.shims"}
STRUCTS = "sharedfs.model.structs"
DECORATORS = {"frozen": True, "mutable": False}
#: The attributes of ``dataclasses.Field`` that say what a field is (``kw_only`` from 3.10, ``doc`` from 3.14).
FIELD_ATTRIBUTES = ("name", "type", "default", "default_factory", "init", "repr", "hash", "compare", "metadata",
                    "kw_only", "doc")


class Declared(NamedTuple):
    """One class of a module's source that a structs decorator makes."""

    node: ast.ClassDef
    frozen: bool
    names: List[str]  # its annotated names, in order: what dataclasses takes for fields
    top_level: bool


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def declared_structs(tree: ast.Module, module: str, is_package: bool = False) -> List[Declared]:
    """The classes of ``tree`` decorated with ``frozen``/``mutable`` from sharedfs.model.structs, however imported."""
    names: Dict[str, bool] = {}  # local name of a decorator -> frozen
    modules: List[str] = []  # local names of the structs module itself
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node)
            for alias in node.names:
                if source in (STRUCTS, "sharedfs.types") and alias.name in DECORATORS:
                    names[alias.asname or alias.name] = DECORATORS[alias.name]
                elif f"{source}.{alias.name}" == STRUCTS:
                    modules.append(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules += [alias.asname for alias in node.names if alias.name == STRUCTS and alias.asname]

    def kind(decorator: ast.expr) -> Optional[bool]:
        if isinstance(decorator, ast.Name):
            return names.get(decorator.id)
        if isinstance(decorator, ast.Attribute) and decorator.attr in DECORATORS and \
                ast.unparse(decorator.value) in (*modules, STRUCTS):
            return DECORATORS[decorator.attr]
        return None

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            kinds = [k for k in map(kind, node.decorator_list) if k is not None]
            if kinds:
                annotated = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                             and isinstance(s.target, ast.Name)]
                found.append(Declared(node, kinds[0], annotated, node in tree.body))
    return found


def _copy_as_dataclass(module: ModuleType, tree: ast.Module, declared: Declared) -> Any:
    """The class body of ``declared`` run again, without decorators, and made by ``dataclasses.dataclass``."""
    futures = [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
    bare = ast.ClassDef(name=declared.node.name, bases=declared.node.bases, keywords=declared.node.keywords,
                        body=declared.node.body, decorator_list=[], **{
                            k: getattr(declared.node, k) for k in ("type_params",) if hasattr(declared.node, k)})
    copy = ast.fix_missing_locations(ast.Module(body=[*futures, ast.copy_location(bare, declared.node)],
                                                type_ignores=[]))
    namespace = dict(vars(module))  # the module's names, as the body saw them; the module itself untouched
    exec(compile(copy, module.__file__ or "<copy>", "exec", dont_inherit=True), namespace)
    return dataclasses.dataclass(frozen=declared.frozen)(namespace[declared.node.name])


def _same(a: Any, b: Any) -> bool:
    # A forward reference (3.14, FORWARDREF format) names its owner: the copy's differs from the class's.
    if hasattr(a, "__forward_arg__") and hasattr(b, "__forward_arg__"):
        return bool(a.__forward_arg__ == b.__forward_arg__)
    return a is b or bool(a == b)


def struct_problems(module: ModuleType, path: Path) -> List[str]:
    """What differs between each struct of ``module`` and what dataclasses makes of the same body."""
    tree = ast.parse(path.read_text(), str(path))
    problems: List[str] = []
    for declared in declared_structs(tree, module.__name__, path.name == "__init__.py"):
        where = f"{module.__name__}.{declared.node.name}"
        if not declared.top_level:
            problems.append(f"{where}: not at module level, so this check cannot reach it")
            continue
        cls = getattr(module, declared.node.name)
        ours = dataclasses.fields(cls)
        if [f.name for f in ours] != declared.names:
            problems.append(f"{where}: structs made fields {[f.name for f in ours]}, "
                            f"the class body declares {declared.names}")
            continue
        try:
            reference = _copy_as_dataclass(module, tree, declared)
        except Exception as exc:  # dataclasses refuses the body: so must structs, it did not
            problems.append(f"{where}: dataclasses refuses the body: {exc!r}")
            continue
        for mine, theirs in zip(ours, dataclasses.fields(reference)):
            for attribute in FIELD_ATTRIBUTES:
                a, b = getattr(mine, attribute, None), getattr(theirs, attribute, None)
                if not _same(a, b):
                    problems.append(f"{where}.{mine.name}: field {attribute} is {a!r}, dataclasses makes {b!r}")
            a, b = vars(cls).get(mine.name, "<absent>"), vars(reference).get(mine.name, "<absent>")
            if not _same(a, b):
                problems.append(f"{where}.{mine.name}: class attribute {a!r}, dataclasses leaves {b!r}")
        if cls.__dataclass_params__.frozen != reference.__dataclass_params__.frozen:
            problems.append(f"{where}: frozen={cls.__dataclass_params__.frozen}, dataclasses says otherwise")
        if (cls.__hash__ is None) != (reference.__hash__ is None):
            problems.append(f"{where}: __hash__ {cls.__hash__!r}, dataclasses makes {reference.__hash__!r}")
    return problems


def _imports_structs(tree: ast.Module, module: str, is_package: bool) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(alias.name == STRUCTS for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node)
            if source == STRUCTS or any(f"{source}.{alias.name}" == STRUCTS for alias in node.names):
                return True
            if source == "sharedfs.types" and any(alias.name in DECORATORS for alias in node.names):
                return True  # a plugin takes the decorators from its surface
    return False


def kernel_modules() -> Iterator[Tuple[str, Path]]:
    """(module name, source) of every module of sharedfs/, plugins/ and shims/ that imports structs."""
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join((package, *(parts[:-1] if is_package else parts)))
            if _imports_structs(ast.parse(path.read_text(), str(path)), name, is_package):
                yield name, path


def test_every_struct_of_the_kernel_has_the_fields_dataclasses_finds() -> None:
    checked: Dict[str, List[str]] = {}
    problems: List[str] = []
    for name, path in kernel_modules():
        module = importlib.import_module(name)
        problems += struct_problems(module, path)
        tree = ast.parse(path.read_text())
        checked[name] = [d.node.name for d in declared_structs(tree, name, path.name == "__init__.py")]
    assert not problems, "\n".join(problems)
    # The walk found the kernel's structs (it cannot pass by finding nothing).
    every = {cls for classes in checked.values() for cls in classes}
    assert {"Mount", "FsInfo", "Policy", "HolderRecord", "Target", "SlurmFacts"} <= every, checked
    assert len(every) >= 20, checked


# -- Python 3.14, simulated ---------------------------------------------------------------------------

THROWAWAY = '''
"""A kernel-style module as Python 3.14 runs it without `from __future__ import annotations`."""
import dataclasses
from typing import Mapping, Optional

from sharedfs.model.structs import frozen, mutable


def as_pep649(cls):
    """What 3.14 makes of the class body: no __annotations__ in __dict__, an annotate function computing them.

    3.14.0 keeps that function under "__annotate_func__" (a private detail: the class's
    __annotate__ attribute, and annotationlib.get_annotate_from_class_namespace, find it).
    """
    namespace = dict(cls.__dict__)
    annotations = namespace.pop("__annotations__")
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)

    def __annotate__(format):
        if format != 1:  # Format.VALUE: all a compiler-generated annotate function supports
            raise NotImplementedError(format)
        return dict(annotations)

    namespace["__annotate_func__"] = __annotate__
    return type(cls.__name__, cls.__bases__, namespace)


@frozen
@as_pep649
class Point:
    x: int
    y: str = "a"
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)
    note: Optional[str] = None


@mutable
@as_pep649
class Box:
    size: int
'''


class _Format(enum.IntEnum):
    VALUE = 1
    VALUE_WITH_FAKE_GLOBALS = 2
    FORWARDREF = 3
    STRING = 4


def _fake_annotationlib(asked: List[Any]) -> ModuleType:
    """``annotationlib`` as documented for a class, for the formats that never evaluate a name twice."""
    module = ModuleType("annotationlib")

    def get_annotations(obj: Any, *, globals: Any = None, locals: Any = None, eval_str: bool = False,
                        format: Any = _Format.VALUE) -> Dict[str, Any]:
        asked.append(format)
        own = obj.__dict__.get("__annotations__")
        annotate = obj.__dict__.get("__annotate__") or obj.__dict__.get("__annotate_func__")
        if own is None and annotate is not None:
            own = annotate(_Format.VALUE)  # every name here is defined: what FORWARDREF returns then
        if format == _Format.STRING:
            return {k: v if isinstance(v, str) else getattr(v, "__name__", repr(v)) for k, v in (own or {}).items()}
        return dict(own or {})

    module.get_annotations = get_annotations  # type: ignore[attr-defined]
    module.Format = _Format  # type: ignore[attr-defined]
    return module


def _load_throwaway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    python_3_14: bool) -> Tuple[ModuleType, Path, List[Any]]:
    """The module above, with a structs imported afresh as Python 3.14 (or this Python) imports it.

    Also the formats structs asked the simulated annotationlib for.
    """
    asked: List[Any] = []
    with monkeypatch.context() as during_import:  # undone on leaving: the kernel keeps the structs it imported
        during_import.delitem(sys.modules, STRUCTS)
        during_import.setattr(sharedfs.model, "structs", structs)  # the import rebinds it
        if python_3_14:
            during_import.setitem(sys.modules, "annotationlib", _fake_annotationlib(asked))
            during_import.setattr(sys, "version_info", (3, 14, 0, "final", 0))
        fresh = importlib.import_module(STRUCTS)
    # The fresh structs makes the throwaway module's classes.
    monkeypatch.setitem(sys.modules, STRUCTS, fresh)
    path = tmp_path / "throwaway_structs_module.py"
    path.write_text(textwrap.dedent(THROWAWAY))
    spec = importlib.util.spec_from_file_location("throwaway_structs_module", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, STRUCTS, structs)
    return module, path, asked


def test_a_class_as_python_3_14_builds_it_gets_its_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, path, asked = _load_throwaway(tmp_path, monkeypatch, python_3_14=True)
    assert "__annotations__" not in vars(module.Point) and "__annotate_func__" in vars(module.Point)  # 3.14's shape
    assert struct_problems(module, path) == []
    # A format that never evaluates a name the module defines later (VALUE would raise NameError).
    assert asked and set(asked) <= {_Format.FORWARDREF, _Format.STRING}, asked
    point = module.Point(1, tags={"k": "v"})
    assert (point.x, point.y, point.note) == (1, "a", None) and point == module.Point(1) and module.Box(3).size == 3
    assert dataclasses.replace(point, y="b").y == "b" and dataclasses.asdict(module.Box(2)) == {"size": 2}


def test_the_check_reports_a_struct_that_cannot_see_3_14_annotations(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """structs reads ``__dict__["__annotations__"]`` up to 3.13: blind to the 3.14 shape, and the check says so."""
    if sys.version_info >= (3, 14):
        pytest.skip("this Python has annotationlib: structs reads lazy annotations here")
    module, path, _ = _load_throwaway(tmp_path, monkeypatch, python_3_14=False)
    problems = struct_problems(module, path)
    assert problems == [
        "throwaway_structs_module.Point: structs made fields [], the class body declares ['x', 'y', 'tags', 'note']",
        "throwaway_structs_module.Box: structs made fields [], the class body declares ['size']",
    ]


# -- evaluated annotations (lazy ones on 3.14): no future import in this file --------------------------

def _body() -> type:
    class Record:
        """Fields with evaluated annotations."""

        name: str
        sizes: List[int] = dataclasses.field(default_factory=list)
        parent: "Optional[Record]" = None
        labels: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    return Record


def test_evaluated_annotations_make_the_same_fields_as_dataclasses() -> None:
    ours: Any = structs.frozen(_body())
    theirs: Any = dataclasses.dataclass(frozen=True)(_body())
    assert len(dataclasses.fields(ours)) == len(dataclasses.fields(theirs))
    for mine, reference in zip(dataclasses.fields(ours), dataclasses.fields(theirs)):
        for attribute in FIELD_ATTRIBUTES:
            assert _same(getattr(mine, attribute, None), getattr(reference, attribute, None)), (mine, attribute)
    assert [f.name for f in dataclasses.fields(ours)] == ["name", "sizes", "parent", "labels"]
    assert dataclasses.fields(ours)[0].type is str  # evaluated, not a string
    record = ours("a", [1])
    assert record == ours("a", [1], labels={"x": "y"})
    assert repr(record).endswith("Record(name='a', sizes=[1], parent=None)")


def test_pseudo_fields_with_evaluated_annotations_are_refused() -> None:
    class Counted:
        """A class variable among the fields, annotated with the object itself."""

        a: int
        b: ClassVar[int] = 0

    with pytest.raises(TypeError, match="plain fields only"):
        structs.frozen(Counted)

    class Later:
        """A field only for __post_init__."""

        a: int
        b: dataclasses.InitVar[int] = 0  # type: ignore[assignment]

    with pytest.raises(TypeError, match="plain fields only"):
        structs.frozen(Later)
