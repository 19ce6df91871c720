"""Process-wide state: the registry, the resolved policy, and which shims are applied.

Entered from the bootstrap the first time a target framework finishes
importing, or from the public API.  Holds the rules of DESIGN.md's behaviour
section: a shim's internal error is logged once and that shim stays off
(``SHAREDFS_STRICT=1`` re-raises); a malformed setting raises
:class:`~sharedfs.ConfigError` (the user's intent is never silently ignored).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from . import _bootstrap, envvars
from .errors import ConfigError
from .hookspecs import NAME
from .identity import ProcessIdentity
from .log import decision
from ._policy import LockChoice, Policy, explicit_layer, resolve
from .registry import Registry
from .settings import BY_NAME, log_level
from .shim import Shim

log = logging.getLogger(NAME)
_lock = threading.RLock()


@dataclass
class ShimState:
    """What happened to one shim in this process (for ``sharedfs status``)."""

    shim: Shim
    installed_version: str | None = None
    supported: bool | None = None
    error: str | None = None


@dataclass
class _State:
    registry: Registry
    explicit: dict[str, Any] = field(default_factory=dict)
    policy: Policy | None = None
    shims: dict[str, ShimState] = field(default_factory=dict)


_state: _State | None = None


def _get_state() -> _State:
    global _state
    with _lock:
        if _state is None:
            _ensure_handler()
            blocked = _blocked_names(os.environ)
            registry = Registry(blocked=blocked)
            _state = _State(registry=registry)
            for shim in registry.shims():
                _state.shims[shim.name] = ShimState(shim)
            # Third-party shims may target modules the bootstrap's static table lacks.
            _bootstrap.add_targets({shim.target for shim in registry.shims()})
        return _state


def _blocked_names(environ: Any) -> tuple[str, ...]:
    # Read before any plugin loads, so blocking happens at registration (pluggy set_blocked).
    return BY_NAME["disable"].parse(environ.get(envvars.DISABLE, ""))


def registry() -> Registry:
    return _get_state().registry


def policy(**overrides: Any) -> Policy:
    """The policy in force; with keyword arguments, that policy with those explicit settings on top.

    Keyword arguments do not change the process's policy (use :func:`configure`).
    """
    state = _get_state()
    with _lock:
        if state.policy is None or overrides:
            layers = state.registry.settings_layers(os.environ)
            explicit = {**state.explicit, **overrides}
            if explicit:
                layers.append(explicit_layer(explicit))
            resolved = resolve(layers)
            if overrides:
                return resolved
            state.policy = resolved
            _configure_logging(resolved)
        return state.policy


def configure(**settings: Any) -> Policy:
    """Set explicit settings for this process (highest precedence) and re-apply applied shims."""
    state = _get_state()
    with _lock:
        candidate = policy(**settings)  # validates before anything changes
        state.explicit.update(settings)
        state.policy = candidate
        _configure_logging(candidate)
        for shim_state in state.shims.values():
            if shim_state.shim.applied:
                _apply(shim_state, candidate)
        return candidate


def activate(target: str) -> None:
    """Apply every shim that targets ``target`` (called right after ``target`` was imported)."""
    try:
        state = _get_state()
        current = policy()
    except ConfigError:
        raise  # a malformed setting is the user's intent, not our bug: say so loudly
    except Exception as exc:  # noqa: BLE001
        if _strict():
            raise
        _report_internal_error(f"start-up on import of {target}", exc)
        return
    with _lock:
        for shim_state in state.shims.values():
            if shim_state.shim.target == target:
                _apply(shim_state, current)


def _apply(shim_state: ShimState, current: Policy) -> None:
    shim = shim_state.shim
    if current.shim_disabled(shim.name) or shim_state.error is not None:
        return
    if not _version_supported(shim_state):
        return
    try:
        shim.patch(current)
    except Exception as exc:  # noqa: BLE001 - never break the user's import by our own bug
        if current.strict:
            raise
        shim_state.error = f"{type(exc).__name__}: {exc}"
        _report_internal_error(f"shim {shim.name!r}", exc)


def _version_supported(shim_state: ShimState) -> bool:
    # Read the version from installed metadata, not from the module: a module may
    # lie, be half-initialised, or (for an unsupported release) not import at all.
    if shim_state.supported is None:
        from importlib.metadata import PackageNotFoundError, version

        from packaging.specifiers import SpecifierSet

        shim = shim_state.shim
        try:
            shim_state.installed_version = version(shim.distribution)
        except PackageNotFoundError:
            shim_state.installed_version = None
        shim_state.supported = shim_state.installed_version is not None and SpecifierSet(
            shim.supported, prereleases=True
        ).contains(shim_state.installed_version)
        if not shim_state.supported:
            log.warning(
                "%s %s is outside the supported range %s; its shim stays off",
                shim.distribution, shim_state.installed_version or "(no metadata)", shim.supported,
            )
    return bool(shim_state.supported)


def installed_version(shim: Shim) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(shim.distribution)
    except PackageNotFoundError:
        return None


_fs_cache: dict[tuple[int, str], Any] = {}


def describe_filesystem(path: str) -> Any:
    """The plugins' classification (:class:`~sharedfs.fsinfo.FsInfo`) of the filesystem under ``path``."""
    from .fsinfo import mount_for

    mount = mount_for(path)
    key = (mount.mount_id, mount.mount_point)
    info = _fs_cache.get(key)
    if info is None:
        info = _fs_cache[key] = registry().classify_filesystem(mount)
    return info


#: Mounts where a native lock failed at run time (ENOSYS/ENOLCK), with what failed.
_native_locks_failed: dict[tuple[int, str], str] = {}


def native_locks_failed(lock_file: str, what: str) -> None:
    """Remember that native locks fail on ``lock_file``'s mount, whatever its classification said."""
    fs = describe_filesystem(os.path.dirname(lock_file) or ".")
    _native_locks_failed[(fs.mount.mount_id, fs.mount.mount_point)] = what


def choose_lock(lock_file: str, current: Policy) -> LockChoice:
    """Ask the plugins which lock kind ``lock_file`` needs; say so once per mount and kind."""
    fs = describe_filesystem(os.path.dirname(lock_file) or ".")
    failed = _native_locks_failed.get((fs.mount.mount_id, fs.mount.mount_point))
    if failed and current.lock in ("auto", "flock", "posix"):
        return LockChoice("soft", f"{failed} earlier on {fs.mount.mount_point}; using an existence lock")
    choice = registry().choose_lock(lock_file, fs, current)
    decision(f"locks under {fs.mount.mount_point} -> {choice.kind}: {choice.reason}")
    return choice


def shim_states() -> dict[str, ShimState]:
    return _get_state().shims


def identity() -> ProcessIdentity:
    """This process's rank/node identity (re-asked each time: torch.distributed may start late)."""
    answer = registry().process_identity(os.environ)
    node = policy().node_id
    if answer is None:
        return ProcessIdentity(node_id=node)
    if not answer.node_id:
        from dataclasses import replace

        answer = replace(answer, node_id=node)
    return answer


def disable() -> None:
    """Undo every patch and stop watching imports, for the rest of this process."""
    with _lock:
        _bootstrap.uninstall()
        if _state is not None:
            for shim_state in _state.shims.values():
                shim_state.shim.unpatch()


def enable() -> None:
    """Watch imports again and patch the targets already imported (ignores ``SHAREDFS_DISABLE=1``)."""
    with _lock:
        _bootstrap.install_finder(respect_disable=False)
        _bootstrap.add_targets({s.shim.target for s in _get_state().shims.values()})
        for target in sorted({s.shim.target for s in _get_state().shims.values()}):
            if target in sys.modules:
                activate(target)


def _strict() -> bool:
    # Used when the policy itself could not be built, so parse the variable directly.
    try:
        return bool(BY_NAME["strict"].parse(os.environ.get(envvars.STRICT, "")))
    except ValueError:
        return False


_reported: set[str] = set()


def _report_internal_error(where: str, exc: BaseException) -> None:
    if where in _reported:
        return
    _reported.add(where)
    log.error(
        "internal error in %s; it stays off in this process and your program continues. "
        "Please report it to the sharedfs maintainers with this traceback and the output of "
        "`sharedfs status --json`. SHAREDFS_STRICT=1 makes it raise.",
        where, exc_info=exc,
    )


def _ensure_handler() -> None:
    """One stderr handler on the ``sharedfs`` logger, unless the application configured its own."""
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("sharedfs: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False


def _configure_logging(current: Policy) -> None:
    log.setLevel(log_level(current.log))
