"""Virtual environments for framework stacks that cannot share the main environment, built once and reused.

Some frameworks pin what the main environment cannot have (OLMo-core, through
cached-path, needs ``filelock<4`` and ``huggingface-hub<2``).  Their tests and
demo scenarios run in a venv of their own, built from a fully pinned
requirements file and kept under ``SHAREDFS_TEST_VENV_CACHE`` (default
``/var/tmp/sharedfs-test-venvs``) as ``<name>-<hash of the file>``: a changed
pin builds a new one, an interrupted build is thrown away, and two builders
wait for each other (a ``flock`` beside it).  sharedfs itself is installed
into it separately (:func:`install_sharedfs`), so one stack serves every
checkout and wheel.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import venv
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pragma: no cover
    from importlib.metadata import PackagePath

__all__ = ["CACHE_ENV", "DEFAULT_CACHE", "cached_venv", "install_sharedfs", "python_of", "source_checkout"]

CACHE_ENV = "SHAREDFS_TEST_VENV_CACHE"
DEFAULT_CACHE = "/var/tmp/sharedfs-test-venvs"
HERE = Path(__file__).resolve().parent


class VenvBuildError(RuntimeError):
    """pip could not build the stack; the message has pip's last lines."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def python_of(root: Path) -> str:
    return str(root / "bin" / "python")


def _pip(root: Path, *args: str) -> None:
    proc = subprocess.run([python_of(root), "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True, check=False)
    if proc.returncode:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise VenvBuildError(f"pip {' '.join(args)} failed in {root}:\n{tail}")


def cached_venv(name: str, requirements: Path, *, note: Callable[[str], None] = lambda line: None) -> Path:
    """The venv ``<cache>/<name>-<hash>`` with ``requirements`` installed; built now if missing (``note`` says so)."""
    key = hashlib.sha256(requirements.read_bytes()).hexdigest()[:12]
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / f"{name}-{key}"
    with open(cache / f"{name}-{key}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # two sessions must not build the same venv at once
        if not (root / ".complete").exists():
            note(f"building the {name} environment once (pip, pinned in {requirements.name}; kept in {root})")
            shutil.rmtree(root, ignore_errors=True)  # a half-built venv from an interrupted run
            venv.EnvBuilder(with_pip=True, clear=True).create(root)
            _pip(root, "install", "-r", str(requirements))
            (root / ".complete").touch()
    return root


#: What sharedfs the venv has: the fingerprint of what :func:`install_sharedfs` installed last.
STAMP = ".sharedfs-installed"


def install_sharedfs(root: Path, source: Path | None, *, then: Callable[[Path], None] | None = None) -> None:
    """Install sharedfs (a wheel, a source checkout, or with ``None`` this very installation) into ``root``.

    ``--no-deps``: the stack's pins stay as they are (sharedfs's own dependencies are in its
    requirements file).  Under the venv's lock, so two installers do not interleave; ``then(root)``
    runs under it too (one-time set-up a stack needs done by one process).
    """
    stamp = _fingerprint(source)
    with open(root.parent / f"{root.name}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        # The same sharedfs is there already: leave it. A reinstall uninstalls first, so a job running
        # in this venv meanwhile (a second demo, another session's tests) would start ranks without it.
        if (root / STAMP).is_file() and (root / STAMP).read_text() == stamp:
            return
        (root / STAMP).unlink(missing_ok=True)
        if source is None:
            _copy_installed(root)
        else:
            _pip(root, "install", "--no-deps", "--force-reinstall", str(source))
        if then is not None:
            then(root)
        (root / STAMP).write_text(stamp)


def _fingerprint(source: Path | None) -> str:
    """A hash of what would be installed: a wheel's bytes, a checkout's package files, or this installation's."""
    digest = hashlib.sha256()
    if source is not None and source.is_file():
        digest.update(source.read_bytes())
        return digest.hexdigest()
    if source is None:
        files = [(str(entry), Path(str(entry.locate()))) for entry in _installed_files()]
    else:
        files = [(str(p.relative_to(source)), p) for top in ("sharedfs", "shims", "plugins", "autoload")
                 for p in (source / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        files += [(name, source / name) for name in ("_sharedfs_bootstrap.py", "pyproject.toml")]
    for name, path in sorted(files):
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _copy_installed(root: Path) -> None:
    """Copy the running sharedfs, file by file as its RECORD lists them, into ``root``'s site-packages.

    For a sharedfs installed from a wheel (``pip install '.[demo]'``): there is no source to build
    from, but the installed files are the package, and the venv runs this same Python.  Scripts
    (outside site-packages) and byte-code are left out; any sharedfs the venv had is removed first.
    """
    purelib = subprocess.run([python_of(root), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([python_of(root), "-m", "pip", "uninstall", "-y", "-q", "sharedfs"], capture_output=True,
                   check=False)  # nothing to uninstall is fine
    for entry in _installed_files():
        target = Path(purelib, entry)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(str(entry.locate())), target)


def _installed_files() -> list[PackagePath]:
    """This sharedfs's installed files (its RECORD) inside site-packages: no scripts, no byte-code."""
    from importlib import metadata

    return [entry for entry in metadata.distribution("sharedfs").files or ()
            if entry.parts[0] != ".." and "__pycache__" not in entry.parts]


def source_checkout() -> Path | None:
    """The sharedfs source tree this package runs from (an editable install or a clone), if it is one."""
    root = HERE.parents[1]
    if (root / "pyproject.toml").is_file() and (root / "_sharedfs_bootstrap.py").is_file():
        return root
    return None
