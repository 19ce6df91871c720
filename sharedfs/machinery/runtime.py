"""This process's sharedfs: its plugin registry, its resolved policy, who it is; made on first use, shared by all."""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import field, replace
from typing import Any

from sharedfs.errors import ConfigError
from sharedfs.machinery.hookspecs import NAME
from sharedfs.machinery.registry import Registry
from sharedfs.model import envvars
from sharedfs.model.identity import ProcessIdentity
from sharedfs.model.policy import Policy, explicit_layer, resolve
from sharedfs.model.settings import BY_NAME, from_environ, log_level
from sharedfs.model.structs import mutable

log = logging.getLogger(NAME)
_lock = threading.RLock()


@mutable
class _State:
    """The process's registry, the settings given by :func:`configure`, and the policy resolved from both."""

    registry: Registry
    explicit: dict[str, Any] = field(default_factory=dict)
    policy: Policy | None = None


_state: _State | None = None


def _get_state() -> _State:
    global _state
    with _lock:
        if _state is None:
            _ensure_handler()
            # Read before any plugin loads, so blocking happens at registration (pluggy set_blocked); a bad
            # value blocks nothing here and is refused, with what was wrong, when the policy is resolved.
            try:
                blocked = BY_NAME["disable"].parse(from_environ(os.environ)[0].get("disable", ""))
            except ConfigError:
                blocked = ()
            _state = _State(registry=Registry(blocked=blocked))
        return _state


def registry() -> Registry:
    """The process's plugin registry (built-in plugins, shims and entry points, loaded once)."""
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
            state.policy = _block_disabled(state, resolved)
            log.setLevel(log_level(resolved.log))
        return state.policy


def unknown_disabled(current: Policy) -> ConfigError | None:
    """The error for names in ``disable`` that no shim or plugin has (a typo: ``dataset``), or None."""
    if not set(current.disable) - {"all"}:  # the usual case, on every framework's import: nothing to look up
        return None
    known = registry().known_names()
    unknown = sorted(set(current.disable) - {"all"} - known)
    if not unknown:
        return None
    import difflib

    source = current.source("disable")
    # Quoted as the user wrote it (the policy holds it parsed).
    raw: Any = ",".join(current.disable)
    if source == envvars.DISABLE:
        raw = from_environ(os.environ)[0].get("disable", "")
    meant = {name: difflib.get_close_matches(name, known, n=1) for name in unknown}
    hint = "; ".join(f"unknown: {name}" + (f" (did you mean {close[0]}?)" if close else "")
                     for name, close in meant.items())
    return ConfigError(source, raw, "1/true/all, or a comma-separated list of these names: "
                       + ", ".join(sorted(known)), hint)


def set_explicit(settings: dict[str, Any]) -> Policy:
    """Make ``settings`` this process's explicit settings (validated first); the new policy."""
    state = _get_state()
    with _lock:
        candidate = policy(**settings)  # raises ConfigError before anything changes
        unknown = unknown_disabled(candidate) if "disable" in settings else None
        if unknown is not None:  # the program's own call: refused, as any other bad value
            raise unknown
        state.explicit.update(settings)
        state.policy = candidate = _block_disabled(state, candidate)
        log.setLevel(log_level(candidate.log))
        return candidate


def _block_disabled(state: _State, resolved: Policy) -> Policy:
    """``resolved`` once the plugins its ``disable`` names are blocked, whichever source named them.

    The variable blocks them before they register (:func:`_get_state`); the config file and
    :func:`configure` are read through the registry, so they block here, and the policy is resolved
    again without what the blocked plugins said (the slurm plugin's node name, say).
    """
    if not state.registry.block(resolved.disable):
        return resolved
    layers = state.registry.settings_layers(os.environ)
    if state.explicit:
        layers.append(explicit_layer(state.explicit))
    return resolve(layers)


def identity() -> ProcessIdentity:
    """This process's rank/node identity (re-asked each time: torch.distributed may start late)."""
    node = policy().node_id  # first: the policy blocks the plugins its ``disable`` names
    answer = registry().process_identity(os.environ)
    if answer is None:
        return ProcessIdentity(node_id=node)
    return answer if answer.node_id else replace(answer, node_id=node)


def strict() -> bool:
    """``SHAREDFS_STRICT``, read directly: it matters most when the policy itself cannot be built."""
    try:
        return bool(BY_NAME["strict"].parse(os.environ.get(envvars.STRICT, "")))
    except ValueError:
        return False


def _ensure_handler() -> None:
    """One stderr handler on the ``sharedfs`` logger, unless the application configured its own."""
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("sharedfs: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False
