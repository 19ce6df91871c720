"""The settings a user can give, their defaults, and how each raw value is validated.

One table, :data:`SETTINGS`, is the single place a setting is defined: its
policy field name (also its TOML key), its environment variable, its default
and its parser.  Plugins only *supply* raw values (see
``sharedfs_settings_layers``); validation happens here so every error reads
the same way.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from . import envvars

LOCK_KINDS = ("auto", "flock", "posix", "soft", "lease")
CACHE_MODES = ("auto", "shared", "node-local")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class Setting:
    """One user-facing setting."""

    name: str
    env: str
    default: Any
    parse: Callable[[Any], Any]
    expected: str
    help: str


def _choice(*allowed: str) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        value = str(raw).strip().lower()
        if value not in allowed:
            raise ValueError(value)
        return value

    return parse


def _positive_seconds(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError(raw)
    value = float(raw)  # accepts " 12.5 " from the environment and 12 from TOML
    if not 0 < value < float("inf"):  # also rejects NaN
        raise ValueError(raw)
    return value


def _workers(raw: Any) -> int | str:
    if isinstance(raw, bool):
        raise ValueError(raw)
    text = str(raw).strip().lower()
    if text in ("auto", "off"):
        return text
    value = int(text)
    if value < 1:
        raise ValueError(raw)
    return value


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(raw)


def _path(raw: Any) -> str:
    text = os.path.expanduser(os.path.expandvars(str(raw).strip()))
    if not os.path.isabs(text):
        raise ValueError(raw)
    return os.path.normpath(text)


def _node_id(raw: Any) -> str:
    text = str(raw).strip()
    # The node id becomes part of lock records and directory names: keep it a plain token.
    if not text or any(c in text for c in "/\\\n\0 "):
        raise ValueError(raw)
    return text


def _names(raw: Any) -> tuple[str, ...]:
    items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
    names = tuple(sorted({str(item).strip().lower() for item in items if str(item).strip()}))
    if any(name in envvars.TRUE_VALUES for name in names):
        return ("all",)
    if any(name in ("0", "false", "no", "off") for name in names):
        return ()
    return names


SETTINGS: tuple[Setting, ...] = (
    Setting("lock", envvars.LOCK, "auto", _choice(*LOCK_KINDS), "one of " + ", ".join(LOCK_KINDS),
            "lock kind; auto picks the cheapest one that is correct for each path's filesystem"),
    Setting("cache", envvars.CACHE, "auto", _choice(*CACHE_MODES), "one of " + ", ".join(CACHE_MODES),
            "where framework caches live; auto keeps them where they are unless that is unsafe"),
    Setting("cache_root", envvars.CACHE_ROOT, None, _path, "an absolute directory path",
            "node-local root for caches (else $SLURM_TMPDIR, $TMPDIR, /tmp)"),
    Setting("wait_timeout", envvars.WAIT_TIMEOUT, 300.0, _positive_seconds, "a positive number of seconds",
            "how long to wait for a lock or for a path to become visible"),
    Setting("lease_seconds", envvars.LEASE_SECONDS, 30.0, _positive_seconds, "a positive number of seconds",
            "lease locks: a holder that stops renewing for this long is presumed dead"),
    Setting("max_workers", envvars.MAX_WORKERS, "auto", _workers, "auto, off or a whole number >= 1",
            "DataLoader worker cap; auto = CPUs this task may use"),
    Setting("log", envvars.LOG, "warning", _choice(*LOG_LEVELS), "one of " + ", ".join(LOG_LEVELS),
            "log level of the 'sharedfs' logger"),
    Setting("strict", envvars.STRICT, False, _bool, "1/true/yes or 0/false/no",
            "re-raise internal shim errors instead of logging them (for CI)"),
    Setting("node_id", envvars.NODE_ID, None, _node_id, "a non-empty name without spaces or slashes",
            "this node's identity in lock records; defaults to the host name"),
    Setting("disable", envvars.DISABLE, (), _names, "1/true/all, or a comma-separated list of shim names",
            "opt out entirely, or of the named shims"),
)

BY_NAME = {setting.name: setting for setting in SETTINGS}


def default_node_id() -> str:
    import socket

    return _node_id(socket.gethostname().split(".")[0] or "localhost")


def log_level(name: str) -> int:
    return int(getattr(logging, name.upper()))
