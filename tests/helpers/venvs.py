"""Real virtual environments, driven only through subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Sequence

from helpers.env import clean_env

__all__ = ["DATASETS_REQ", "Venv", "make_venv"]

#: What every venv gets besides sharedfs; pinned so a test run is reproducible.
DATASETS_REQ = os.environ.get("SHAREDFS_TEST_DATASETS", "datasets==5.2.0")


class Venv:
    """A real virtual environment, driven only through subprocesses."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.python = str(path / "bin" / "python")
        self.site_packages = Path(self.run("import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        # This environment's pip, pointed at the venv (pip --python): the venvs a test makes have no pip
        # of their own (ensurepip alone costs about 3 CPU-seconds a venv).
        proc = subprocess.run([sys.executable, "-m", "pip", "--python", self.python, "--disable-pip-version-check",
                               "-q", *args], capture_output=True, text=True)
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


def make_venv(path: Path, *requirements: str) -> Venv:
    """A new venv at ``path`` with ``requirements``: no pip in it (:meth:`Venv.pip` brings its own), nothing
    byte-compiled ahead (Python compiles what a test imports): half the CPU of a stock ``python -m venv``
    and ``pip install``, on a suite that is CPU-bound."""
    venv.EnvBuilder(with_pip=False, clear=True).create(path)
    env = Venv(path)
    if requirements:
        env.pip("install", "--no-compile", *requirements)
    return env
