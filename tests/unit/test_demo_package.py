"""sharedfs.demo runs from the wheel: none of it imports pytest or the test harness, and its docstrings name every module.

``sharedfs demo`` runs without pytest; the fixtures, the skip rule and the Slurm cluster live in
tests/harness (imported as ``harness``), which the wheel does not ship.
"""

from __future__ import annotations

import ast
from pathlib import Path

import harness

import sharedfs.demo

DEMO = Path(sharedfs.demo.__file__).parent
HARNESS = Path(harness.__file__).parent


def forbidden_imports(root: Path) -> list[str]:
    """``file:line module`` for every import of pytest or of the harness under ``root``, function-level ones included."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(root)}:{node.lineno} {name}" for name in names
                      if name.split(".")[0] in ("pytest", "harness")]
    return found


def unnamed_modules(package: Path, dotted: str) -> list[str]:
    """The modules and subpackages of ``package`` its ``__init__`` docstring does not name as ``:mod:``."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    names = sorted({p.stem for p in package.glob("*.py") if p.stem != "__init__"} |
                   {p.name for p in package.iterdir() if (p / "__init__.py").is_file()})
    return [name for name in names if f"{dotted}.{name}`" not in doc]


def test_a_forbidden_import_is_named(tmp_path: Path) -> None:
    (tmp_path / "nodes.py").write_text("import os\n\ndef f():\n    import pytest\n")
    (tmp_path / "slurm.py").write_text("from harness.skips import skip_or_fail\nfrom . import nodes\n")
    assert forbidden_imports(tmp_path) == ["nodes.py:4 pytest", "slurm.py:1 harness.skips"]


def test_the_demo_runs_without_pytest_or_the_harness() -> None:
    assert forbidden_imports(DEMO) == []


def test_the_docstrings_name_every_module() -> None:
    assert unnamed_modules(DEMO, "sharedfs.demo") == []
    assert unnamed_modules(HARNESS, "harness") == []
