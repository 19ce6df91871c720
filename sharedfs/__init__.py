"""sharedfs: one lock/cache policy for ML frameworks on cluster shared filesystems.

The public API is imported on first attribute access (PEP 562), so ``import sharedfs`` stays cheap::

    sharedfs.policy()                 # the resolved, immutable Policy
    sharedfs.configure(**settings)    # explicit settings for this process (highest precedence)
    sharedfs.lock(path)               # a lock that is correct for path's filesystem
    sharedfs.makedirs(path)           # never FileExistsError on lagging filesystems
    sharedfs.wait_for(path, timeout=None)
    sharedfs.main_process_first()
    sharedfs.node_local_dir(name)
    sharedfs.disable() / sharedfs.enable()
"""

import os as _os

# Not `typing.TYPE_CHECKING`: importing typing costs every interpreter ~10 ms at start-up; mypy
# treats a false constant named MYPY as true.
MYPY = False
if MYPY:  # pragma: no cover
    from typing import Any

# In a source checkout (editable install, or PYTHONPATH pointing at the repo) the
# ``plugins/`` and ``shims/`` directories sit beside this package instead of inside
# it; a wheel installs them as ``sharedfs/plugins`` and ``sharedfs/shims``.  In a
# checkout, ``autoload/checkout/`` holds two symlinks to exactly those folders, and
# adding it to ``__path__`` makes ``sharedfs.plugins`` resolve in both cases at the cost
# of one stat() (hatchling cannot remap directories in editable mode).  Not the checkout
# root itself: that would make ``sharedfs.tests`` or a second ``sharedfs.sharedfs.machinery.runtime``
# importable.
_here = _os.path.dirname(__file__)
if not _os.path.isdir(_os.path.join(_here, "plugins")):  # pragma: no branch
    __path__.append(_os.path.join(_os.path.dirname(_here), "autoload", "checkout"))  # noqa: F821

# A submodule must not share a public function's name: importing ``sharedfs.X`` sets the
# package attribute ``X`` to the module, so ``sharedfs.policy()`` lives in machinery.runtime.
_LAZY = {
    "__version__": "_version",
    "ConfigError": "errors",
    "LockTimeout": "errors",
    "NoSafeLockError": "errors",
    "SharedFSError": "errors",
    "UnsafeDirectoryError": "errors",
    "WaitTimeout": "errors",
    "policy": "machinery.runtime",
    "configure": "startup.activation",
    "disable": "startup.control",
    "enable": "startup.control",
    "Policy": "model.policy",
    "Layer": "model.policy",
    "LockChoice": "model.policy",
    "CachePlacement": "model.policy",
    "lock": "locks",
    "makedirs": "cluster.dirs",
    "wait_for": "cluster.dirs",
    "node_local_dir": "cluster.dirs",
    "main_process_first": "cluster.dist",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> "Any":  # PEP 562: import the API on first use
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sharedfs' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> "list[str]":
    return sorted(set(globals()) | set(__all__))
