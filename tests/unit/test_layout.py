"""The test tree says what each test needs, and the tests share helpers one way.

tests/unit runs in `make check` and on bare Pythons: no root, FUSE, users, mounts or Slurm;
tests/system needs root; tests/integration the main environment's frameworks.  Helpers live in
tests/helpers and are imported from there (`from helpers import ...`), never from `conftest`.
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers import ROOT

FOLDERS = ("unit", "system", "integration")
#: What a unit test may not use: each needs root (or a Slurm cluster) and belongs in tests/system.
NOT_IN_UNIT = re.compile(r"\b(hostile_mount|slurm_cluster|throwaway_users|group_of_users|useradd|unixusers|"
                         r"shardcache_support|demo\.accounts|demo import accounts)\b|\[\"mount\"")
#: What neither a unit nor a system test may need: a framework or tool of the main environment.  CI runs
#: tests/unit and tests/system on bare Pythons (3.9, 3.13) where ``require`` fails under CI.
REQUIRES = re.compile(r"^require\(\"([\w.]+)\"", re.MULTILINE)
FROM_CONFTEST = re.compile(r"^\s*(from conftest import|import conftest)\b", re.MULTILINE)


def layout_problems(tests: Path) -> list[str]:
    """One line per test or helper that is out of place in ``tests``, naming it and where it belongs."""
    problems = []
    for path in sorted(tests.glob("*.py")):
        if path.name != "conftest.py":
            where = "tests/unit, tests/system or tests/integration" if path.name.startswith("test_") else "tests/helpers"
            problems.append(f"{path.name}: at the top of tests/; move it (git mv) to {where}")
    for path in sorted(tests.rglob("*.py")):
        relative = path.relative_to(tests)
        if relative.parts[0] == "upstream" or path.resolve() == Path(__file__).resolve():
            continue  # the frameworks' own suites; this file, which names what it looks for
        text = path.read_text()
        if FROM_CONFTEST.search(text):
            problems.append(f"{relative}: imports from conftest; import from helpers (tests/helpers) instead")
        found = NOT_IN_UNIT.search(text) if relative.parts[0] == "unit" else None
        if found:
            what = found.group(1) or "mount"
            problems.append(f"{relative}: uses {what}, which needs root: move it to tests/system")
        needs = REQUIRES.search(text) if relative.parts[0] in ("unit", "system") else None
        if needs:
            problems.append(f"{relative}: requires {needs.group(1)}, which only the main environment has: "
                            "move it to tests/integration")
    return problems


def test_a_misplaced_test_or_helper_is_named_with_where_it_belongs(tmp_path: Path) -> None:
    (tmp_path / "unit").mkdir()
    (tmp_path / "system").mkdir()
    (tmp_path / "conftest.py").write_text("")
    (tmp_path / "test_stray.py").write_text("")
    (tmp_path / "workertool.py").write_text("")
    (tmp_path / "unit" / "test_old_import.py").write_text("from conftest import clean_env\n")
    (tmp_path / "unit" / "test_mounts.py").write_text("def test(hostile_mount):\n    pass\n")
    (tmp_path / "unit" / "test_team.py").write_text("from sharedfs.demo.accounts import group_of_users\n")
    (tmp_path / "system" / "test_kernels.py").write_text('require("triton", "needs triton")\n')
    assert layout_problems(tmp_path) == [
        "test_stray.py: at the top of tests/; move it (git mv) to tests/unit, tests/system or tests/integration",
        "workertool.py: at the top of tests/; move it (git mv) to tests/helpers",
        "system/test_kernels.py: requires triton, which only the main environment has: move it to tests/integration",
        "unit/test_mounts.py: uses hostile_mount, which needs root: move it to tests/system",
        "unit/test_old_import.py: imports from conftest; import from helpers (tests/helpers) instead",
        "unit/test_team.py: uses demo.accounts, which needs root: move it to tests/system",
    ]


def test_this_checkouts_tests_are_where_their_needs_say() -> None:
    assert layout_problems(ROOT / "tests") == []
    assert all((ROOT / "tests" / folder).is_dir() for folder in FOLDERS)
