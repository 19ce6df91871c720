"""What the bootstrap's finder does once a target framework is imported: wrap its loader, then activate.

Kept out of ``_sharedfs_bootstrap``, which every interpreter loads; the kernel is imported only in :func:`activate`.
"""

from __future__ import annotations

import sys
from typing import Any

import _sharedfs_bootstrap as _bootstrap

#: True while a stand-in activates its shim: imports made meanwhile take the eager path.
_resolving = False

# Read from the bootstrap's table (docs/architecture.md, "Applying a shim", says why each waits).  Not
# in the bootstrap: every interpreter loads it, and only one that imports a target needs these.
#: Shim name -> target module.
TARGETS: dict[str, str] = {name: row[0] for name, row in _bootstrap.SHIMS.items()}
#: Module -> (stand-in shim, attribute, ...).  Any SHAREDFS_DISABLE value, or a third-party plugin
#: installed, takes the at-once path instead.
STAND_INS: dict[str, tuple[str, ...]] = {module: (name, *attrs) for name, row in _bootstrap.SHIMS.items()
                                         if row[1] == _bootstrap.STAND_IN for module, attrs in row[2].items()}
FOLLOWERS = frozenset(name for name, row in _bootstrap.SHIMS.items() if row[1] == _bootstrap.FOLLOWER)
PENDING = frozenset(name for name, row in _bootstrap.SHIMS.items() if row[1] == _bootstrap.PENDING)
#: The entry-point group of third-party plugins (``registry.NAME``; tests/unit/test_shim.py checks).
PLUGIN_GROUP = "sharedfs"
#: Followers' targets imported while sharedfs was not loaded, waiting for the first activation.
_deferred: list[str] = []


def hook_exec_module(loader: Any, fullname: str) -> None:
    """Make ``loader`` activate sharedfs right after it has executed ``fullname``."""
    original = getattr(loader, "exec_module", None)
    if original is None:
        return
    had_own = "exec_module" in getattr(loader, "__dict__", {})

    def exec_module(module: Any) -> None:
        try:
            original(module)
        finally:
            # Put the loader back as it was: loaders can be shared (zip, editable
            # finders) and must not call us again for an unrelated module.
            if had_own:
                loader.exec_module = original
            else:
                try:
                    del loader.exec_module
                except AttributeError:
                    pass
        activate(fullname)  # only after the framework executed without error

    try:
        loader.exec_module = exec_module
    except (AttributeError, TypeError):
        pass  # a loader with __slots__: the framework imports unpatched, as without us


def activate(module_name: str) -> None:
    """Apply the shims for ``module_name`` (just imported), or put a stand-in in place (see ``STAND_INS``)."""
    stand_in = STAND_INS.get(module_name)
    # Not while a third-party plugin is installed (as for FOLLOWERS and PENDING): its shims may target the same
    # module (a site's own torch.hub shim), and only loading sharedfs tells.
    if stand_in is not None and not _resolving and not _plugins_installed() and _stand_in(module_name, *stand_in):
        return
    names = {name for name, target in TARGETS.items() if target == module_name}
    if names and names <= FOLLOWERS and "sharedfs.startup.activation" not in sys.modules and not _plugins_installed():
        if module_name not in _deferred:
            _deferred.append(module_name)
        return
    if names and names <= PENDING and not _resolving and "sharedfs.startup.activation" not in sys.modules \
            and not _plugins_installed() and _pending(names):
        return
    # Imported here, not at the top: this is where pluggy, importlib.metadata and
    # the policy get loaded, and only once a target framework is really in use.
    from sharedfs.startup.activation import activate as apply_shims

    # Only the built-in shims for this module are imported (a shim's module: its name's first part).
    known = apply_shims(module_name, {name.partition(".")[0] for name in names})
    # Third-party shims (from entry points) may target modules the static table lacks.
    new: set[str] = known - _bootstrap._targets if _bootstrap._finder is not None else set()
    _bootstrap.add_targets(new)
    for name in sorted(new):
        if name in sys.modules:
            activate(name)
    while True:  # pop() is atomic: two threads activating at once never apply a follower twice
        try:
            name = _deferred.pop()
        except IndexError:
            break
        if name in sys.modules:
            activate(name)


def _plugins_installed() -> bool:
    """Whether any distribution declares a sharedfs plugin (True when unsure).

    A scan of the ``*.dist-info`` directories (~3 ms with a hundred distributions), which the
    kernel reuses when it loads; never importlib.metadata here.
    """
    from sharedfs.machinery import distinfo
    return distinfo.declares_group(PLUGIN_GROUP)


def _pending(names: set[str]) -> bool:
    """Put the pending guards of ``names`` in place (True), or tell the caller to activate now (False)."""
    from os import environ

    if _bootstrap.DISABLE in environ:  # any value: let the policy read it (a shim list, or a malformed value)
        return False
    from sharedfs.machinery import pending

    (shim,) = names
    pending.install(lambda: _activate_for(shim))
    return True


def _stand_in(module_name: str, shim: str, *attrs: str) -> bool:
    from os import environ

    if _bootstrap.DISABLE in environ:  # any value: let the policy read it (a shim list, or a malformed value)
        return False
    from sharedfs.machinery.standin import install

    # Each attribute gets its stand-in (the first call of any of them activates the shim); a list, not a
    # generator: all are tried, as the shim replaces all of them.
    return all([install(sys.modules[module_name], attr, shim, lambda: _activate_for(shim)) for attr in attrs])


def _activate_for(shim: str) -> None:
    """Activate ``shim`` now (a stand-in's first use): import its target if need be, eagerly."""
    global _resolving
    target = TARGETS[shim]
    _resolving = True
    try:
        if target in sys.modules:
            activate(target)
        else:
            # The finder's hook activates it once it has executed (after sharedfs.disable() nothing
            # does, as it should: the stand-in then gives way to the original).
            __import__(target)
    finally:
        _resolving = False
