"""Plugins and shims import only ``sharedfs``, ``sharedfs.types`` and ``sharedfs.errors``.

import-linter enforces it with a forbidden contract that names every other module of sharedfs/
(pyproject.toml); this test keeps that list complete, so a module added to the kernel is forbidden
to them the day it is added, and checks that the contract really fails on a plugin that reaches past
the surface.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import sharedfs
import sharedfs.types

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9/3.10
    tomllib = None

KERNEL = Path(sharedfs.__file__).parent
ROOT = KERNEL.parent
CONTRACT = "Plugins and shims import only sharedfs, sharedfs.types and sharedfs.errors"
SURFACE = {"types", "errors"}
PLUGGED = {"plugins", "shims"}  # installed inside sharedfs/, kept beside it in a checkout


def top_level() -> set[str]:
    """Every module and package directly under sharedfs/ (``sharedfs.X``)."""
    names = {path.stem for path in KERNEL.glob("*.py") if path.stem != "__init__"}
    names |= {path.name for path in KERNEL.iterdir() if (path / "__init__.py").is_file()}
    return {f"sharedfs.{name}" for name in names - PLUGGED}


def contract() -> dict[str, object]:
    if tomllib is None:  # pragma: no cover
        pytest.skip("tomllib needs Python 3.11")
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (found,) = [c for c in contracts if c["name"] == CONTRACT]
    return found


def test_the_contract_forbids_every_module_but_the_surface() -> None:
    found = contract()
    assert found["type"] == "forbidden" and sorted(found["source_modules"]) == ["sharedfs.plugins", "sharedfs.shims"]
    assert set(found["forbidden_modules"]) == top_level() - {f"sharedfs.{name}" for name in SURFACE}


def test_every_name_sharedfs_types_lends_resolves() -> None:
    for name in sharedfs.types.__all__:
        assert getattr(sharedfs.types, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        sharedfs.types.nothing  # noqa: B018


@pytest.mark.skipif(importlib.util.find_spec("importlinter") is None, reason="import-linter comes with make setup")
def test_a_plugin_that_reaches_past_the_surface_breaks_the_contract(tmp_path: Path) -> None:
    """First the contract holds on this checkout, then a plugin importing the registry breaks it."""
    plugin = ROOT / "plugins" / "zz_reaches_past.py"

    def lint() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "lint-imports"), "--contract",
                               "sharedfs-surface"], cwd=ROOT, capture_output=True, text=True, timeout=300)

    held = lint()
    assert held.returncode == 0, held.stdout + held.stderr
    try:
        plugin.write_text("from sharedfs.machinery.registry import BUILTIN_PLUGINS\n")
        broken = lint()
    finally:
        plugin.unlink()
    assert broken.returncode != 0
    assert "sharedfs.plugins.zz_reaches_past -> sharedfs.machinery.registry" in broken.stdout
