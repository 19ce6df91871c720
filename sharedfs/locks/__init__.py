"""``sharedfs.lock(path)``: a lock that is correct for the filesystem ``path`` lives on.

What each module of the package does: docs/architecture.md, the folder table and "Lock files and their readers".
"""

MYPY = False  # not typing.TYPE_CHECKING: see sharedfs/__init__.py
if MYPY:  # pragma: no cover
    from typing import Any

    from sharedfs.errors import LockTimeout as LockTimeout
    from sharedfs.locks._api import SharedFSLock as SharedFSLock
    from sharedfs.locks._api import SharedFSLockMixin as SharedFSLockMixin
    from sharedfs.locks._api import drop_in as drop_in
    from sharedfs.locks._api import lock as lock
    from sharedfs.locks._marker import marker_path as marker_path

# Imported on first use (PEP 562): _api loads filelock (44 M instructions), which a module of this package that
# only reads lock files (torchbaton's readers, the `sharedfs locks` walker) must not cost a framework's import.
_LAZY = {"LockTimeout": "sharedfs.errors", "SharedFSLock": "sharedfs.locks._api",
         "SharedFSLockMixin": "sharedfs.locks._api", "drop_in": "sharedfs.locks._api", "lock": "sharedfs.locks._api",
         "marker_path": "sharedfs.locks._marker"}

__all__ = ["LockTimeout", "SharedFSLock", "SharedFSLockMixin", "drop_in", "lock", "marker_path"]


def __getattr__(name: str) -> "Any":
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sharedfs.locks' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
