"""sharedfs.testing is the demo's harness: no module of it imports pytest, and its docstring names every module.

``sharedfs demo`` and the benchmarks run without pytest; the fixtures and the skip rule live in the
subpackage ``sharedfs.testing.pytest``, which nothing else in the harness may import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sharedfs.testing

HARNESS = Path(sharedfs.testing.__file__).parent
PYTEST_PACKAGE = HARNESS / "pytest"


def pytest_imports(root: Path) -> list[str]:
    """``file:line module`` for every import of pytest or of the harness's pytest package under ``root``
    (outside that package), function-level ones included."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if root / "pytest" in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(root)}:{node.lineno} {name}" for name in names
                      if name.split(".")[0] == "pytest" or name.startswith("sharedfs.testing.pytest")]
    return found


def unnamed_modules(package: Path) -> list[str]:
    """The modules and subpackages of ``package`` its ``__init__`` docstring does not name as ``:mod:``."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    dotted = "sharedfs." + ".".join(package.relative_to(HARNESS.parent).parts)
    names = sorted({p.stem for p in package.glob("*.py") if p.stem != "__init__"} |
                   {p.name for p in package.iterdir() if (p / "__init__.py").is_file()})
    return [name for name in names if f"{dotted}.{name}`" not in doc]


def test_a_pytest_import_in_the_harness_is_named(tmp_path: Path) -> None:
    (tmp_path / "pytest").mkdir()
    (tmp_path / "pytest" / "plugin.py").write_text("import pytest\n")
    (tmp_path / "nodes.py").write_text("import os\n\ndef f():\n    import pytest\n")
    (tmp_path / "slurm.py").write_text("from sharedfs.testing.pytest.skips import skip_or_fail\n")
    assert pytest_imports(tmp_path) == ["nodes.py:4 pytest", "slurm.py:1 sharedfs.testing.pytest.skips"]


def test_the_harness_runs_without_pytest() -> None:
    assert pytest_imports(HARNESS) == []


def test_the_docstrings_name_every_module() -> None:
    assert unnamed_modules(HARNESS) == []
    assert unnamed_modules(PYTEST_PACKAGE) == []
