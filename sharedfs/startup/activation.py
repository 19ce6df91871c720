"""Applying shims: right after a target framework executes, each of its shims gets the policy.

An internal error leaves that shim off; a bad setting or refused safety check fails the import (fails closed).
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Iterable

import _sharedfs_bootstrap as _bootstrap
from sharedfs.errors import SharedFSError
from sharedfs.machinery import choices, distinfo, runtime, standin
from sharedfs.machinery.hookspecs import NAME
from sharedfs.machinery.log import decision
from sharedfs.machinery.shimbase import Shim, ShimContext
from sharedfs.model.policy import CachePlacement, Policy
from sharedfs.model.structs import mutable
from sharedfs.startup import placedcaches

log = logging.getLogger(NAME)
_lock = threading.RLock()


@mutable
class ShimState:
    """What happened to one shim in this process (for ``sharedfs status``)."""

    shim: Shim
    installed_version: str | None = None
    supported: bool | None = None
    error: str | None = None
    cache: CachePlacement | None = None


_states: dict[str, ShimState] | None = None


def shim_states() -> dict[str, ShimState]:
    """Every registered shim (built-in and third-party), by name."""
    return _states_with(None)


def _states_with(modules: Iterable[str] | None) -> dict[str, ShimState]:
    """The shims known so far, after loading the built-in shim ``modules`` (None: all of them)."""
    global _states
    with _lock:
        if _states is None:
            _states = {}
        for shim in runtime.registry().shims(modules):
            _states.setdefault(shim.name, ShimState(shim))
        return _states


def targets() -> set[str]:
    """The modules whose import applies a shim (third-party shims add to the bootstrap's table)."""
    return {state.shim.target for state in shim_states().values()}


#: Built-in shims applied whenever any other shim is, whatever their own target (the bootstrap's table):
#: they guard calls of the standard library (``os.makedirs``) every framework makes on the shared filesystem
#: sharedfs was loaded for.  ``SHAREDFS_DISABLE=<name>`` still keeps each off (:func:`apply`).
COMPANIONS = tuple(name for name, row in _bootstrap.SHIMS.items() if _bootstrap.COMPANION in row[2:])


def activate(target: str, builtin: Iterable[str] | None = None) -> set[str]:
    """Apply every shim that targets ``target`` (just imported); returns the targets known now.

    ``builtin`` names the built-in shim modules with a shim for ``target`` (the bootstrap's
    table); only those are imported, with every third-party shim and the :data:`COMPANIONS`.
    None loads them all.
    """
    try:
        states = _states_with(None if builtin is None else {*builtin, *COMPANIONS})
        current = runtime.policy()
    except SharedFSError:
        raise  # a malformed setting is the user's intent, not our bug: say so loudly
    except Exception as exc:  # noqa: BLE001 - never break the user's import by our own bug
        if runtime.strict():
            raise
        report_internal_error(f"start-up on import of {target}", exc)
        return set()
    _say_unknown_disabled(current)
    with _lock:
        for state in list(states.values()):
            if state.shim.target == target:
                apply(state, current)
        _apply_companions(states, current)
        _place_caches(current)
        return {state.shim.target for state in states.values()}


_told_unknown: list[Policy] = []  # the policy whose unknown SHAREDFS_DISABLE names were reported


def _say_unknown_disabled(current: Policy) -> None:
    """A typo in SHAREDFS_DISABLE (``dataset``), said once per policy at the framework's import.

    It neither switches a shim off nor breaks the import (which may run at start-up, before the
    program can handle anything): the names it knows are honoured and every other shim stays on,
    failing closed.  ``sharedfs status`` and every other command refuse it with the same message.
    """
    if current in _told_unknown:
        return
    unknown = runtime.unknown_disabled(current)
    if unknown is not None:
        _told_unknown[:] = [current]
        log.error("%s; the shims it does not name stay ON", unknown)


def _place_caches(current: Policy) -> None:
    """Export the placed-cache table's variables (:mod:`sharedfs.startup.placedcaches`), never failing the import."""
    try:
        placedcaches.place(current)
    except Exception as exc:  # noqa: BLE001 - never break the user's import by our own bug
        if current.strict:
            raise
        report_internal_error("placing caches", exc)


def _apply_companions(states: dict[str, ShimState], current: Policy) -> None:
    """Apply the :data:`COMPANIONS` once any other shim is applied (the one place that decides it)."""
    if not any(state.shim.applied for name, state in states.items() if name not in COMPANIONS):
        return
    for name in COMPANIONS:
        state = states.get(name)
        if state is not None and not state.shim.applied:
            apply(state, current)


def apply(state: ShimState, current: Policy) -> None:
    """Patch one shim's (imported) target under ``current``, unless disabled, unsupported or broken."""
    # Stand-ins waiting for this shim's first lock stop waiting: the shim replaces them now, or,
    # if it stays off, they give way to the framework's class; a refused patch keeps them waiting.
    waiting = standin.withdraw(state.shim.name)
    try:
        _apply(state, current, late=bool(waiting))
    except BaseException:
        standin.reinstate(waiting)
        raise
    standin.settle(waiting)


def _apply(state: ShimState, current: Policy, late: bool) -> None:
    shim = state.shim
    if current.shim_disabled(shim.name) or state.error is not None or not version_supported(state):
        return
    placement = choices.cache_placement(shim, current)  # may raise UnsafeDirectoryError: fail closed
    try:
        shim.patch(current, ShimContext(cache=placement, late=late))
    except SharedFSError:
        raise
    except Exception as exc:  # noqa: BLE001 - never break the user's import by our own bug
        if current.strict:
            raise
        state.error = f"{type(exc).__name__}: {exc}"
        report_internal_error(f"shim {shim.name!r}", exc)
        return
    state.cache = placement
    if placement is not None and (placement.path or current.cache != "auto"):
        where = placement.path or "where it is"
        decision(f"{shim.name} cache -> {where}: {placement.reason}")


def reapply(current: Policy) -> None:
    """Re-apply every applied shim under a new policy (:func:`sharedfs.configure`)."""
    with _lock:
        for state in (_states or {}).values():  # a shim never loaded was never applied
            if state.shim.applied:
                apply(state, current)
        if _states:
            _place_caches(current)


def configure(**settings: Any) -> Policy:
    """Set explicit settings for this process (highest precedence) and re-apply applied shims."""
    with _lock:
        current = runtime.set_explicit(settings)
        reapply(current)
        return current


def unpatch_all() -> None:
    with _lock:
        for state in (_states or {}).values():
            state.shim.unpatch()
        placedcaches.restore()


def activate_imported() -> None:
    """Apply shims whose targets were imported before sharedfs was watching (``sharedfs.enable()``)."""
    for target in sorted(targets()):
        if target in sys.modules:
            activate(target)


def installed_version(distribution: str | None) -> str | None:
    """The installed version of ``distribution``, from its metadata (never by importing it).

    ``None`` (a shim of the standard library) is the interpreter: CPython's version, or ``None``
    on another implementation, whose standard library such a shim was not written against.
    """
    if distribution is None:
        return "%d.%d.%d" % sys.version_info[:3] if sys.implementation.name == "cpython" else None
    return distinfo.version(distribution)  # its metadata directory's name; importlib.metadata when unsure


def version_supported(state: ShimState) -> bool:
    """Whether the installed framework is in the shim's tested range; says so once when it is not."""
    if state.supported is None:
        shim = state.shim
        state.installed_version = installed_version(shim.distribution)
        supported = None if state.installed_version is None else distinfo.in_range(state.installed_version,
                                                                                   shim.supported)
        if supported is None and state.installed_version is not None:  # a pre-release, or a complex range
            from packaging.specifiers import SpecifierSet

            supported = SpecifierSet(shim.supported, prereleases=True).contains(state.installed_version)
        state.supported = bool(supported)
        if not state.supported and state.installed_version is not None:  # not installed: nothing to say
            log.warning("%s %s is outside the supported range %s; its shim stays off",
                        shim.distribution or "Python", state.installed_version, shim.supported)
    return bool(state.supported)


_reported: set[str] = set()


def report_internal_error(where: str, exc: BaseException) -> None:
    if where in _reported:
        return
    _reported.add(where)
    log.error(
        "internal error in %s; it stays off in this process and your program continues. "
        "Please report it to the sharedfs maintainers with this traceback and the output of "
        "`sharedfs status --json`. SHAREDFS_STRICT=1 makes it raise.",
        where, exc_info=exc,
    )

