"""mmengine: ``SharedFSHook`` for ``custom_hooks``, race-free runner directories, complete checkpoints.

``SharedFSHook`` is defined lazily (PEP 562): this module is imported before mmengine may be.
"""

from __future__ import annotations

import functools
import os
import sys
from types import ModuleType
from typing import Any, Callable

from sharedfs.types import Policy, Publication, Shim, ShimContext, decision, hookimpl, publish

#: The name users write in ``custom_hooks=[dict(type="SharedFSHook")]``.
HOOK_NAME = "SharedFSHook"
#: The policy settings ``SharedFSHook`` accepts as keyword arguments.
HOOK_SETTINGS = ("lock", "cache", "cache_root", "max_workers", "wait_timeout")

# SharedFSHook is provided by the module __getattr__ below (built on first access).
__all__ = ["HOOK_NAME", "HOOK_SETTINGS", "MmengineCheckpointHookShim", "MmengineRunnerShim", "MmengineShim",
           "SharedFSHook"]  # noqa: F822

_hook_class: type | None = None


def __getattr__(name: str) -> Any:  # PEP 562: build the hook class on first access
    if name == HOOK_NAME:
        return hook_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def hook_class() -> type:
    """The ``SharedFSHook`` class (imports mmengine; built once)."""
    global _hook_class
    if _hook_class is None:
        _hook_class = _build_hook_class()
    return _hook_class


def _build_hook_class() -> type:
    from mmengine.hooks import Hook

    class SharedFSHook(Hook):
        """Apply a sharedfs policy to this training run: ``dict(type="SharedFSHook", cache="node-local")``.

        Keyword arguments are policy settings (``lock``, ``cache``, ``cache_root``,
        ``max_workers``, ``wait_timeout``) with the highest precedence, above
        ``SHAREDFS_*`` and the TOML file.  They take effect in ``__init__``:
        mmengine builds hooks in ``Runner.__init__`` but the datasets only later, in
        ``Runner.train()``, before any ``before_run`` callback.  Without arguments
        the hook only logs the policy in force, so it is harmless next to autoload.
        """

        priority = "VERY_HIGH"

        def __init__(self, **settings: Any) -> None:
            import sharedfs

            unknown = sorted(set(settings) - set(HOOK_SETTINGS))
            if unknown:
                raise TypeError(
                    f"SharedFSHook got unknown argument(s) {', '.join(unknown)}; it accepts the policy settings "
                    f"{', '.join(HOOK_SETTINGS)} (check custom_hooks in your config)"
                )
            self.settings = dict(settings)
            # configure() validates first (a bad value raises sharedfs.ConfigError naming the argument)
            # and re-applies every shim already applied, e.g. the datasets shim an XTuner config
            # triggered by importing datasets at parse time.
            self.policy: Policy = sharedfs.configure(**settings) if settings else sharedfs.policy()
            _log_policy(self.policy)

    SharedFSHook.__module__ = __name__
    SharedFSHook.__qualname__ = HOOK_NAME
    return SharedFSHook


_logged: set[str] = set()


def _log_policy(policy: Policy) -> None:
    """One line through the runner's logger (the current MMLogger), once per distinct policy."""
    if policy.shim_disabled("mmengine"):
        state = f"sharedfs is disabled (SHAREDFS_DISABLE={','.join(policy.disable)}); SharedFSHook changes nothing"
    else:
        shown = ("lock", "cache", "cache_root", "wait_timeout", "max_workers", "node_id")
        parts = [f"{name}={getattr(policy, name)!r} ({policy.source(name)})" for name in shown]
        state = "sharedfs policy: " + ", ".join(parts)
    if state in _logged:
        return
    _logged.add(state)
    from mmengine.logging import print_log

    print_log(state, logger="current")


def make_hook(**settings: Any) -> Any:
    """What mmengine's ``HOOKS`` registry builds for ``dict(type="SharedFSHook", ...)``: a ``SharedFSHook``.

    Registered instead of the class itself so that registering it does not import
    ``mmengine.hooks`` (and the runner behind it) on a bare ``import mmengine``: the class is
    built when the first config asks for the hook (mmengine's builder calls functions too).
    """
    return hook_class()(**settings)


make_hook.__name__ = make_hook.__qualname__ = HOOK_NAME


def _register_hook(registry: Any, patcher: Any = None) -> None:
    if patcher is not None:
        patcher.setitem(registry._module_dict, HOOK_NAME, make_hook)
    elif HOOK_NAME not in registry._module_dict:
        registry.register_module(name=HOOK_NAME, module=make_hook)  # another SharedFSHook there: mmengine says so


class _MmengineShim(Shim):
    distribution = "mmengine"
    # Read against 0.10.x's runner.py, hooks/checkpoint_hook.py and fileio/backends/local_backend.py.
    supported = ">=0.10,<0.11"

    def rebind(self, name: str, home: ModuleType, make: Callable[[Any], Any]) -> None:
        """Replace ``home.name`` in every loaded mmengine module that bound it by name.

        Modules imported later bind it from ``mmengine`` / ``mmengine.utils`` / ``home``, which
        already hold the replacement.
        """
        original = home.__dict__[name]
        replacement = make(original)
        for module_name, site in list(sys.modules.items()):
            if module_name.partition(".")[0] == "mmengine" and getattr(site, name, None) is original:
                self.patcher.setattr(site, name, replacement)



class MmengineShim(_MmengineShim):
    """What ``import mmengine`` loads: directories, the file backend, the hook registry."""

    name = "mmengine"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        # All three are loaded by `import mmengine` itself (sys.modules, not an import: patching
        # must never load a submodule the program did not ask for; issue: import cost).
        path_module = sys.modules["mmengine.utils.path"]
        local_backend = sys.modules["mmengine.fileio.backends.local_backend"]
        _register_hook(sys.modules["mmengine.registry"].HOOKS, self.patcher)
        self.rebind("mkdir_or_exist", path_module, make_mkdir_or_exist)
        backend = local_backend.LocalBackend
        self.patcher.setattr(backend, "put", make_atomic_put(backend.__dict__["put"], "wb"))
        self.patcher.setattr(backend, "put_text", make_atomic_put(backend.__dict__["put_text"], "w"))
        decision("mmengine: runner directories via sharedfs.makedirs; checkpoints published atomically")


class MmengineRunnerShim(_MmengineShim):
    """``mmengine.runner``, patched when the program imports it: checkpoint discovery and auto-resume."""

    name = "mmengine.runner"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        self.rebind("find_latest_checkpoint", sys.modules["mmengine.runner.checkpoint"], make_find_latest_checkpoint)
        runner_cls = sys.modules["mmengine.runner.runner"].Runner
        self.patcher.setattr(runner_cls, "load_or_resume", make_load_or_resume(runner_cls.__dict__["load_or_resume"]))


class MmengineCheckpointHookShim(_MmengineShim):
    """The checkpoint hook writes ``last_checkpoint`` with a bare ``open()``: publish it atomically."""

    name = "mmengine.hooks"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        # A module global named `open` shadows the builtin for that module only.
        self.patcher.setattr(module, "open", atomic_open)


# -- directories ------------------------------------------------------------------------------


def make_mkdir_or_exist(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def mkdir_or_exist(dir_name: Any, mode: int = 0o777) -> None:
        if dir_name == "":
            return
        from sharedfs.types import makedirs

        makedirs(os.path.expanduser(dir_name), mode)

    return mkdir_or_exist


# -- atomic publication ---------------------------------------------------------------------------


def make_atomic_put(original: Callable[..., None], mode: str) -> Callable[..., None]:
    """``LocalBackend.put`` (``mode="wb"``) / ``put_text`` (``"w"``): published whole (sharedfs.fs.publish)."""

    def put_whole(obj: Any, filepath: Any, encoding: str | None) -> None:
        import mmengine  # loaded: this runs inside mmengine's own backend

        path = os.fspath(filepath)
        mmengine.mkdir_or_exist(os.path.dirname(path))
        publish(path, obj, encoding)

    if mode == "wb":
        @functools.wraps(original)
        def put(self: Any, obj: bytes, filepath: Any) -> None:
            put_whole(obj, filepath, None)

        return put

    @functools.wraps(original)
    def put_text(self: Any, obj: str, filepath: Any, encoding: str = "utf-8") -> None:
        put_whole(obj, filepath, encoding)

    return put_text


def atomic_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
    """``open`` for mmengine's checkpoint hook: a plain ``"w"`` write (``last_checkpoint``) is published whole."""
    if mode == "w" and not args and set(kwargs) <= {"encoding"} and not isinstance(file, int):
        return Publication(os.fspath(file), "w", kwargs.get("encoding"))
    return open(file, mode, *args, **kwargs)


# -- resume: the leader decides, every rank waits for that complete file ----------------------------


def make_find_latest_checkpoint(original: Callable[[str], Any]) -> Callable[[str], Any]:
    """``find_latest_checkpoint`` that returns a checkpoint only once this process can see it.

    Non-collective (FlexibleRunner and strategies call it on their own): ``last_checkpoint``
    may name a file another node published a moment ago and this client does not see yet.
    """

    @functools.wraps(original)
    def find_latest_checkpoint(path: str) -> Any:
        found = original(path)
        if found and "://" not in found and not os.path.exists(found):
            from sharedfs.types import wait_for

            wait_for(found, what=f"checkpoint {found} named by {os.path.join(path, 'last_checkpoint')}")
        return found

    return find_latest_checkpoint



def make_load_or_resume(original: Callable[[Any], None]) -> Callable[[Any], None]:
    """``Runner.load_or_resume`` where auto-resume's checkpoint is chosen once, by rank 0.

    ``Runner.train()``/``val()``/``test()`` call this on every rank (mmengine itself
    runs collectives right around it), so broadcasting the leader's choice is safe
    here; a single process keeps mmengine's behaviour exactly.
    """

    @functools.wraps(original)
    def load_or_resume(self: Any) -> None:
        if self._has_loaded or not (self._resume and self._load_from is None):
            return original(self)
        from mmengine.dist import broadcast_object_list, get_world_size, is_main_process
        from mmengine.runner import checkpoint as checkpoint_module

        find_latest_checkpoint = checkpoint_module.find_latest_checkpoint

        if get_world_size() <= 1:
            return original(self)
        choice = [find_latest_checkpoint(self.work_dir) if is_main_process() else None]
        broadcast_object_list(choice, src=0)  # collective: every rank of Runner.train() is here
        resume_from = choice[0]
        if resume_from is None:
            return None  # nothing to resume on rank 0, so on no rank: all start together
        if not is_main_process():
            from sharedfs.types import wait_for

            # Non-collective wait: rank 0 published it by rename, so once visible it is complete.
            wait_for(resume_from, what=f"checkpoint {resume_from} chosen by rank 0 for resuming")
        self.logger.info(f"sharedfs: every rank resumes from {resume_from} (chosen by rank 0)")
        self.resume(resume_from)
        self._has_loaded = True

    return load_or_resume


# Importing this module by name -- mmengine's ``custom_imports=dict(imports=["sharedfs.shims.mmengine"])``
# -- is an explicit request for the string form ``dict(type="SharedFSHook")``.  It is honoured even
# when the shim is off (SHAREDFS_DISABLE), so configs need not change to switch sharedfs off: the hook
# then only says so.  When the shim is applied, its patcher registered the hook already.
# (Loaded by the plugin registry instead, possibly in the middle of mmengine's own import, the
# registry module may not define HOOKS yet: then the shim's apply registers it a moment later.)
if getattr(sys.modules.get("mmengine.registry"), "HOOKS", None) is not None:  # pragma: no branch
    _register_hook(sys.modules["mmengine.registry"].HOOKS)


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [MmengineShim(), MmengineRunnerShim(), MmengineCheckpointHookShim()]
