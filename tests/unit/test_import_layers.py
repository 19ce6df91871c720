"""The import graph of sharedfs/, plugins/ and shims/ has no cycle, even through function-level imports.

The layers themselves are import-linter contracts (pyproject.toml, run in CI); this test
adds what import-linter cannot say: no strongly connected component anywhere, the
test harness included, counting every import statement wherever it stands.  The
directory modules are layered: nodelocal <- cleanup <- dirs.

Function-level imports hide a cycle from the interpreter (both modules load) but not
from a reader or a refactoring: ``dirs`` imported ``cleanup`` inside
``node_local_dir`` and ``cleanup`` imported ``dirs`` inside ``job_scope``.  This
reads every import statement of the kernel's modules, wherever it is, and checks
the graph.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import _sharedfs_bootstrap
import sharedfs

BOOTSTRAP = "_sharedfs_bootstrap"
#: The one import that points up: the bootstrap (the entry point, and the table of shims the kernel
#: reads) hands a target over to the package inside a function, once the target has executed.
ALLOWED_UPWARD = (BOOTSTRAP, "sharedfs.startup.onimport")
KERNEL = Path(sharedfs.__file__).parent
#: plugins/ and shims/ are installed as sharedfs.plugins / sharedfs.shims (in a checkout they sit beside the package).
EXTRA = {name: KERNEL.parent / name if (KERNEL.parent / name).is_dir() else KERNEL / name for name in ("plugins", "shims")}
LAYERED = ("sharedfs.cluster.nodelocal", "sharedfs.cluster.cleanup", "sharedfs.cluster.dirs")
#: What the layered modules must never reach: the command line, the shims and plugins above the kernel.
ABOVE = ("sharedfs.commands", "sharedfs.shims", "sharedfs.plugins", "sharedfs.demo")


def _module_name(path: Path) -> str:
    if path.stem == BOOTSTRAP:
        return BOOTSTRAP
    for name, folder in EXTRA.items():
        if folder in path.parents and KERNEL not in path.parents:
            parts = ["sharedfs", name, *path.relative_to(folder).with_suffix("").parts]
            break
    else:
        parts = list(path.relative_to(KERNEL.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> dict[str, list[tuple[str, int, bool]]]:
    """``{imported sharedfs module: [(how, line, at module level)]}`` for every import statement in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    found: dict[str, list[tuple[str, int, bool]]] = {}

    def add(name: str, node: ast.stmt) -> None:
        if name in ("sharedfs", BOOTSTRAP) or name.startswith("sharedfs."):
            found.setdefault(name, []).append((ast.unparse(node), node.lineno, id(node) in top_level))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if node.module is None or module == "sharedfs":
                for alias in node.names:  # from . import runtime -> sharedfs.machinery.runtime
                    add(f"{module}.{alias.name}", node)
            else:
                add(module, node)
    return found


def kernel_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in KERNEL.rglob("*.py"):
        if "demo" in path.parts:
            continue
        graph[_module_name(path)] = set(imports_of(path))
    return graph


def whole_graph() -> dict[str, set[str]]:
    """Every module of sharedfs/, plugins/, shims/ and the bootstrap (the test harness too) -> the sharedfs modules it imports."""
    paths = [*KERNEL.rglob("*.py"), Path(_sharedfs_bootstrap.__file__)]
    for folder in EXTRA.values():
        if KERNEL not in folder.parents:
            paths += folder.rglob("*.py")
    graph = {_module_name(path): set(imports_of(path)) for path in paths}
    # ``from sharedfs.locks import lock`` names a package; ``from .locks import _api`` a module: keep both.
    return {module: {dep for dep in deps if dep in graph} for module, deps in graph.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module (a cycle), or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt == node or nxt.startswith(node + "."):
                continue  # a package importing its own submodule is how packages work
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_whole_import_graph_has_no_cycle_counting_function_level_imports() -> None:
    graph = whole_graph()
    assert len(graph) > 40 and "sharedfs.plugins.locking" in graph and "sharedfs.shims.datasets" in graph
    assert BOOTSTRAP in graph["sharedfs.machinery.registry"]  # the bootstrap is in the graph the test checks
    assert ALLOWED_UPWARD[1] in graph[BOOTSTRAP]
    graph[BOOTSTRAP].discard(ALLOWED_UPWARD[1])
    assert strongly_connected(graph) == []


def test_the_bootstrap_calls_into_the_package_only_inside_functions() -> None:
    found = imports_of(Path(_sharedfs_bootstrap.__file__))
    assert set(found) == {ALLOWED_UPWARD[1]}  # nothing else of the package, ever
    assert [top for _how, _line, top in found[ALLOWED_UPWARD[1]]] and not any(
        top for _how, _line, top in found[ALLOWED_UPWARD[1]]), found


def test_the_allowed_upward_import_is_what_keeps_the_graph_acyclic() -> None:
    # Without the allowance the bootstrap's hand-over closes a loop through the kernel that reads
    # its table: the test above would see it.
    assert strongly_connected(whole_graph()) != []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def cycles_through(graph: dict[str, set[str]], start: str) -> list[list[str]]:
    """Every simple import path from ``start`` back to ``start``."""
    found: list[list[str]] = []

    def walk(node: str, trail: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                found.append([*trail, nxt])
            elif nxt not in trail and nxt in graph:
                walk(nxt, [*trail, nxt])

    walk(start, [start])
    return found


def test_no_import_cycle_through_the_directory_modules() -> None:
    graph = kernel_graph()
    for module in LAYERED:
        if module in graph:
            assert cycles_through(graph, module) == [], f"{module} is part of an import cycle"


def test_layers_point_one_way() -> None:
    graph = kernel_graph()
    assert "sharedfs.cluster.dirs" not in graph["sharedfs.cluster.cleanup"] and "sharedfs.cluster.dirs" not in graph["sharedfs.cluster.nodelocal"]
    assert "sharedfs.cluster.cleanup" not in graph["sharedfs.cluster.nodelocal"]
    assert {"sharedfs.cluster.nodelocal", "sharedfs.cluster.cleanup"} <= graph["sharedfs.cluster.dirs"]
    assert "sharedfs.cluster.nodelocal" in graph["sharedfs.cluster.cleanup"]


def test_nothing_above_the_kernel_is_reachable() -> None:
    graph = kernel_graph()
    for module in LAYERED:
        reached, todo = set(), [module]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in reached:
                    reached.add(nxt)
                    todo.append(nxt)
        assert not [m for m in reached if m.startswith(ABOVE)], f"{module} reaches {sorted(reached)}"


def test_no_function_level_import_of_sharedfs_in_the_layered_modules() -> None:
    for module in LAYERED:
        path = KERNEL.parent.joinpath(*module.split(".")).with_suffix(".py")
        late = [(name, how, line) for name, uses in imports_of(path).items() for how, line, top in uses if not top]
        assert late == [], f"{os.path.relpath(path)}: imports inside functions hide the layering: {late}"
