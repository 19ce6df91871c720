"""The main environment is pinned: a fresh machine must install exactly what CI ran.

``scripts/constraints.txt`` (written by ``scripts/pin.sh``) pins every package that ``make test``,
CI's static checks and ``tests/upstream/run.py`` install.  A requirement added to one of those
files without re-pinning would resolve to whatever the index serves that day -- how filelock
4.3.1 reached a fresh machine while CI still ran 4.2 -- so these tests fail on it.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "scripts" / "constraints.txt"
REQUIREMENT_FILES = [ROOT / "scripts" / "requirements-test.txt", ROOT / "scripts" / "requirements-lint.txt",
                     ROOT / "tests" / "upstream" / "requirements.txt"]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(path: Path) -> dict[str, str | None]:
    """{name: pinned version or None} of a requirements file's requirement lines."""
    out: dict[str, str | None] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(==\s*([^;\s]+))?", line)
        assert match, f"{path.name}: cannot read {raw!r}"
        out[_normalize(match.group(1))] = match.group(4)
    return out


def _pins() -> dict[str, str]:
    pins = _requirements(CONSTRAINTS)
    unpinned = sorted(name for name, version in pins.items() if version is None)
    assert not unpinned, f"scripts/constraints.txt has lines without ==: {unpinned}"
    return {name: version for name, version in pins.items() if version is not None}


def test_every_requirement_of_the_main_environment_is_pinned_to_what_its_file_says() -> None:
    pins = _pins()
    problems = []
    for path in REQUIREMENT_FILES:
        for name, version in _requirements(path).items():
            if name not in pins:
                problems.append(f"{path.relative_to(ROOT)}: {name} is not in scripts/constraints.txt")
            elif version is not None and pins[name].split("+")[0] != version.split("+")[0]:
                problems.append(f"{path.relative_to(ROOT)}: {name}=={version}, constraints.txt pins {pins[name]}")
    for name in ("filelock", "pluggy", "packaging"):  # sharedfs's own dependencies
        if name not in pins:
            problems.append(f"sharedfs's dependency {name} is not in scripts/constraints.txt")
    assert not problems, "run scripts/pin.sh:\n" + "\n".join(problems)


@pytest.mark.skipif(not (ROOT / ".venv").exists() or Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
                    reason="checks the main environment (.venv) only: the compatibility cells pin their own, the bare unit-test venvs install sharedfs alone")
def test_the_main_environment_runs_the_pinned_releases() -> None:
    drift = []
    for name, pinned in _pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # installed by a later step (CI's static checks, the upstream suites), under the same pins
        if installed != pinned and installed.split("+")[0] != pinned.split("+")[0]:
            drift.append(f"{name}: pinned {pinned}, installed {installed}")
    assert not drift, "the environment is not the pinned one (make setup reinstalls it):\n" + "\n".join(drift)
