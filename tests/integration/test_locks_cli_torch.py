"""``sharedfs locks`` reads torch's extension build baton as the torch shim writes it.

The shim and the command share the baton's names (``sharedfs.locks.names``): the build lock
``<build_dir>/lock``, the sharedfs lock ``lock.sharedfs`` beside it, and the kind written into
the baton's record.  Shown with real builds killed half-way (pytorch#189245): torch without
sharedfs leaves an empty baton nobody can judge; a sharedfs builder leaves one the command names
as a dead builder's, keeps (torch without sharedfs may be polling it), and the next build replaces.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import clean_env, require

from sharedfs.testing.pytest_plugin import skip_or_fail
from sharedfs.testing.scenario_torch import (
    EXTENSION,
    Toolchain,
    ToolchainMissing,
    answer,
    builds_under_filelock,
    kill_mid_build,
    run_load,
    toolchain,
)

pytestmark = pytest.mark.slow
require("torch", "the torch shims are tested against real torch")

if builds_under_filelock():
    pytest.skip("torch >= 2.14 builds under filelock, not a FileBaton", allow_module_level=True)


@pytest.fixture
def chain(tmp_path: Path) -> Toolchain:
    try:
        return toolchain(tmp_path)
    except ToolchainMissing as exc:
        skip_or_fail(str(exc))


def _locks(*args: str) -> tuple[int, list[dict[str, Any]]]:
    done = subprocess.run([sys.executable, "-m", "sharedfs", "locks", "--json", *args], capture_output=True,
                          text=True, timeout=120, env=clean_env())
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def _baton_rows(rows: list[dict[str, Any]], baton: Path) -> list[dict[str, Any]]:
    return [row for row in rows if row["file"] == str(baton)]


def test_sharedfs_locks_names_a_dead_sharedfs_builders_baton_keeps_it_and_the_next_build_replaces_it(
    tmp_path: Path, chain: Toolchain
) -> None:
    # torch without sharedfs: the killed builder's baton is empty, and nothing says whose it is.
    stock = tmp_path / "stock"
    kill_mid_build(chain, chain.env(clean_env({"SHAREDFS_DISABLE": "1"}), stock))
    stock_baton = stock / EXTENSION / "lock"
    assert stock_baton.exists() and stock_baton.read_bytes() == b""
    _, rows = _locks(str(stock))
    assert all(row["holder"] is None and row["state"] != "dead" for row in _baton_rows(rows, stock_baton)), rows

    # With sharedfs: the baton holds the builder's record, which the command reads as torch's baton of a dead
    # sharedfs builder (the same kind the shim wrote), beside the sharedfs lock the builder held.
    root = tmp_path / "sharedfs"
    pid = kill_mid_build(chain, chain.env(clean_env(), root))
    baton = root / EXTENSION / "lock"
    assert (root / EXTENSION / "lock.sharedfs").exists() or (root / EXTENSION / "lock.sharedfs.held").exists()
    code, rows = _locks(str(root))
    [row] = _baton_rows(rows, baton)
    assert (row["kind"], row["state"]) == ("torch-baton", "dead"), rows
    assert row["holder"]["pid"] == pid and row["holder"]["lock_kind"] == "torch-baton", row
    assert "never removed here" in row["evidence"], row

    # --clear-dead keeps it: torch without sharedfs may be polling that name, and its absence means "built".
    _locks("--clear-dead", str(root))
    assert baton.exists()

    # The next sharedfs build takes it over (one rename), finishes the build and releases it.
    assert answer(run_load(chain.env(clean_env(), root), 180)) is not None
    assert not baton.exists()
    _, rows = _locks(str(root))
    assert _baton_rows(rows, baton) == [], rows
