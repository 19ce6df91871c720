"""Before a framework imports a module from a team's module cache: nobody but its writer can have changed it.

The user's own failing entries are repaired; anyone else's fail the load with :class:`UnsafeModuleError`.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import stat
import sys
from collections.abc import Callable
from pathlib import PurePath

from sharedfs.cluster import teamfiles
from sharedfs.errors import SharedFSError
from sharedfs.fs import stale
from sharedfs.fs.safefile import NOFOLLOW

__all__ = ["MAX_FILES", "UnsafeModuleError", "check_import"]

#: At most this many files are followed through relative imports (a module cache entry has a handful).
MAX_FILES = 256
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | NOFOLLOW


class UnsafeModuleError(SharedFSError, PermissionError):
    """A module in a team's module cache may have been changed by someone other than its writer."""


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _refuse(what: str, path: str, st: os.stat_result, why: str, fix: str) -> UnsafeModuleError:
    return UnsafeModuleError(
        f"sharedfs: refusing to import {what} {path}: {why} (owner {_owner(st.st_uid)}, mode "
        f"{stat.S_IMODE(st.st_mode):04o}), so someone other than its writer may have changed it; {fix}, "
        f"or set HF_MODULES_CACHE to a directory of your own")


def _unseen(what: str, path: str) -> UnsafeModuleError:
    """A code file that answers ESTALE through every retry: it cannot be checked, so it is not imported."""
    return UnsafeModuleError(
        f"sharedfs: refusing to import {what} {path}: another node replaced it while it was checked (stale file "
        "handle every time), so it could not be checked; run again once the other node's write is done")


def _repair(dir_fd: int, name: str | None, want: int) -> bool:
    """Give this user's entry (``name`` in ``dir_fd``, or ``dir_fd`` itself) the mode ``want``, by descriptor."""
    try:
        if name is None:
            os.fchmod(dir_fd, want)
            return True
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
            return False
        os.fchmod(fd, want)
        return True
    except OSError:
        return False
    finally:
        stale.close(fd)


def _check_dir(fd: int, path: str) -> None:
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if not mode & (stat.S_IWGRP | stat.S_IWOTH) or mode & stat.S_ISVTX:
        return
    if st.st_uid == os.geteuid() and _repair(fd, None, mode | stat.S_ISVTX):
        return
    raise _refuse("from the directory", path, st, "others may write it and it is not sticky",
                  f"its owner runs `chmod +t '{path}'`")


def _check_root(fd: int, path: str) -> None:
    """The cache root is on ``sys.path``: a name a member adds there is imported as a top-level module."""
    st = os.fstat(fd)
    if not stat.S_IMODE(st.st_mode) & teamfiles.CODE_WRITERS:
        return
    if st.st_uid == os.geteuid():
        teamfiles.give(path)  # makes the frameworks' packages first, then takes the group's write away
        st = os.fstat(fd)
        if not stat.S_IMODE(st.st_mode) & teamfiles.CODE_WRITERS:
            return
    raise _refuse("from", path, st, "others may add modules to it, and every process that loads remote code "
                  "imports from it", f"its owner runs `chmod g-w,o-w '{path}'`")


def _check_file(dir_fd: int, dir_path: str, name: str, *, source_owner: int | None = None) -> os.stat_result | None:
    """Check one code file in ``dir_fd``; its stat, or ``None`` when it does not exist."""
    path = os.path.join(dir_path, name)
    what = "the module file" if source_owner is None else "the bytecode file"
    try:
        st = stale.retry(lambda: os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if stale.is_stale(exc):
            raise _unseen(what, path) from None  # replaced every time we looked: never trusted unchecked
        raise
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(what, path, st, "it is not a regular file", "remove it")
    if st.st_nlink != 1:
        raise _refuse(what, path, st, f"it has {st.st_nlink} links", "remove the other names, or it")
    me = os.geteuid()
    if source_owner is not None and st.st_uid not in (me, 0, source_owner):
        raise _refuse(what, path, st, f"it was written by someone other than the owner of its source "
                      f"({_owner(source_owner)})", f"{_owner(st.st_uid)} removes it")
    mode = stat.S_IMODE(st.st_mode)
    if mode & teamfiles.CODE_WRITERS:
        if st.st_uid == me and _repair(dir_fd, name, mode & ~teamfiles.CODE_WRITERS):
            return st
        raise _refuse(what, path, st, "others may write it", f"its owner runs `chmod g-w,o-w '{path}'`")
    return st


def _check_bytecode(dir_fd: int, dir_path: str, name: str, source: os.stat_result) -> None:
    """Check what Python would load instead of ``name``: ``__pycache__/<name>.<tag>.pyc``, if present."""
    if sys.pycache_prefix:
        return  # bytecode goes to the user's own PYTHONPYCACHEPREFIX, not beside the module
    cached = PurePath(importlib.util.cache_from_source(name))
    try:
        fd = stale.retry(lambda: os.open(cached.parent.name, _DIR, dir_fd=dir_fd))
    except FileNotFoundError:
        return
    except OSError as exc:
        if stale.is_stale(exc):
            raise _unseen("bytecode from", os.path.join(dir_path, cached.parent.name)) from None
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            st = os.stat(cached.parent.name, dir_fd=dir_fd, follow_symlinks=False)
            raise _refuse("bytecode from", os.path.join(dir_path, cached.parent.name), st,
                          "it is not a directory", "remove it") from None
        raise
    try:
        path = os.path.join(dir_path, cached.parent.name)
        _check_dir(fd, path)
        _check_file(fd, path, cached.name, source_owner=source.st_uid)
    finally:
        os.close(fd)


def _check_code(dir_fd: int, dir_path: str, name: str, *, empty: bool = False) -> os.stat_result | None:
    """Check a source file and its bytecode; the source's stat, ``None`` if it does not exist.

    ``empty``: a package's ``__init__.py`` on the way, which both frameworks only ever create empty
    (``touch``) and which every member's import through that package runs.
    """
    st = _check_file(dir_fd, dir_path, name)
    if st is None:
        return None
    if empty and st.st_size:
        raise _refuse("the package file", os.path.join(dir_path, name), st, "the framework creates it empty and "
                      "it is not", f"{_owner(st.st_uid)} empties or removes it")
    _check_bytecode(dir_fd, dir_path, name, st)
    return st


def check_import(modules_cache: str, module_path: str, relative_imports: Callable[[str], list[str]]) -> None:
    """Check what importing ``module_path`` (relative to ``modules_cache``, as ``get_cached_module_file``
    returns it) will execute, if ``modules_cache`` is a team's module cache (docs/frameworks/transformers.md).

    ``relative_imports`` is the framework's ``get_relative_imports``.
    """
    found = teamfiles.WATCHED.root_of(os.path.abspath(modules_cache))
    if found is None or not teamfiles.is_code_root(found[0]):
        return
    teamfiles.settle_pending()  # what this process just made gets its modes before it is judged
    root = found[0]
    parts = PurePath(os.path.normpath(module_path)).parts
    fds = [os.open(root, _DIR)]
    try:
        _check_root(fds[0], root)
        path = root
        for part in parts[:-1]:  # every package on the way: its directory and its __init__.py
            fds.append(os.open(part, _DIR, dir_fd=fds[-1]))
            path = os.path.join(path, part)
            _check_dir(fds[-1], path)
            _check_code(fds[-1], path, "__init__.py", empty=True)
        _check_relatives(fds[-1], path, parts[-1], relative_imports)
    finally:
        for fd in fds:
            os.close(fd)


#: What a checked file imports relatively, by what identifies its content: a file only its owner may write
#: keeps its inode, size and times (ctime, which no one sets) until she changes it.  Reading and searching
#: a 100 kB module on every warm load cost more than the rest of the check.
_IMPORTS: dict[tuple[int, ...], list[str]] = {}


def _imports_of(path: str, st: os.stat_result, relative_imports: Callable[[str], list[str]]) -> list[str]:
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    found = _IMPORTS.get(key)
    if found is None:
        found = relative_imports(path)
        if len(_IMPORTS) >= 1024:
            _IMPORTS.clear()
        _IMPORTS[key] = found
    return found


def _check_relatives(leaf_fd: int, leaf: str, first: str, relative_imports: Callable[[str], list[str]]) -> None:
    """Check ``first`` in ``leaf`` and, transitively, the files it imports relatively (as the framework
    finds them: ``from .name import``, relative to the module's directory)."""
    pending, seen = [first], {first}
    while pending:
        name = pending.pop()
        if len(seen) > MAX_FILES:
            raise UnsafeModuleError(f"sharedfs: refusing to import from {leaf}: more than {MAX_FILES} module files "
                                    f"through relative imports")
        *dirs, base = PurePath(name).parts
        fds: list[int] = []
        try:
            path = leaf
            for part in dirs:
                try:
                    fds.append(os.open(part, _DIR, dir_fd=fds[-1] if fds else leaf_fd))
                except FileNotFoundError:
                    break
                path = os.path.join(path, part)
                _check_dir(fds[-1], path)
                _check_code(fds[-1], path, "__init__.py")
            else:
                dir_fd = fds[-1] if fds else leaf_fd
                st = _check_code(dir_fd, path, base)
                if st is None:
                    continue  # missing: the import fails as it would without sharedfs
                for imported in _imports_of(os.path.join(path, base), st, relative_imports):
                    if not all(part.isidentifier() for part in imported.split(".")):
                        continue  # `from ..x import`: outside the module's folder, which the framework never fills
                    target = imported.replace(".", os.sep)
                    for candidate in (f"{target}.py", os.path.join(target, "__init__.py")):
                        if candidate not in seen:
                            seen.add(candidate)
                            pending.append(candidate)
        finally:
            for fd in fds:
                os.close(fd)
