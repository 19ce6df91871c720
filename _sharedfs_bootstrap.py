"""Autoload, run by ``sharedfs.pth`` (and PEP 829 ``sharedfs.start``) in every interpreter.

Every Python process on a cluster pays for this module (each rank, each
DataLoader worker, each subprocess), so it is stdlib-only, imports nothing
that ``site`` has not already imported, and is a top-level module of its own
(as virtualenv's ``_virtualenv.py``): starting an interpreter does not import
the ``sharedfs`` package at all.  It installs itself as a ``sys.meta_path``
finder that notices when a target framework has *finished* executing and only
then hands over to :mod:`sharedfs.startup.onimport` (what runs once a target is found;
kept out of this module, whose every byte each interpreter unmarshals) and
:mod:`sharedfs.startup.activation` (pluggy, metadata, policy, shims).
The shape follows virtualenv's ``_virtualenv.py`` finder.

This module is the entry point and the one table of shims at once.  The kernel
reads its tables and switches it (:mod:`sharedfs.machinery.registry` reads
``TARGETS``; :mod:`sharedfs.startup.onimport`, :mod:`sharedfs.startup.control` and
``sharedfs status`` read and switch the finder), and it calls into the package in
one place only: :func:`_activate` and :func:`find_spec` import
:mod:`sharedfs.startup.onimport` inside the function, once a target has been
imported -- the one upward edge tests/unit/test_import_layers.py allows.
"""

import sys

# No module-level `import os`: this module stays referenced from sys.meta_path until the
# interpreter exits, and holding os (or os.environ) there made every exit ~0.4 M instructions
# dearer (Py_FinalizeEx; benchmarks/startup.py counts it).

# The bootstrap reads one variable.  Its name and values are spelled here as well as in
# ``sharedfs.model.envvars`` because every module imported at start-up costs every process
# ~0.15 ms; tests/unit/test_shim.py checks that the two agree.
DISABLE = "SHAREDFS_DISABLE"
TRUE_VALUES = frozenset({"1", "true", "yes", "on", "all", "*"})

#: Built-in shim name -> the module whose import triggers it.  A static table, as
#: in ddtrace's ``_monkey.py``, so that nothing has to be imported to know it; each
#: shim declares the same ``target`` (tests/unit/test_shim.py checks that they agree).
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
    "makedirs": "torch.distributed",  # os.makedirs / Path.mkdir; also applied with any other shim
    "olmo": "olmo.util",  # wait_for; olmo.checkpoint binds it by name after
    "olmo_core": "olmo_core.utils",  # wait_for, imported before the modules that bind it by name
    # Where OLMo-core is handed a checkpoint directory (OLMO_SHARED_FS); patched when the program imports them.
    "olmo_core.checkpoint": "olmo_core.distributed.checkpoint",
    "olmo_core.train": "olmo_core.train.checkpoint",
    "triton": "triton.runtime.cache",  # get_cache_manager; imported by `import triton`
    # The remote-code module cache (HF_MODULES_CACHE); loaded by the Auto* classes, not by `import transformers`.
    "transformers": "transformers.dynamic_module_utils",
    "diffusers": "diffusers.utils.dynamic_modules_utils",  # the same module cache, diffusers' own copy of it
    "torch_hub": "torch.hub",  # load_state_dict_from_url; imported by `import torch`
    "modelscope": "modelscope_hub._download",  # _optional_file_lock; imported by `import modelscope_hub`
    "megatron": "megatron.core.datasets.gpt_dataset",  # GPTDataset's index cache (path_to_cache)
    "tvm_ffi": "tvm_ffi.cpp.extension",  # its JIT build lock; imported by `import tvm_ffi`
}

#: Modules where a shim only replaces the lock class the framework builds its locks from:
#: module -> (shim name, class or function attribute, ...).  On import the class gets a stand-in
#: (:mod:`sharedfs.machinery.standin`, stdlib only) and sharedfs itself -- pluggy, the plugins, the
#: policy -- loads on the first lock, not at the import (a quarter of `from huggingface_hub
#: import hf_hub_download`).  Any SHAREDFS_DISABLE value takes the eager path instead.
STAND_INS = {
    "huggingface_hub.utils._fixes": ("huggingface_hub", "FileLock"),
    "huggingface_hub.utils._shared_blobs": ("huggingface_hub", "FileLock"),  # hub 2.x xet blob store
    # `import torch` imports torch.hub: stand-in functions, so that it loads nothing of sharedfs.
    # _get_cache_or_reload: what torch.hub.load / list / help call for a GitHub repository.
    "torch.hub": ("torch_hub", "load_state_dict_from_url", "_get_cache_or_reload"),
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


def disabled_entirely(environ=None):
    """True when ``SHAREDFS_DISABLE`` asks for nothing at all to be installed."""
    if environ is None:
        from os import environ
    return environ.get(DISABLE, "").strip().lower() in TRUE_VALUES


def install():
    """Install the finder unless disabled (run on import; PEP 829's entry point).  Never raises."""
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
    # What happens once a target has been imported lives in the package (sharedfs.startup.onimport):
    # this module is loaded by every interpreter, and its size is paid by every start-up.
    from sharedfs.startup.onimport import activate

    activate(module_name)


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
    from sharedfs.startup.onimport import hook_exec_module

    hook_exec_module(spec.loader, fullname)
    return spec


# Importing this module installs it, as importing virtualenv's ``_virtualenv`` does: the .pth
# line is ``import _sharedfs_bootstrap`` alone, because site compiles every .pth line at every
# start-up (``; _sharedfs_bootstrap.install()`` cost each interpreter ~80 k instructions) while
# this call is already compiled.  install() is idempotent and never raises.  Under ``python -S``
# no .pth ran, and a kernel module that only reads TARGETS (the registry) must not switch the
# autoload on as a side effect; sharedfs.enable() installs the finder explicitly.
if not sys.flags.no_site:
    install()
