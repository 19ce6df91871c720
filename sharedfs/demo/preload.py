"""Build and use the LD_PRELOAD library that makes file locks fail (``preload.c``).

No FUSE needed: a process started with :func:`preload_env` sees ``flock``,
``lockf`` and ``fcntl`` lock commands fail with ENOSYS (Lustre without
``-o flock``) or ENOLCK (NFS without lockd) on files under the given
directories, and work normally everywhere else::

    env = preload_env([shared_dir], "ENOLCK")
    subprocess.run([sys.executable, "train.py"], env=env)

Interposition only reaches calls that go through the dynamic libc symbols,
which covers Python and ordinary C code, not static binaries or raw syscalls.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Optional, Union

__all__ = [
    "FAULT_ERRNO_ENV",
    "FAULT_ONLY_ENV",
    "FAULT_PREFIXES_ENV",
    "PRELOAD_SOURCE",
    "PreloadUnavailable",
    "build_preload",
    "preload_env",
]

FAULT_PREFIXES_ENV = "SHAREDFS_FAULT_PREFIXES"
FAULT_ERRNO_ENV = "SHAREDFS_FAULT_ERRNO"
#: Ships inside the package (hatchling includes every file under sharedfs/).
PRELOAD_SOURCE = Path(__file__).with_name("preload.c")
FAULT_ONLY_ENV = "SHAREDFS_FAULT_ONLY"
_C_ERRNO_NAMES = {"ENOSYS", "ENOLCK", "EOPNOTSUPP", "ENOTSUP", "EINVAL", "EIO", "EACCES", "EAGAIN", "EPERM", "ESTALE"}
_CFLAGS = ["-shared", "-fPIC", "-O2", "-Wall"]

_PathLike = Union[str, "os.PathLike[str]"]


class PreloadUnavailable(RuntimeError):
    """The fault library cannot be built here; ``str(exc)`` says why."""


def _unsafe(path: Path, kind: str) -> Optional[str]:
    """Why ``path`` may not hold a library we preload into our own processes, or None if it may.

    Whoever can write the directory or the ``.so`` chooses code that runs as us; under a shared ``/tmp``
    that can be any user of the node, who made the directory first.  So: ours (or root's), not a
    symlink, and writable by nobody else.
    """
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    want = stat.S_ISDIR if kind == "directory" else stat.S_ISREG
    if not want(st.st_mode):
        return f"{path} is not a {kind} (a symlink or something else)"
    if st.st_uid not in (os.getuid(), 0):
        return f"{path} belongs to uid {st.st_uid}, not to you"
    if st.st_mode & 0o022:
        return f"{path} is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidate = Path(base) / "sharedfs-demo"
    try:
        candidate.mkdir(parents=True, exist_ok=True, mode=0o700)
        if os.access(candidate, os.W_OK) and _unsafe(candidate, "directory") is None:
            return candidate
    except OSError:
        pass
    # A name anyone on the node can predict: made private (0700) by us, or refused.
    fallback = Path(tempfile.gettempdir()) / f"sharedfs-demo-{os.getuid()}"
    try:
        fallback.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise PreloadUnavailable(f"cannot make {fallback} for the lock fault library: {exc.strerror}") from None
    return fallback


def build_preload(cache_dir: Optional[_PathLike] = None) -> Path:
    """Compile ``preload.c`` (once per source version) and return the ``.so`` path.

    The library is named after a hash of the source and flags, so edits
    rebuild it and concurrent test workers share one build (written to a
    temporary name, then renamed into place).  Honours ``$CC``.  A cache
    directory or library another user could have written is refused
    (:class:`PreloadUnavailable`): its code would run in every process we start.
    """
    source = PRELOAD_SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(_CFLAGS).encode()).hexdigest()[:16]
    cache = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    lib = cache / f"libsharedfs_fault-{digest}.so"
    if cache.exists():
        reason = _unsafe(cache, "directory")
        if reason:
            raise PreloadUnavailable(f"not using the lock fault library cache: {reason}; remove it or set "
                                     "XDG_CACHE_HOME to a directory of yours")
    if os.path.lexists(lib):
        reason = _unsafe(lib, "file")
        if reason:
            raise PreloadUnavailable(f"not preloading {lib.name}: {reason}; remove it")
        return lib
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise PreloadUnavailable("no C compiler to build the lock fault library: apt-get install gcc")
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = cache / f".{lib.name}.{os.getpid()}.tmp"
    proc = subprocess.run([cc, *_CFLAGS, "-o", str(tmp), str(PRELOAD_SOURCE), "-ldl"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise PreloadUnavailable(f"compiling {PRELOAD_SOURCE} with {cc} failed:\n{proc.stderr}")
    os.chmod(tmp, 0o755)  # whatever the umask: writable by us alone
    os.replace(tmp, lib)
    return lib


def _errno_setting(errno_name: Union[str, int]) -> str:
    if isinstance(errno_name, int):
        return str(errno_name)
    code = getattr(errno, errno_name, None)
    if not isinstance(code, int) or not errno_name.startswith("E"):
        raise ValueError(f"unknown errno name {errno_name!r}")
    # The library knows the common names; anything else travels as a number.
    return errno_name if errno_name in _C_ERRNO_NAMES else str(code)


def preload_env(
    prefixes: Union[_PathLike, Iterable[_PathLike]],
    errno_name: Union[str, int] = "ENOSYS",
    base: Optional[Mapping[str, str]] = None,
    *,
    cache_dir: Optional[_PathLike] = None,
    only_unlock: bool = False,
) -> dict[str, str]:
    """Environment (``base`` or ``os.environ`` + fault settings) for a child process.

    Lock calls on files in or below any of ``prefixes`` fail with
    ``errno_name`` (with ``only_unlock``, only the releases: NFS's answer to
    an unlock when many clients start at once).  Prefixes are resolved with realpath, because the library
    compares against the kernel's resolved fd paths.  Our library is appended
    to any existing ``LD_PRELOAD``.
    """
    if isinstance(prefixes, (str, os.PathLike)):
        prefixes = [prefixes]
    resolved = [os.path.realpath(p) for p in prefixes]
    for p in resolved:
        if ":" in p:
            raise ValueError(f"fault prefix {p!r} contains ':', the list separator")
    lib = str(build_preload(cache_dir))
    env = dict(os.environ if base is None else base)
    env[FAULT_PREFIXES_ENV] = ":".join(resolved)
    env[FAULT_ERRNO_ENV] = _errno_setting(errno_name)
    if only_unlock:
        env[FAULT_ONLY_ENV] = "unlock"
    else:
        env.pop(FAULT_ONLY_ENV, None)
    existing = env.get("LD_PRELOAD", "").replace(":", " ").split()
    if lib not in existing:
        existing.append(lib)
    env["LD_PRELOAD"] = " ".join(existing)
    return env
