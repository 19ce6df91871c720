"""Autoload, run by ``sharedfs.pth`` (and PEP 829 ``sharedfs.start``) in every interpreter.

Every Python process on a cluster pays for this module (each rank, each
DataLoader worker, each subprocess), so it is stdlib-only, imports nothing
that ``site`` has not already imported, and is a top-level module of its own
(as virtualenv's ``_virtualenv.py``): starting an interpreter does not import
the ``sharedfs`` package at all.  It installs itself as a ``sys.meta_path``
finder that notices when a target framework has *finished* executing and only
then hands over to :mod:`sharedfs.activation` (pluggy, metadata, policy, shims).
The shape follows virtualenv's ``_virtualenv.py`` finder.

This module sits above the kernel (an entry point, like the CLI): it imports
the package only when a target has been imported, and nothing in the kernel
imports it except :mod:`sharedfs.control` and the CLI's status.
"""

import sys

# No module-level `import os`: this module stays referenced from sys.meta_path until the
# interpreter exits, and holding os (or os.environ) there made every exit ~0.4 M instructions
# dearer (Py_FinalizeEx; benchmarks/startup.py counts it).

# The bootstrap reads one variable.  Its name and values are spelled here as well as in
# ``sharedfs.envvars`` because every module imported at start-up costs every process
# ~0.15 ms; tests/test_shim.py checks that the two agree.
DISABLE = "SHAREDFS_DISABLE"
TRUE_VALUES = frozenset({"1", "true", "yes", "on", "all", "*"})

#: Built-in shim name -> the module whose import triggers it.  A static table, as
#: in ddtrace's ``_monkey.py``, so that nothing has to be imported to know it; each
#: shim declares the same ``target`` (tests/test_shim.py checks that they agree).
TARGETS = {
    "datasets": "datasets",
    "webdataset": "webdataset",
    "wids": "wids",
    # The hub's package is a lazy facade; the lock lives in (and is bound from) this module.
    "huggingface_hub": "huggingface_hub.utils._fixes",
    "mmengine": "mmengine",
    # Patched when the program imports them, never imported to be patched (`import mmengine`
    # alone does not load the runner: ~800 modules).
    "mmengine.runner": "mmengine.runner",
    "mmengine.hooks": "mmengine.hooks.checkpoint_hook",
    "xtuner": "xtuner.dataset.huggingface",  # defines process_hf_dataset; `import xtuner` does not load it
    "torch": "torch.utils.data",  # DataLoader; imported by `import torch`
    # torch's compile caches: each patched when torch itself imports the module, never imported to be patched.
    "torch.cpp_ext": "torch.utils.cpp_extension",
    "torch.filelock": "torch.utils._filelock",
    "torch.inductor": "torch._inductor.runtime.cache_dir_utils",
}

#: Modules where a shim only replaces the lock class the framework builds its locks from:
#: module -> (shim name, class attribute).  On import the class gets a stand-in
#: (:mod:`sharedfs.standin`, stdlib only) and sharedfs itself -- pluggy, the plugins, the
#: policy -- loads on the first lock, not at the import (a quarter of `from huggingface_hub
#: import hf_hub_download`).  Any SHAREDFS_DISABLE value takes the eager path instead.
STAND_INS = {
    "huggingface_hub.utils._fixes": ("huggingface_hub", "FileLock"),
    "huggingface_hub.utils._shared_blobs": ("huggingface_hub", "FileLock"),  # hub 2.x xet blob store
}

#: The module names watched while installed (the table's, plus third-party shims' targets).
_targets = set()  # type: set[str]
#: Names whose real spec is being looked up right now: :func:`find_spec` asks the other
#: finders, and must not answer itself while doing so.
_busy = set()  # type: set[str]
#: This module while it is installed: the module itself is the ``sys.meta_path`` finder
#: (:func:`find_spec` below).  A finder class would cost every interpreter its creation at
#: start-up and its teardown at exit, about as much as importing this module.
_finder = None
#: True while a stand-in activates its shim: imports made meanwhile take the eager path.
_resolving = False


def disabled_entirely(environ=None):
    """True when ``SHAREDFS_DISABLE`` asks for nothing at all to be installed."""
    if environ is None:
        from os import environ
    return environ.get(DISABLE, "").strip().lower() in TRUE_VALUES


def install():
    """The ``.pth`` entry point: install the finder unless disabled.  Never raises."""
    try:
        from os import environ  # loaded by site already

        # `in` first: the variable is rarely set, and os.environ.get pays for a KeyError then.
        install_finder(respect_disable=DISABLE in environ)
    except Exception as exc:  # noqa: BLE001 - an autoloader that raises breaks every interpreter
        sys.stderr.write(
            "sharedfs: autoload failed and is off for this process: %r\n"
            "sharedfs: please report it with the output of `sharedfs status`;"
            " SHAREDFS_DISABLE=1 silences this\n" % (exc,)
        )


def install_finder(respect_disable=True):
    """Install the finder and patch targets imported before us; errors propagate."""
    global _finder
    if _finder is not None or (respect_disable and disabled_entirely()):
        return
    _targets.update(TARGETS.values())
    _targets.update(STAND_INS)
    _finder = sys.modules[__name__]
    sys.meta_path.insert(0, _finder)
    # A target imported before us (another .pth, or sharedfs.enable() at run time)
    # is patched now rather than never.
    for module_name in list(_targets):
        if module_name in sys.modules:
            _activate(module_name)


def uninstall():
    """Remove the finder (used by :func:`sharedfs.disable`)."""
    global _finder
    if _finder is not None:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass
        _finder = None
        _targets.clear()


def installed():
    """True when the finder is active in this interpreter."""
    return _finder is not None and _finder in sys.meta_path


def add_targets(module_names):
    """Watch more modules (targets declared by third-party shims, known only after entry points load)."""
    if _finder is not None:
        _targets.update(module_names)


def _activate(module_name):
    stand_in = STAND_INS.get(module_name)
    if stand_in is not None and not _resolving and _stand_in(module_name, *stand_in):
        return
    # The collector is held off while the kernel loads: its few thousand objects live as long as
    # the process, and in a heap the framework just filled (torch: a million objects) they tip a
    # full collection that was pending anyway -- 100 ms inside the user's import statement that
    # the program otherwise pays at its next allocations.  Deferred, not skipped.
    import gc

    paused = gc.isenabled()
    gc.disable()
    try:
        # Imported here, not at the top: this is where pluggy, importlib.metadata and
        # the policy get loaded, and only once a target framework is really in use.
        from sharedfs.activation import activate

        # Only the built-in shims for this module are imported (a shim's module: its name's first part).
        known = activate(module_name, {name.partition(".")[0] for name, target in TARGETS.items()
                                       if target == module_name})
    finally:
        if paused:
            gc.enable()
    # Third-party shims (from entry points) may target modules the static table lacks.
    new = known - _targets if _finder is not None else set()
    add_targets(new)
    for name in sorted(new):
        if name in sys.modules:
            _activate(name)


def _stand_in(module_name, shim, attr):
    from os import environ

    if DISABLE in environ:  # any value: let the policy read it (a shim list, or a malformed value)
        return False
    from sharedfs.standin import install

    return install(sys.modules[module_name], attr, shim, lambda: _activate_for(shim))


def _activate_for(shim):
    """Activate ``shim`` now (a stand-in's first use): import its target if need be, eagerly."""
    global _resolving
    target = TARGETS[shim]
    _resolving = True
    try:
        if target in sys.modules:
            _activate(target)
        else:
            __import__(target)  # the finder's hook activates it once it has executed
            if _finder is None:  # sharedfs.disable() meanwhile: not watching, so activate by hand
                _activate(target)
    finally:
        _resolving = False


def find_spec(fullname, path, target=None):
    """The finder protocol: wrap a target's loader so sharedfs runs right after the target executes."""
    if fullname not in _targets or fullname in _busy:
        return None
    _busy.add(fullname)
    try:
        spec = None
        # Ask the finders after us directly instead of importlib.util.find_spec:
        # importlib.util is not loaded at start-up and would cost every process.
        for finder in sys.meta_path:
            if finder is _finder:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
    finally:
        _busy.discard(fullname)
    if spec is None or spec.loader is None:
        return None
    _hook_exec_module(spec.loader, fullname)
    return spec


def _hook_exec_module(loader, fullname):
    original = getattr(loader, "exec_module", None)
    if original is None:
        return
    had_own = "exec_module" in getattr(loader, "__dict__", {})

    def exec_module(module):
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
        _activate(fullname)  # only after the framework executed without error

    try:
        loader.exec_module = exec_module
    except (AttributeError, TypeError):
        pass  # a loader with __slots__: the framework imports unpatched, as without us
