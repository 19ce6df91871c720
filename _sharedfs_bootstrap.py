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

This module is the entry point and holds the one table of shims, :data:`SHIMS`.  The
kernel reads it and switches the finder (:mod:`sharedfs.machinery.registry` reads
``SHIMS``; :mod:`sharedfs.startup.onimport`, :mod:`sharedfs.startup.control` and
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

# How a built-in shim is applied once its target is imported (docs/architecture.md, "Applying a shim").
AT_ONCE = "at once"  # right after the target executes: sharedfs loads and patches
STAND_IN = "stand-in"  # stand-ins (stdlib only) for the attributes named; sharedfs loads at their first call
PENDING = "pending"  # stdlib-only guards on an error path; sharedfs loads at the first error that could be its
FOLLOWER = "follower"  # right after the first activation that loads sharedfs anyway
#: After ``how``: also applied with any other shim's activation, whatever its own target.
COMPANION = "companion"

#: The one table of built-in shims: name -> (the module whose import triggers it, how it is applied
#: then, and for a stand-in {module: attributes replaced}, else optionally COMPANION).  Static, as
#: ddtrace's ``_monkey.py``: nothing is imported to know it.  A shim's ``target`` is its row's.
SHIMS = {  # type: dict[str, tuple]
    "datasets": ("datasets", AT_ONCE),
    "webdataset": ("webdataset", AT_ONCE),
    "wids": ("wids", AT_ONCE),
    # The hub's package is a lazy facade; the lock lives in (and is bound from) this module.  The stand-in
    # loads none of sharedfs at the import (a quarter of `from huggingface_hub import hf_hub_download`).
    "huggingface_hub": ("huggingface_hub.utils._fixes", STAND_IN, {
        "huggingface_hub.utils._fixes": ("FileLock",),
        "huggingface_hub.utils._shared_blobs": ("FileLock",),  # hub 2.x xet blob store
    }),
    # What it patches is used by the runner, whose import applies the two shims below.
    "mmengine": ("mmengine", FOLLOWER),
    # Patched when the program imports them, never imported to be patched (`import mmengine`
    # alone does not load the runner: ~800 modules).
    "mmengine.runner": ("mmengine.runner", AT_ONCE),
    "mmengine.hooks": ("mmengine.hooks.checkpoint_hook", AT_ONCE),
    "xtuner": ("xtuner.dataset.huggingface", AT_ONCE),  # defines process_hf_dataset; `import xtuner` does not
    # DataLoader (imported by `import torch`); its worker cap touches only datasets other shims registered.
    "torch": ("torch.utils.data", FOLLOWER),
    # torch's compile caches: each patched when torch itself imports the module, never imported to be patched.
    "torch.cpp_ext": ("torch.utils.cpp_extension", AT_ONCE),
    "torch.filelock": ("torch.utils._filelock", AT_ONCE),
    "torch.inductor": ("torch._inductor.runtime.cache_dir_utils", AT_ONCE),
    "makedirs": ("torch.distributed", PENDING, COMPANION),  # os.makedirs / Path.mkdir
    "olmo": ("olmo.util", AT_ONCE),  # wait_for; olmo.checkpoint binds it by name after
    "olmo_core": ("olmo_core.utils", AT_ONCE),  # wait_for, imported before the modules that bind it by name
    # Where OLMo-core is handed a checkpoint directory (OLMO_SHARED_FS); patched when the program imports them.
    "olmo_core.checkpoint": ("olmo_core.distributed.checkpoint", AT_ONCE),
    "olmo_core.train": ("olmo_core.train.checkpoint", AT_ONCE),
    "triton": ("triton.runtime.cache", AT_ONCE),  # get_cache_manager; imported by `import triton`
    # The remote-code module cache (HF_MODULES_CACHE); loaded by the Auto* classes, not by `import transformers`.
    "transformers": ("transformers.dynamic_module_utils", AT_ONCE),
    "diffusers": ("diffusers.utils.dynamic_modules_utils", AT_ONCE),  # diffusers' own copy of that cache
    # `import torch` imports torch.hub: stand-ins, so that it loads nothing of sharedfs.
    # _get_cache_or_reload: what torch.hub.load / list / help call for a GitHub repository.
    "torch_hub": ("torch.hub", STAND_IN, {"torch.hub": ("load_state_dict_from_url", "_get_cache_or_reload")}),
    "modelscope": ("modelscope_hub._download", AT_ONCE),  # _optional_file_lock; imported by `import modelscope_hub`
    "megatron": ("megatron.core.datasets.gpt_dataset", AT_ONCE),  # GPTDataset's index cache (path_to_cache)
    "tvm_ffi": ("tvm_ffi.cpp.extension", AT_ONCE),  # its JIT build lock; imported by `import tvm_ffi`
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


def parse_disable(raw):
    """The one parser of the ``disable`` setting (every source): sorted names, ``("all",)`` or ``()``.

    Here, stdlib only, because the bootstrap reads the variable before the package may load;
    ``sharedfs.model.settings`` calls it for the variable, the config file and ``configure()``.
    """
    items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
    names = tuple(sorted({str(item).strip().lower() for item in items if str(item).strip()}))
    if any(name in TRUE_VALUES for name in names):
        return ("all",)
    if any(name in ("0", "false", "no", "off") for name in names):
        return ()
    return names


def disabled_entirely(environ=None):
    """True when ``SHAREDFS_DISABLE`` asks for nothing at all to be installed."""
    if environ is None:
        from os import environ
    return parse_disable(environ.get(DISABLE, "")) == ("all",)


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
    for row in SHIMS.values():
        _targets.add(row[0])
        if row[1] == STAND_IN:
            _targets.update(row[2])  # the modules that get stand-ins
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
