"""The field symptom of a FIFO as SHAREDFS_CONFIG: `import datasets` hung for more than 25 s.

Here (real datasets, a fresh interpreter, a deadline) it fails at once with a
ConfigError naming the variable; tests/unit/test_config_hardening.py covers the
same with sharedfs alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import clean_env, require

import sharedfs

DEADLINE = 40.0
CHECKOUT = str(Path(sharedfs.__file__).resolve().parents[1])


def test_import_datasets_with_a_fifo_config_fails_fast(tmp_path: Path) -> None:
    require("datasets", "datasets is needed for the import-time check")
    fifo = tmp_path / "site.toml"
    os.mkfifo(fifo)
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", "import datasets"], check=False, capture_output=True, text=True,
                              env=clean_env({"PYTHONPATH": CHECKOUT, "SHAREDFS_CONFIG": str(fifo)}), timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"import datasets with SHAREDFS_CONFIG={fifo} (a FIFO) hung for {DEADLINE:.0f} s")
    assert time.monotonic() - started < DEADLINE
    assert proc.returncode != 0, proc.stdout
    assert f"ConfigError: SHAREDFS_CONFIG='{fifo}' is not valid: expected a regular TOML file (it is a FIFO)" \
        in proc.stderr, proc.stderr
