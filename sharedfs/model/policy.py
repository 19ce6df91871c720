"""The one immutable policy every shim applies, and how it is resolved from layers.

Precedence: defaults < TOML file < environment < explicit arguments (``configure``, hook kwargs).
"""

from __future__ import annotations

from dataclasses import field, fields
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from sharedfs.errors import ConfigError
from sharedfs.model.settings import BY_NAME, SETTINGS, default_node_id
from sharedfs.model.structs import frozen

#: Priority of explicit arguments; plugin layers must stay below it.
EXPLICIT_PRIORITY = 1000


@frozen
class Layer:
    """Raw values from one source, e.g. the environment or a TOML file.

    ``origins`` names, per key, where the value was read (``SHAREDFS_LOCK``,
    ``/etc/sharedfs.toml: lock``); errors and ``sharedfs status`` quote it.
    """

    name: str
    priority: int
    values: Mapping[str, Any]
    origins: Mapping[str, str] = field(default_factory=dict)
    #: The values are facts the environment reports (the scheduler's node name), not
    #: preferences: a higher layer may override them, but the Policy then records the
    #: disagreement (:attr:`Policy.conflicts`) and sharedfs stops trusting that value.
    authoritative: bool = False

    def origin(self, key: str) -> str:
        return self.origins.get(key, f"{self.name}: {key}")


@frozen
class LockChoice:
    """What ``sharedfs_choose_lock`` decided for one path, and why (one plain sentence)."""

    kind: str  # "flock", "posix", "soft" or "lease"
    reason: str
    #: A native kind also takes the existence marker (chosen on shared filesystems: a process
    #: that falls back to an existence lock at run time must still be excluded).
    marker: bool = False


@frozen
class TeamCache:
    """A directory a group of users shares (``sharedfs_team_cache``): what sharedfs creates there is theirs too.

    Every file sharedfs creates in it gets ``file_mode`` (whatever the creator's umask) and
    group ``gid``; ``reason`` says how the team cache was recognised.
    """

    gid: int
    file_mode: int
    reason: str


@frozen
class CacheRequest:
    """What the kernel tells ``sharedfs_cache_placement`` about one framework's cache."""

    framework: str
    #: The framework's own variable for its cache directory (``WIDS_CACHE``) ...
    variable: str
    #: ... its value in this process's environment, if set (the user's explicit choice) ...
    user_value: str | None
    #: ... and where the framework puts its cache when it is unset.
    default: str | None
    #: Create (or check) the directory chosen (False: make nothing, check what exists: ``sharedfs status``).
    create: bool = True
    #: A row of the placed-cache table (:mod:`sharedfs.model.caches`): under ``cache = "auto"`` a
    #: default on a shared filesystem goes per node, ``<default>/<node>`` (kept warm across jobs,
    #: one node's processes per directory).
    per_node: bool = False
    #: Whether the plugins classify the default's filesystem as shared (asked for table rows).
    default_shared: bool | None = None


@frozen
class CachePlacement:
    """Where one framework's cache goes, decided by ``sharedfs_cache_placement``.

    ``path`` ``None`` leaves the framework's own choice (its default, or the user's
    variable); ``reason`` is one plain sentence for the log and ``sharedfs status``.
    """

    path: str | None
    reason: str


@frozen
class Policy:
    """The resolved settings.  Field names are the settings' names (and TOML keys)."""

    lock: str
    cache: str
    cache_root: str | None
    wait_timeout: float
    lease_seconds: float
    poll_interval: float
    max_workers: int | str
    log: str
    strict: bool
    node_id: str
    shared_group: str | None
    disable: tuple[str, ...]
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    #: setting -> why its value disagrees with what the environment reports (see :class:`Layer`).
    conflicts: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def node_id_trusted(self) -> bool:
        """False when ``node_id`` contradicts the scheduler: it then never proves a lock holder dead."""
        return "node_id" not in self.conflicts

    def source(self, name: str) -> str:
        """Where ``name``'s value came from: ``default``, a variable, a file key, or ``explicit``."""
        return self.sources.get(name, "default")

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """``{name: {"value": ..., "source": ...}}``, JSON-serialisable (``sharedfs status --json``)."""
        return {
            f.name: {"value": _jsonable(getattr(self, f.name)), "source": self.source(f.name)}
            for f in fields(self)
            if f.name not in ("sources", "conflicts")
        }

    def shim_disabled(self, name: str) -> bool:
        """``SHAREDFS_DISABLE=mmengine`` turns off every shim of that framework (``mmengine.runner``, ...)."""
        return "all" in self.disable or name in self.disable or name.partition(".")[0] in self.disable


def resolve(layers: Iterable[Layer]) -> Policy:
    """Merge ``layers`` (lowest priority first) over the defaults and validate every value."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    facts: dict[str, tuple[Any, str]] = {}
    for setting in SETTINGS:
        values[setting.name] = setting.default
        sources[setting.name] = "default"
    for layer in sorted(layers, key=lambda layer: layer.priority):
        for key, raw in layer.values.items():
            if key not in BY_NAME:
                raise ConfigError(layer.origin(key), raw, "a known setting: " + ", ".join(BY_NAME))
            setting = BY_NAME[key]
            try:
                values[key] = setting.parse(raw)
            except (TypeError, ValueError):
                raise ConfigError(layer.origin(key), raw, setting.expected) from None
            sources[key] = layer.origin(key)
            if layer.authoritative:
                facts[key] = (values[key], layer.origin(key))
    if values["node_id"] is None:
        values["node_id"] = default_node_id()
        sources["node_id"] = "default (host name)"
    conflicts = {
        key: f"{sources[key]}={values[key]!r} disagrees with {origin}={fact!r}"
        for key, (fact, origin) in facts.items() if values[key] != fact
    }
    return Policy(**values, sources=MappingProxyType(sources), conflicts=MappingProxyType(conflicts))


def explicit_layer(settings: Mapping[str, Any]) -> Layer:
    """The layer for explicit arguments (``sharedfs.configure``, ``SharedFSHook(**kwargs)``)."""
    return Layer(
        name="explicit",
        priority=EXPLICIT_PRIORITY,
        values=dict(settings),
        origins={key: f"argument {key}" for key in settings},
    )


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
