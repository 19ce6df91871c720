"""The plugin registry: a small facade over pluggy's ``PluginManager`` (the tox 4 habit), one typed method per hook.

Plugins and shims are loaded by name, each entry point in isolation, so one broken plugin is reported, not fatal.
"""

from __future__ import annotations

import logging
from importlib import import_module
from typing import TYPE_CHECKING, Iterable, Mapping

import pluggy

import _sharedfs_bootstrap as _bootstrap  # stdlib only; the .pth loaded it already
from sharedfs.machinery import distinfo, hookspecs
from sharedfs.machinery.hookspecs import NAME
from sharedfs.model.identity import ProcessIdentity
from sharedfs.model.policy import CachePlacement, CacheRequest, Layer, LockChoice, Policy, TeamCache
from sharedfs.model.structs import frozen

if TYPE_CHECKING:  # pragma: no cover
    from sharedfs.machinery.shimbase import Shim
    from sharedfs.model.fsinfo import FsInfo, Mount
    from sharedfs.model.records import HolderRecord

log = logging.getLogger(NAME)

#: Built-in deciding plugins.  Where the order of answers matters, the implementations say so
#: with ``tryfirst``/``trylast`` (see hookspecs.py); registration order is not documentation.
BUILTIN_PLUGINS = ("settings", "filesystem", "locking", "cache", "teamcache", "liveness", "slurm", "distributed")
#: Built-in shim modules in ``sharedfs/shims/``, from the bootstrap's one table of shims (``SHIMS``; a
#: shim's module is its name's first part).  Adding a shim is its module plus one row there.
BUILTIN_SHIMS = tuple(dict.fromkeys(name.partition(".")[0] for name in _bootstrap.SHIMS))


@frozen
class ExternalPlugin:
    """A third-party plugin found through the ``sharedfs`` entry-point group."""

    name: str
    value: str
    distribution: str
    version: str
    error: str | None = None  # set when it failed to load; the plugin is then off


class _PluginManager(pluggy.PluginManager):
    def parse_hookimpl_opts(self, plugin: object, name: str) -> pluggy.HookimplOpts | None:
        # pluggy looks at every name a plugin module holds (getattr_static each): ~0.5 ms a module,
        # 7 ms for the built-ins, paid by every framework's first import.  Every built-in hook
        # implementation is named after its hook; third-party plugins get pluggy's full search.
        if not name.startswith(f"{NAME}_") and getattr(plugin, "__name__", "").startswith(f"{NAME}."):
            return None
        return super().parse_hookimpl_opts(plugin, name)


class Registry:
    """Everything registered with sharedfs, and the only caller of its hooks."""

    def __init__(self, *, blocked: Iterable[str] = (), entry_points: bool = True) -> None:
        self.pm = _PluginManager(NAME)
        self.pm.add_hookspecs(hookspecs)
        self.blocked = frozenset(blocked)
        #: Every third-party entry point's name, loaded or blocked (``SHAREDFS_DISABLE`` may name it).
        self.entry_point_names: set[str] = set()
        for name in self.blocked:
            self.pm.set_blocked(name)
        for name in BUILTIN_PLUGINS:
            self.pm.register(import_module(f"sharedfs.plugins.{name}"), name=name)
        # Built-in shim modules register on first need (:meth:`shims`): activating one framework
        # does not import the other six shims.
        self.external: list[ExternalPlugin] = self._load_entry_points() if entry_points else []
        self.pm.check_pending()  # a misspelt hook name in any plugin fails loudly here

    # -- loading ---------------------------------------------------------------------------

    def _load_entry_points(self) -> list[ExternalPlugin]:
        if not distinfo.declares_group(NAME):  # the usual case: no importlib.metadata to import
            return []
        from importlib.metadata import entry_points

        found = []
        eps = entry_points()
        group = eps.select(group=NAME) if hasattr(eps, "select") else eps.get(NAME, ())  # type: ignore[arg-type]
        for ep in group:
            self.entry_point_names.add(ep.name)
            dist = getattr(ep, "dist", None)
            meta = (dist.metadata["Name"], dist.version) if dist is not None else ("?", "?")
            # A built-in shim's name stays the built-in's, registered or not yet (see :meth:`shims`).
            if self.pm.is_blocked(ep.name) or self.pm.has_plugin(ep.name) or ep.name in BUILTIN_SHIMS:
                continue
            try:
                self.pm.register(ep.load(), name=ep.name)
            except Exception as exc:  # noqa: BLE001 - one broken plugin must not break the user's import
                error = f"{type(exc).__name__}: {exc}"
                log.warning("plugin %r from %s %s failed to load and is off: %s",
                            ep.name, meta[0], meta[1], error)
                found.append(ExternalPlugin(ep.name, ep.value, meta[0], meta[1], error))
            else:
                found.append(ExternalPlugin(ep.name, ep.value, meta[0], meta[1]))
        return found

    # -- the hooks, one typed method each ---------------------------------------------------

    def settings_layers(self, environ: Mapping[str, str]) -> list[Layer]:
        return [layer for layers in self.pm.hook.sharedfs_settings_layers(environ=environ) for layer in layers]

    def process_identity(self, environ: Mapping[str, str]) -> ProcessIdentity | None:
        return self.pm.hook.sharedfs_process_identity(environ=environ)

    def classify_filesystem(self, mount: Mount) -> FsInfo:
        info = self.pm.hook.sharedfs_classify_filesystem(mount=mount)
        if info is None:  # the built-in plugin always answers; a blocked one must not crash us
            raise LookupError(f"no plugin classified {mount.fstype} at {mount.mount_point}")
        return info

    def choose_lock(self, path: str, fs: FsInfo, policy: Policy) -> LockChoice:
        choice = self.pm.hook.sharedfs_choose_lock(path=path, fs=fs, policy=policy)
        if choice is None:
            raise LookupError(f"no plugin chose a lock for {path}")
        return choice

    def cache_placement(self, request: CacheRequest, policy: Policy) -> CachePlacement | None:
        return self.pm.hook.sharedfs_cache_placement(request=request, policy=policy)

    def team_cache(self, directory: str, policy: Policy) -> TeamCache | None:
        return self.pm.hook.sharedfs_team_cache(directory=directory, policy=policy)

    def holder_alive(self, record: HolderRecord, policy: Policy, unchanged_for: float | None = None) -> bool | None:
        return self.pm.hook.sharedfs_holder_alive(record=record, policy=policy, unchanged_for=unchanged_for)

    def shims(self, modules: Iterable[str] | None = None) -> list[Shim]:
        """The shims registered so far, after registering the built-in shim ``modules`` (None: all)."""
        added = False
        for name in BUILTIN_SHIMS if modules is None else modules:
            if name in BUILTIN_SHIMS and name not in self.blocked and self.pm.get_plugin(name) is None:
                self.pm.register(import_module(f"sharedfs.shims.{name}"), name=name)
                added = True
        if added:
            self.pm.check_pending()
        return [shim for shims in self.pm.hook.sharedfs_register_shims() for shim in shims]

    def block(self, names: Iterable[str]) -> bool:
        """Block the plugins and built-in shims ``names`` names, as ``SHAREDFS_DISABLE`` does at registration,
        for a ``disable`` read later (the config file, :func:`sharedfs.configure`).  True when one was newly
        blocked.  ``settings`` stays: it reads the config file that would block it (only the variable can)."""
        new = {name for name in names
               if name not in self.blocked and name != "settings"
               and (self.pm.has_plugin(name) or name in BUILTIN_SHIMS or name in self.entry_point_names)}
        for name in new:
            self.pm.set_blocked(name)  # unregisters it when registered
        self.blocked = self.blocked | new
        return bool(new)

    def known_names(self) -> frozenset[str]:
        """Every name ``SHAREDFS_DISABLE`` can mean: the built-in plugins and shims (a framework's name
        and each of its shims' full names, ``mmengine.runner``), third-party plugins and their shims."""
        third_party = {shim.name for shims in self.pm.hook.sharedfs_register_shims() for shim in shims}
        return frozenset({*BUILTIN_PLUGINS, *BUILTIN_SHIMS, *_bootstrap.SHIMS, *self.entry_point_names,
                          *third_party})

    def plugin_names(self) -> list[str]:
        return sorted(name for name, plugin in self.pm.list_name_plugin() if plugin is not None)
