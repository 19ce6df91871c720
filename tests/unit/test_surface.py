"""The surface plugins and shims may import is named, and the contract forbids the rest of the kernel.

docs/architecture.md ("What plugins and shims import") lists the surface; the import-linter
contract "Plugins and shims use the kernel's surface" (pyproject.toml) lists every other module.
import-linter enforces the contract; this test keeps the two lists complete and disjoint, so a
module added to the kernel is put on one side or the other, and neither list names a module that
is gone.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import sharedfs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9/3.10
    tomllib = None

KERNEL = Path(sharedfs.__file__).parent
ROOT = KERNEL.parent
CONTRACT = "Plugins and shims use the kernel's surface"
MARKER = "<!-- surface: the first column is parsed by tests/unit/test_surface.py -->"


def kernel_modules() -> dict[str, bool]:
    """Every module of the kernel -> whether it is a package (plugins and shims are not the kernel)."""
    found: dict[str, bool] = {}
    for path in KERNEL.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts.pop()
        name = ".".join(parts)
        if name == "sharedfs" or name.startswith(("sharedfs.plugins", "sharedfs.shims")):
            continue
        found[name] = package
    return found


def surface() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index(MARKER) + len(MARKER):].lstrip().split("\n\n")[0]
    return [match.group(1) for line in table.splitlines()[2:] if (match := re.match(r"\| `([\w.*]+)` \|", line))]


def forbidden() -> list[str]:
    text = (ROOT / "pyproject.toml").read_text()
    if tomllib is not None:
        contracts = tomllib.loads(text)["tool"]["importlinter"]["contracts"]
        (contract,) = [c for c in contracts if c["name"] == CONTRACT]
        assert contract["type"] == "forbidden" and sorted(contract["source_modules"]) == ["sharedfs.plugins",
                                                                                           "sharedfs.shims"]
        return list(contract["forbidden_modules"])
    block = text[text.index(f'name = "{CONTRACT}"'):]
    block = block[block.index("forbidden_modules = ["):]
    block = block[:block.index("]")]
    return re.findall(r'"([\w.]+)"', block)


def misfiled(modules: dict[str, bool], allowed: list[str], denied: list[str]) -> list[str]:
    """What is wrong with the two lists for ``modules``: one line per module or entry, empty when right."""
    def on_surface(name: str) -> bool:
        return name in allowed or any(entry.endswith(".*") and name.startswith(entry[:-1]) for entry in allowed)

    def denied_for(name: str) -> bool:  # import-linter forbids a package's descendants with it
        return any(name == entry or name.startswith(entry + ".") for entry in denied)

    problems = []
    for entry in [*allowed, *denied]:
        if entry.removesuffix(".*") not in modules:
            problems.append(f"{entry}: named, but no such module")
    for name, package in sorted(modules.items()):
        allowed_here, denied_here = on_surface(name), denied_for(name)
        if allowed_here and denied_here:
            problems.append(f"{name}: on the surface and forbidden")
        elif not allowed_here and not denied_here and not package:
            # A package's __init__ is a namespace: its modules are filed one by one.
            problems.append(f"{name}: neither on the surface (docs/architecture.md) nor forbidden (pyproject.toml)")
    return problems


def test_the_surface_and_the_contract_name_every_module_of_the_kernel_once() -> None:
    allowed = surface()
    assert "sharedfs.types" in allowed and "sharedfs.fs.*" in allowed
    assert "sharedfs.machinery.runtime" in forbidden()
    assert misfiled(kernel_modules(), allowed, forbidden()) == []


def test_a_new_module_on_neither_side_and_a_stale_entry_are_named() -> None:
    modules = {**kernel_modules(), "sharedfs.cluster.newthing": False}
    problems = misfiled(modules, [*surface(), "sharedfs.cluster.gone"], forbidden())
    assert problems == ["sharedfs.cluster.gone: named, but no such module",
                        "sharedfs.cluster.newthing: neither on the surface (docs/architecture.md) nor forbidden "
                        "(pyproject.toml)"]
    assert misfiled(kernel_modules(), surface(), [*forbidden(), "sharedfs.cluster.dirs"]) == [
        "sharedfs.cluster.dirs: on the surface and forbidden"]
