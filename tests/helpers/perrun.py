"""Things a test run builds once and its pytest-xdist workers share: a wheel, a venv no test changes."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest

__all__ = ["built_once_per_run"]


def built_once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """``<run's directory>/<name>``, made by ``build(path)`` in the first worker that asks; the others wait for it.

    Built in place (a venv cannot be moved: its scripts name their interpreter by path) and marked
    complete after; an interrupted build is thrown away.  Only for what no test changes: a test that
    installs into a venv needs its own, or its tests in one xdist_group.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's directory, above every worker's own
    path, complete = base / name, base / f"{name}.complete"
    with open(base / f"{name}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not complete.exists():
            shutil.rmtree(path, ignore_errors=True)
            build(path)
            complete.touch()
    return path
