#!/usr/bin/env python3
"""The compatibility matrix: each framework's integration tests against other releases and Pythons.

The main environment (``make test``) is the newest stack on Python 3.11: datasets 5.2,
huggingface_hub 2.4, filelock 4.2, webdataset 1.0.2 + wids 0.1.11, torch 2.13.  Each cell
below is another combination a cluster really has; it gets its own virtual environment,
the frameworks pinned in ``tests/compat/<cell>.txt`` (every package, so a cell is the same
on every machine), and this checkout's sharedfs as a *wheel* -- the real install: the
``sharedfs.pth`` autoload in site-packages and ``plugins/`` + ``shims/`` inside the package,
not the checkout on ``sys.path`` as in the editable main environment.  Then that venv's
pytest runs the cell's test files from the repository root (the tests start their child
processes with ``sys.executable``, so everything runs in the cell, and the test process
itself imports sharedfs from the wheel too).

Order matters as on a cluster image: the frameworks (filelock included) are installed
first, sharedfs second, and the run fails if installing sharedfs changed any pin
(sharedfs requires filelock>=3.12, so an image's filelock 3.23 must stay).

A test that cannot apply to a cell is deselected by name in the cell, with a reason; a
deselection that matches no test fails the cell (it went stale), and so does any skip
under ``CI``.

Venvs are built once per machine per requirements file (and Python), under
``$SHAREDFS_COMPAT_CACHE`` (default ``/var/tmp/sharedfs-compat``), as
``<cell>-<hash>``; only sharedfs is reinstalled on each run.  Remove the directory to
rebuild.

    .venv/bin/python scripts/compat.py [--cells NAME,...] [--list] [--build-only] [--results FILE]

Exit status: 0 every cell passed; 1 a cell failed (a test, a pin, the autoload); 2 a cell
could not be built or run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "tests" / "compat"
DEFAULT_CACHE = "/var/tmp/sharedfs-compat"
#: Part of every venv's key: bump it when the way a venv is built changes.
RECIPE = "1"
#: Shown in the table: what a cell is about.
SHOWN = ("datasets", "huggingface_hub", "filelock", "webdataset", "wids", "torch")
TEST_TIMEOUT = 30 * 60

DATASETS = "tests/integration/test_datasets.py"
HUB = "tests/integration/test_huggingface_hub.py"
CONTRACT = "tests/integration/test_filelock_contract.py"
WEBDATASET = "tests/integration/test_webdataset.py"
WIDS = "tests/integration/test_wids.py"
TORCH = "tests/integration/test_torch.py"
MMENGINE = "tests/integration/test_mmengine.py"
#: The pins of the main environment (make test), written by scripts/pin.sh.
MAIN_PINS = ROOT / "scripts" / "constraints.txt"
#: What ``--newest`` resolves unpinned: every library sharedfs patches, its own dependencies, and what
#: the tests need (pytest, the FUSE bindings; numpy for torch.distributed's object collectives).
NEWEST_NAMES = ("filelock", "datasets", "huggingface_hub", "webdataset", "wids", "torch", "mmengine", "pluggy",
                "packaging", "pytest", "mfusepy", "numpy")
#: The libraries whose moves ``--newest`` reports first (what sharedfs patches or is built on).
PATCHED = ("filelock", "datasets", "huggingface_hub", "webdataset", "wids", "torch", "mmengine", "pluggy",
           "packaging")
#: The integration tests of every patched framework, as make test runs them on the pins.
NEWEST_TESTS = (DATASETS, HUB, CONTRACT, WEBDATASET, WIDS, TORCH, MMENGINE)

#: Tests that build a venv of their own with fixed pins (they do not use the cell's
#: frameworks at all): the main run (make test) runs them, a cell would only repeat them.
OWN_VENV = {
    f"{DATASETS}::test_lustre_noflock_old_filelock_is_fixed_by_pip_install_sharedfs":
        "builds its own venv (filelock 3.23.0 + datasets 5.2.0) whatever the cell has: run by make test",
    f"{DATASETS}::test_nfs_nolock_enolck_fails_without_sharedfs_and_works_with_it[old]":
        "its 'old' stack is a venv of its own (datasets 3.6.0 + hub 0.36.0): run by make test; "
        "the [new] case is the cell's own stack",
    f"{DATASETS}::test_old_stack_gets_both_shims":
        "builds its own venv (datasets 3.6.0 + hub 0.36.0) whatever the cell has: run by make test",
    f"{HUB}::test_lustre_noflock_downloads_never_hang_on_leftover_or_killed_holders_lock":
        "builds its own venv (hub 0.36.0 + filelock 3.23.0) whatever the cell has: run by make test",
}
#: torch cannot come from local disk on these Pythons (only a cp311 CPU wheel does); PyPI's
#: Linux wheels pull several GB of CUDA libraries.
NO_TORCH = {
    f"{DATASETS}::test_dataset_sent_to_another_node_from_a_node_local_cache":
        "a real gloo job: needs torch, not installed in this cell (no CPU wheel on local disk for this "
        "Python; PyPI's pulls GBs of CUDA); runs in make test and in old-hf",
}


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str  # also tests/compat/<name>.txt
    python: str  # major.minor
    why: str
    tests: tuple[str, ...]
    deselect: dict[str, str]  # pytest node id -> why it cannot (or need not) run in this cell
    shims: tuple[str, ...]  # the shims that must report the installed release as supported

    @property
    def requirements(self) -> Path:
        return REQUIREMENTS / f"{self.name}.txt"


CELLS = [
    Cell(
        name="old-hf",
        python="3.11",
        why="the 2025 cluster image: datasets 3.x + hub 0.x (what transformers 4.48 accepts), filelock 3.23 "
            "(the last without its own ENOSYS fallback) installed before sharedfs",
        tests=(DATASETS, HUB, CONTRACT),
        deselect=dict(OWN_VENV),
        shims=("datasets", "huggingface_hub"),
    ),
    Cell(
        name="old-webdataset",
        python="3.11",
        why="webdataset 0.2.111 (the last before 1.0) with the wids it bundles: no wids distribution installed",
        tests=(WEBDATASET, WIDS),
        deselect={},
        shims=("webdataset", "wids"),
    ),
    Cell(
        name="py3.9",
        python="3.9",
        why="the oldest Python sharedfs supports, with the newest releases that still install there: "
            "datasets 4.5 and hub 1.8 (the middle of both lines), filelock 3.19 (3.20 dropped Python 3.9)",
        tests=(DATASETS, HUB, CONTRACT),
        deselect={**OWN_VENV, **NO_TORCH},
        shims=("datasets", "huggingface_hub"),
    ),
    Cell(
        name="newest",
        python="3.11",
        why="today's newest releases of everything sharedfs patches, torch 2.15 included: since 2.14 torch builds "
            "C++ extensions under torch.utils._filelock.FileLock instead of FileBaton (the main environment keeps "
            "torch 2.13, the CPU build on this machine's disk; 2.14's and 2.15's wheels are CUDA builds of ~5 GB)",
        tests=(TORCH, WIDS),
        deselect={},
        shims=("torch", "wids"),
    ),
    Cell(
        name="py3.13",
        python="3.13",
        why="the newest Python this machine kind has, with the newest stack (as the main environment)",
        tests=(DATASETS, HUB, CONTRACT),
        deselect={**OWN_VENV, **NO_TORCH},
        shims=("datasets", "huggingface_hub"),
    ),
]


# -- helpers ----------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"compat: {message}", file=sys.stderr, flush=True)


def find_python(version: str) -> str | None:
    """The newest pyenv build of ``version``, else ``pythonX.Y`` on PATH."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    builds = sorted(glob.glob(os.path.join(pyenv, "versions", f"{version}.*", "bin", "python")),
                    key=lambda p: [int(x) if x.isdigit() else -1 for x in Path(p).parts[-3].split(".")])
    if builds:
        return builds[-1]
    return shutil.which(f"python{version}")


def full_version(python: str) -> str:
    return subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()


def pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements file -> {normalized name: version}."""
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = line.split("==", 1)
            out[normalize(name.split("[")[0])] = version.split(";")[0].strip()
    return out


def normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def cell_env(venv: Path) -> dict[str, str]:
    """The caller's environment (CI, SHAREDFS_STRICT, ...) as if the cell's venv were activated."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def pip(venv: Path, *args: str) -> None:
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True, env=cell_env(venv))
    if proc.returncode != 0:
        raise CellError(f"pip {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


class CellError(Exception):
    """The cell could not be built or run (exit 2), as opposed to a test failing in it."""


def build_wheel(out: Path) -> Path:
    """This checkout as a wheel (what ``pip install sharedfs`` installs)."""
    isolation = ["--no-build-isolation"] if _has_hatchling() else []
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps", "-q",
                           *isolation, "-w", str(out), str(ROOT)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CellError(f"building the sharedfs wheel failed:\n{proc.stderr[-3000:]}")
    (wheel,) = out.glob("sharedfs-*.whl")
    return wheel


def _has_hatchling() -> bool:
    """Build with the running interpreter's hatchling when it has one (no download, no network)."""
    import importlib.util

    return importlib.util.find_spec("hatchling") is not None


# -- one cell ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    cell: str
    status: str = "not run"  # passed | failed | error | not run
    python: str = ""
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    deselected: int = 0
    build_s: float = 0.0  # 0: the venv was there already
    test_s: float = 0.0
    problems: list[str] = dataclasses.field(default_factory=list)
    venv: str = ""


@contextlib.contextmanager
def venv_for(cell: Cell, python: str, cache: Path, result: Result) -> Iterator[Path]:
    """The cell's venv with its pinned frameworks, built once per machine (per requirements and Python).

    Held exclusively while it is used: a concurrent run (another checkout on the same machine)
    waits instead of reinstalling its own sharedfs under this run's tests.  Venvs of the same
    cell built from other requirements are removed unless in use.
    """
    version = full_version(python)
    result.python = version
    key = hashlib.sha256(f"{RECIPE}\n{version}\n{cell.requirements.read_text()}".encode()).hexdigest()[:12]
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / f"{cell.name}-{key}"
    result.venv = str(root)
    with open(cache / f"{cell.name}-{key}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not (root / ".complete").exists():
            log(f"{cell.name}: building {root} (Python {version}, {cell.requirements.relative_to(ROOT)})")
            started = time.monotonic()
            shutil.rmtree(root, ignore_errors=True)  # a half-built venv from an interrupted run
            subprocess.run([python, "-m", "venv", str(root)], check=True)
            # The frameworks first, as on a cluster image; sharedfs comes after (install_sharedfs).
            pip(root, "install", "--no-deps", "-r", str(cell.requirements))
            pip(root, "check")  # the pins are a complete, consistent set
            result.build_s = time.monotonic() - started
            (root / ".complete").write_text(f"{result.build_s:.0f}\n")
            _prune(cache, cell, keep=root)
        yield root


def _prune(cache: Path, cell: Cell, keep: Path) -> None:
    for other in cache.glob(f"{cell.name}-*.lock"):
        venv = other.with_suffix("")
        if venv == keep or not re.fullmatch(rf"{re.escape(cell.name)}-[0-9a-f]{{12}}", venv.name):
            continue
        with open(other, "w") as guard:
            try:
                fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # in use by another run
            log(f"{cell.name}: removing {venv} (built from other requirements)")
            shutil.rmtree(venv, ignore_errors=True)
            other.unlink()


def install_sharedfs(venv: Path, wheel: Path) -> None:
    pip(venv, "install", "--no-deps", "--force-reinstall", str(wheel))
    pip(venv, "install", str(wheel))  # a dependency the pins lack (a new one of sharedfs's): fetched, never upgraded


def check_venv(cell: Cell, venv: Path, result: Result, pinned: bool = True) -> None:
    """Every pin still holds after sharedfs went in; sharedfs autoloads from the venv, with the cell's shims."""
    installed = _installed(venv)
    for name, pinned_version in (pins(cell.requirements) if pinned else {}).items():
        got = installed.get(name)
        if got is None or (got != pinned_version and got.split("+")[0] != pinned_version):
            result.problems.append(f"pin {name}=={pinned_version} does not hold after installing sharedfs: {got}")
    result.versions = {name: installed[normalize(name)] for name in SHOWN if normalize(name) in installed}
    if "wids" not in installed and installed.get("webdataset", "").startswith("0.2."):
        result.versions["wids"] = "(webdataset's copy)"

    env = {k: v for k, v in cell_env(venv).items() if not k.startswith(("SHAREDFS_", "HF_", "WDS_", "WIDS_"))}
    proc = subprocess.run([str(venv / "bin" / "sharedfs"), "status", "--json"], capture_output=True, text=True,
                          cwd="/", env=env)
    try:
        status = json.loads(proc.stdout)
    except ValueError:
        raise CellError(f"sharedfs status failed in the cell:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    where = "import sharedfs, sysconfig; print(sharedfs.__file__); print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([str(venv / "bin" / "python"), "-c", where], capture_output=True, text=True, cwd="/",
                          env=env).stdout.split()
    autoload = status.get("autoload", {})
    if not autoload.get("active_in_this_interpreter") or not str(autoload.get("pth_file", "")).startswith(str(venv)):
        result.problems.append(f"sharedfs autoload is not active in the cell: {autoload}")
    if len(site) != 2 or not site[0].startswith(site[1]):
        result.problems.append(f"sharedfs is not imported from the cell's site-packages (the wheel): {site}")
    shims = {s["name"]: s for s in status.get("shims", [])}
    for name in cell.shims:
        shim = shims.get(name)
        if not shim or not shim.get("supported") or not shim.get("installed"):
            result.problems.append(f"shim {name} does not apply to the cell's release: {shim}")


def run_tests(cell: Cell, venv: Path, out: Path, result: Result) -> None:
    junit = out / f"{cell.name}.xml"
    # bin/pytest, not python -m pytest: the checkout stays off sys.path, so the test process imports
    # sharedfs from the wheel too, as its children do.
    argv = [str(venv / "bin" / "pytest"), "-p", "no:cacheprovider", "-q", "-rfEs", "--durations=5",
            f"--junitxml={junit}", *cell.tests]
    for node in cell.deselect:
        argv += ["--deselect", node]
    log(f"{cell.name}: pytest {' '.join(argv[1:])}")
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=cell_env(venv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the cell's pytest output, prefixed, as it comes
            lines.append(line)
            print(f"[{cell.name}] {line}", end="", flush=True)
        proc.wait(timeout=TEST_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        result.problems.append(f"pytest timed out after {TEST_TIMEOUT} s")
    finally:
        result.test_s = time.monotonic() - started
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if not junit.exists():
        raise CellError(f"pytest wrote no report (exit {proc.returncode}):\n{''.join(lines[-40:])}")
    top = ET.parse(junit).getroot()
    suites = [top] if top.tag == "testsuite" else list(top)
    total = sum(int(s.get("tests", 0)) for s in suites)
    result.failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    result.skipped = sum(int(s.get("skipped", 0)) for s in suites)
    result.passed = total - result.failed - result.skipped
    summary = next((line for line in reversed(lines) if " in " in line and ("passed" in line or "failed" in line)), "")
    result.deselected = _count(summary, "deselected")
    if result.deselected != len(cell.deselect):
        result.problems.append(f"{len(cell.deselect)} deselections, pytest deselected {result.deselected}: "
                               "a deselected test was renamed or removed (update the cell)")
    if result.skipped and os.environ.get("CI"):
        result.problems.append(f"{result.skipped} test(s) skipped under CI: deselect them in the cell, with a reason")
    if proc.returncode not in (0, 1) and not result.problems:
        result.problems.append(f"pytest exited {proc.returncode}")
    if total == 0:
        result.problems.append("no test ran")


def _count(summary: str, word: str) -> int:
    tokens = summary.replace(",", " ").split()
    for i, token in enumerate(tokens[1:], 1):
        if token == word and tokens[i - 1].isdigit():
            return int(tokens[i - 1])
    return 0


def run_cell(cell: Cell, cache: Path, wheel: Path | None, out: Path, build_only: bool) -> Result:
    result = Result(cell.name)
    python = find_python(cell.python)
    if python is None:
        result.status = "error" if os.environ.get("CI") else "not run"
        result.problems.append(f"no Python {cell.python} on this machine (pyenv or python{cell.python} on PATH)")
        return result
    try:
        with venv_for(cell, python, cache, result) as venv:
            if build_only:
                result.status = "built"
                return result
            assert wheel is not None
            install_sharedfs(venv, wheel)
            check_venv(cell, venv, result)
            if not result.problems:
                run_tests(cell, venv, out, result)
    except (CellError, subprocess.CalledProcessError) as exc:
        result.status = "error"
        result.problems.append(str(exc))
        return result
    result.status = "passed" if not result.failed and not result.problems else "failed"
    return result


# -- --newest: the same tests on whatever the index serves today -------------------------------------


def newest_cell() -> Cell:
    return Cell(
        name="unpinned",
        python="3.11",
        why="every patched library resolved unpinned today (the run a maintainer makes before a release)",
        tests=NEWEST_TESTS,
        deselect=dict(OWN_VENV),
        shims=("datasets", "huggingface_hub", "webdataset", "wids", "torch", "mmengine"),
    )


def run_newest(out: Path, wheel: Path) -> tuple[Result, dict[str, tuple[str, str]], list[str]]:
    """Build a throwaway venv with NEWEST_NAMES unpinned, run NEWEST_TESTS in it, compare with the pins.

    Returns the run's result, {library: (pinned, resolved)} for every library that moved, and the
    ids of tests that fail there but pass on the pins (each failing id is run again in the main
    environment, this interpreter: a test that fails there too is not the newest releases' doing).
    """
    cell = newest_cell()
    result = Result(cell.name)
    python = find_python(cell.python)
    if python is None:
        result.status = "error"
        result.problems.append(f"no Python {cell.python} on this machine")
        return result, {}, []
    venv = out / "unpinned-venv"
    log(f"{cell.name}: resolving {' '.join(NEWEST_NAMES)} unpinned into {venv}")
    started = time.monotonic()
    try:
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        pip(venv, "install", *NEWEST_NAMES)
        result.build_s = time.monotonic() - started
        install_sharedfs(venv, wheel)
        check_venv(cell, venv, result, pinned=False)
        result.problems = [p for p in result.problems if not p.startswith("shim ")]  # reported as moved below
        run_tests(cell, venv, out, result)
    except (CellError, subprocess.CalledProcessError) as exc:
        result.status = "error"
        result.problems.append(str(exc))
        return result, {}, []
    resolved = _installed(venv)
    pinned = {**pins(MAIN_PINS), **pins(REQUIREMENTS / "newest.txt")} if MAIN_PINS.exists() else {}
    moved = {name: (pinned.get(normalize(name), "-"), resolved.get(normalize(name), "-")) for name in PATCHED
             if pinned.get(normalize(name), "-").split("+")[0] != resolved.get(normalize(name), "-").split("+")[0]}
    failing = _failing_ids(out / f"{cell.name}.xml")
    only_newest = []
    if failing:
        log(f"{cell.name}: {len(failing)} test(s) failed; running them on the pins (this environment)")
        again = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                                f"--junitxml={out / 'pinned.xml'}", *failing], cwd=ROOT, capture_output=True, text=True)
        still = set(_failing_ids(out / "pinned.xml")) if (out / "pinned.xml").exists() else set()
        if again.returncode not in (0, 1):
            result.problems.append(f"the rerun on the pins exited {again.returncode}:\n{again.stdout[-2000:]}")
        only_newest = [node for node in failing if node not in still]
    result.status = "passed" if not result.failed and not result.problems else "failed"
    return result, moved, only_newest


def _installed(venv: Path) -> dict[str, str]:
    code = ("import json, importlib.metadata as m\n"
            "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd="/",
                          env={**cell_env(venv), "SHAREDFS_DISABLE": "1"})
    if proc.returncode != 0:
        raise CellError(f"reading the installed versions failed:\n{proc.stderr[-2000:]}")
    return {normalize(k): v for k, v in json.loads(proc.stdout).items()}


def _failing_ids(junit: Path) -> list[str]:
    """pytest node ids of the failed and errored tests in a junit report (file::name form)."""
    ids = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            module = case.get("classname", "").replace(".", "/")
            ids.append(f"{module}.py::{case.get('name')}")
    return ids


def newest_report(result: Result, moved: dict[str, tuple[str, str]], only_newest: list[str]) -> str:
    lines = [f"newest: {result.passed} passed, {result.failed} failed, {result.skipped} skipped "
             f"({result.status}; resolved in {result.build_s / 60:.1f} min, tested in {result.test_s / 60:.1f} min)"]
    if moved:
        lines.append("moved since the pins (scripts/constraints.txt, tests/compat/newest.txt):")
        lines += [f"  {name}: {old} -> {new}" for name, (old, new) in moved.items()]
    else:
        lines.append("nothing moved since the pins: every patched library resolves to its pinned release")
    if only_newest:
        lines.append("failing only with the newest releases (they pass on the pins):")
        lines += [f"  {node}" for node in only_newest]
    lines += [f"newest: {problem}" for problem in result.problems]
    return "\n".join(lines)


# -- the table ----------------------------------------------------------------------------------------


def table(results: list[Result]) -> str:
    rows = [("cell", "python", "versions installed", "passed", "failed", "skipped", "deselected", "build min",
             "test min", "result")]
    for r in results:
        versions = " ".join(f"{k} {v}" for k, v in r.versions.items()) or "-"
        rows.append((r.cell, r.python or "-", versions, str(r.passed), str(r.failed), str(r.skipped),
                     str(r.deselected), f"{r.build_s / 60:.1f}" if r.build_s else "cached", f"{r.test_s / 60:.1f}",
                     r.status))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        for problem in r.problems:
            lines.append(f"{r.cell}: {problem}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", help="comma-separated cell names (default: all)")
    parser.add_argument("--list", action="store_true", help="print the cells, their tests and deselections")
    parser.add_argument("--build-only", action="store_true", help="build the cells' venvs, run nothing")
    parser.add_argument("--results", type=Path, help="write the results as JSON to this file")
    parser.add_argument("--newest", action="store_true",
                        help="instead of the cells: resolve every patched library unpinned, run their integration "
                             "tests, and report what moved since the pins and what fails only there")
    args = parser.parse_args(argv)
    if args.newest:
        return main_newest(args.results)

    cells = CELLS
    if args.cells:
        wanted = args.cells.split(",")
        unknown = set(wanted) - {c.name for c in CELLS}
        if unknown:
            parser.error(f"unknown cell(s) {sorted(unknown)}; known: {[c.name for c in CELLS]}")
        cells = [c for c in CELLS if c.name in wanted]
    if args.list:
        for cell in cells:
            print(f"{cell.name} (Python {cell.python}, {cell.requirements.relative_to(ROOT)}): {cell.why}")
            for test in cell.tests:
                print(f"    runs {test}")
            for node, reason in cell.deselect.items():
                print(f"    deselects {node.split('::', 1)[1]}: {reason}")
        return 0

    cache = Path(os.environ.get("SHAREDFS_COMPAT_CACHE", DEFAULT_CACHE))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sharedfs-compat-") as tmp:
        out = Path(tmp)
        wheel = None if args.build_only else build_wheel(out / "wheel")
        results = []
        for cell in cells:
            log(f"{cell.name}: {cell.why}")
            results.append(run_cell(cell, cache, wheel, out, args.build_only))
            log(f"{cell.name}: {results[-1].status}")
    print()
    print(table(results))
    print(f"\n{len(results)} cell(s) in {(time.monotonic() - started) / 60:.1f} min")
    if not args.build_only:  # the plain closing line CI reads: every test of every cell
        print(f"compat: {sum(r.passed for r in results)} passed, {sum(r.failed for r in results)} failed, "
              f"{sum(r.skipped for r in results)} skipped")
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=2) + "\n")
    if any(r.status == "error" for r in results):
        return 2
    return 1 if any(r.status == "failed" for r in results) else 0


def main_newest(results: Path | None) -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sharedfs-newest-", dir=os.environ.get("SHAREDFS_COMPAT_CACHE")) as tmp:
        out = Path(tmp)
        wheel = build_wheel(out / "wheel")
        result, moved, only_newest = run_newest(out, wheel)
    print()
    print(newest_report(result, moved, only_newest))
    print(f"\nnewest run in {(time.monotonic() - started) / 60:.1f} min")
    if results:
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(json.dumps({"result": dataclasses.asdict(result), "moved": moved,
                                       "failing_only_newest": only_newest}, indent=2) + "\n")
    if result.status == "error":
        return 2
    return 1 if only_newest or result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
