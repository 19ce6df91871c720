"""Where the checkout is, what a child process inherits, and skipping a file whose framework is missing."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from sharedfs.model.caches import PLACED_CACHES

__all__ = ["ROOT", "clean_env", "require"]

#: The sharedfs checkout under test.
ROOT = Path(__file__).resolve().parents[2]


#: What the test runner passes on although it starts with SHAREDFS_: where the framework venvs are kept
#: (sharedfs.demo.frameworkvenv), a setting of the test machine, not of sharedfs.  Without it a child
#: (`sharedfs demo`) would build or reinstall the venvs in the default cache, another checkout's.
KEPT = frozenset({"SHAREDFS_TEST_VENV_CACHE"})


#: The placed caches' variables: sharedfs in the test runner itself exports them once a test imports Triton,
#: tvm-ffi, ... (a child would then find its library's cache already moved, whatever the test set up).
PLACED = frozenset(row.variable for row in PLACED_CACHES)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test runner's environment without any SHAREDFS_* (but :data:`KEPT`), PYTHON* or placed-cache variable
    leaking into children."""
    env = {k: v for k, v in os.environ.items()
           if k in KEPT or (not k.startswith(("SHAREDFS_", "PYTHON", "HF_", "WDS_", "WIDS_"))
                            and k != "LD_PRELOAD" and k not in PLACED)}
    env.update(extra or {})
    return env


def require(module: str, reason: str) -> None:
    """Import ``module`` for a test file, or skip the file with ``reason`` (a failure under CI)."""
    from harness.skips import skip_or_fail

    try:
        importlib.import_module(module)
    except ImportError as exc:
        skip_or_fail(f"{reason} ({exc})", module_level=True)
