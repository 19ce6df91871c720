"""Shared fixtures: a built wheel, fresh virtual environments, and the hostile filesystems."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Sequence

import pytest

pytest_plugins = ["sharedfs.testing.pytest_plugin"]

ROOT = Path(__file__).resolve().parents[1]

# tests/upstream/ holds the runner of the frameworks' own suites (CI calls `python
# tests/upstream/run.py`) and their glue (a `tests` package each): never part of this run.  Not a
# conftest.py of its own there: a second module named `conftest` would shadow this one.
collect_ignore = ["upstream"]
#: What every venv gets besides sharedfs; pinned so a test run is reproducible.
DATASETS_REQ = os.environ.get("SHAREDFS_TEST_DATASETS", "datasets==5.2.0")


class Venv:
    """A real virtual environment, driven only through subprocesses."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.python = str(path / "bin" / "python")
        self.site_packages = Path(self.run("import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.python, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                              capture_output=True, text=True)
        assert proc.returncode == 0, f"pip {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc

    def run(self, code: str, *, flags: Sequence[str] = (), env: dict[str, str] | None = None,
            check: bool = True, cwd: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.python, *flags, "-c", code], capture_output=True, text=True,
                              env=clean_env(env), cwd=cwd or "/", timeout=timeout)
        if check:
            assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        return proc

    def sharedfs(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.path / "bin" / "sharedfs"), *args], capture_output=True, text=True,
                              env=clean_env(env), cwd="/")

    def status(self, env: dict[str, str] | None = None) -> dict:
        proc = self.sharedfs("status", "--json", env=env)
        return json.loads(proc.stdout)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test runner's environment without any SHAREDFS_* or PYTHON* leaking into children."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SHAREDFS_", "PYTHON", "HF_", "WDS_", "WIDS_")) and k != "LD_PRELOAD"}
    env.update(extra or {})
    return env


def make_venv(path: Path, *requirements: str) -> Venv:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    env = Venv(path)
    if requirements:
        env.pip("install", *requirements)
    return env


@pytest.fixture(autouse=True)
def _sharedfs_records_reach_caplog(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once sharedfs activates in a process it gives its logger a stderr handler and stops propagation
    (runtime._ensure_handler); in the test process, whichever test activated it first, caplog must
    still see sharedfs's records."""
    monkeypatch.setattr(logging.getLogger("sharedfs"), "propagate", True)


@pytest.fixture(scope="session")
def sharedfs_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = out.glob("sharedfs-*.whl")
    return wheel


@pytest.fixture(scope="session")
def datasets_venv(tmp_path_factory: pytest.TempPathFactory, sharedfs_wheel: Path) -> Venv:
    """A fresh venv with the sharedfs wheel and real Hugging Face datasets installed."""
    return make_venv(tmp_path_factory.mktemp("venv") / "datasets", str(sharedfs_wheel), DATASETS_REQ)


@pytest.fixture
def fresh_runtime(monkeypatch: pytest.MonkeyPatch):
    """The in-process sharedfs state with a clean environment, restored afterwards.

    Yields a namespace with the runtime's functions (``policy``, ``registry``, ``identity``)
    and ``configure``, so tests read as the public API does.
    """
    import types

    from sharedfs.machinery import choices, runtime
    from sharedfs.startup import activation
    for key in list(os.environ):
        if key.startswith(("SHAREDFS_", "SLURM")):
            monkeypatch.delenv(key)
    saved = runtime._state, activation._states
    runtime._state, activation._states = None, None
    choices.forget()
    api = types.SimpleNamespace(policy=runtime.policy, registry=runtime.registry, identity=runtime.identity,
                                configure=activation.configure, runtime=runtime)
    yield api
    runtime._state, activation._states = saved
    choices.forget()


def require(module: str, reason: str) -> None:
    """Import ``module`` for a test file, or skip the file with ``reason`` (a failure under CI)."""
    import importlib

    from sharedfs.testing.pytest_plugin import skip_or_fail

    try:
        importlib.import_module(module)
    except ImportError as exc:
        skip_or_fail(f"{reason} ({exc})", module_level=True)
