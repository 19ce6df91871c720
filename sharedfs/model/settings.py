"""The settings a user can give, their defaults, and how each raw value is validated (one table: :data:`SETTINGS`)."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping

import _sharedfs_bootstrap as _bootstrap
from sharedfs.errors import ConfigError
from sharedfs.model import envvars
from sharedfs.model.structs import frozen

LOCK_KINDS = ("auto", "flock", "posix", "soft", "lease")
CACHE_MODES = ("auto", "shared", "node-local")
LOG_LEVELS = ("debug", "info", "warning", "error")


@frozen
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


#: Upper bounds.  A value past them is a typo or an attack, and would fail later and further from
#: its cause (a lease of 1e300 s overflows the lock's arithmetic; a wait of years never ends).
MAX_WAIT_SECONDS = 30 * 24 * 3600
MIN_LEASE_SECONDS, MAX_LEASE_SECONDS = 1, 24 * 3600
MAX_WORKERS = 4096
#: The node id becomes part of file names in lock records and node-local markers.
NODE_ID_MAX = 64
_NODE_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
#: Longest path accepted for the node-local root (PATH_MAX is 4096 including the names below it).
PATH_MAX = 3800


def _seconds(low: float, high: float, *, include_low: bool) -> Callable[[Any], float]:
    def parse(raw: Any) -> float:
        if isinstance(raw, bool):  # TOML true is not 1 second
            raise TypeError(raw)
        try:
            value = float(raw)  # accepts " 12.5 " from the environment and 12 from TOML
        except OverflowError:  # a TOML integer with 400 digits
            raise ValueError(raw) from None
        above_low = value >= low if include_low else value > low
        if not (above_low and value <= high):  # also rejects NaN and infinities
            raise ValueError(raw)
        return value

    return parse


def _workers(raw: Any) -> int | str:
    if isinstance(raw, bool):
        raise TypeError(raw)
    text = str(raw).strip().lower()
    if text in ("auto", "off"):
        return text
    if len(text) > 8:  # int() of a 4000-digit string is slow and never a worker count
        raise ValueError(raw)
    value = int(text)
    if not 1 <= value <= MAX_WORKERS:
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
    if not os.path.isabs(text) or "\0" in text or len(text) > PATH_MAX:
        raise ValueError(raw)
    return os.path.normpath(text)


def _node_id(raw: Any) -> str:
    text = str(raw).strip()
    # It becomes part of lock records and file names: a short plain token, never "." or "..".
    if not 0 < len(text) <= NODE_ID_MAX or not set(text) <= _NODE_ID_CHARS or not text.strip("."):
        raise ValueError(raw)
    return text


def _group(raw: Any) -> str:
    text = str(raw).strip()
    # A group name as groupadd accepts it, or a gid; resolved (and refused if unknown) where it is used.
    if not text or len(text) > 64 or not all(c.isalnum() or c in "._-" for c in text) or text.startswith("-"):
        raise ValueError(raw)
    return text


def _names(raw: Any) -> tuple[str, ...]:
    parsed: tuple[str, ...] = _bootstrap.parse_disable(raw)  # the bootstrap reads the variable with it too
    return parsed


SETTINGS: tuple[Setting, ...] = (
    Setting("lock", envvars.LOCK, "auto", _choice(*LOCK_KINDS), "one of " + ", ".join(LOCK_KINDS),
            "lock kind; auto picks the cheapest one that is correct for each path's filesystem"),
    Setting("cache", envvars.CACHE, "auto", _choice(*CACHE_MODES), "one of " + ", ".join(CACHE_MODES),
            "where framework caches live; auto keeps them where they are unless that is unsafe"),
    Setting("cache_root", envvars.CACHE_ROOT, None, _path,
            f"an absolute directory path (at most {PATH_MAX} characters)",
            "node-local root for caches (else $SLURM_TMPDIR, $TMPDIR, /tmp)"),
    Setting("wait_timeout", envvars.WAIT_TIMEOUT, 300.0, _seconds(0, MAX_WAIT_SECONDS, include_low=False),
            f"a positive number of seconds, at most {MAX_WAIT_SECONDS} (30 days)",
            "how long to wait for a lock or for a path to become visible"),
    Setting("lease_seconds", envvars.LEASE_SECONDS, 30.0,
            _seconds(MIN_LEASE_SECONDS, MAX_LEASE_SECONDS, include_low=True),
            f"a number of seconds from {MIN_LEASE_SECONDS} to {MAX_LEASE_SECONDS} (one day)",
            "lease locks: a holder that stops renewing for this long is presumed dead"),
    Setting("poll_interval", envvars.POLL_INTERVAL, 1.0, _seconds(0.01, 60.0, include_low=True),
            "a number of seconds from 0.01 to 60",
            "longest pause between a waiting node's looks at the shared filesystem (one rank per node looks)"),
    Setting("shared_group", envvars.SHARED_GROUP, None, _group, "a group name or number",
            "team caches: files sharedfs creates are this group's too (else: setgid directories say so)"),
    Setting("max_workers", envvars.MAX_WORKERS, "auto", _workers,
            f"auto, off or a whole number from 1 to {MAX_WORKERS}",
            "DataLoader worker cap; auto = CPUs this task may use"),
    Setting("log", envvars.LOG, "warning", _choice(*LOG_LEVELS), "one of " + ", ".join(LOG_LEVELS),
            "log level of the 'sharedfs' logger"),
    Setting("strict", envvars.STRICT, False, _bool, "1/true/yes or 0/false/no",
            "re-raise internal shim errors instead of logging them (for CI)"),
    Setting("node_id", envvars.NODE_ID, None, _node_id,
            f"a name of 1 to {NODE_ID_MAX} characters from A-Z a-z 0-9 . _ -",
            "this node's identity in lock records; defaults to the host name"),
    Setting("disable", envvars.DISABLE, (), _names, "1/true/all, or a comma-separated list of shim names",
            "opt out entirely, or of the named shims"),
)

BY_NAME = {setting.name: setting for setting in SETTINGS}


def default_node_id() -> str:
    """The host name as a node id: its first label, other characters replaced, cut to the maximum length."""
    import socket  # lazy: only when no layer names the node

    label = socket.gethostname().split(".")[0]
    text = "".join(c if c in _NODE_ID_CHARS else "-" for c in label)[:NODE_ID_MAX]
    return text if text.strip(".-") else "localhost"


def log_level(name: str) -> int:
    return int(getattr(logging, name.upper()))


#: No setting's value is longer than a path.
MAX_VALUE_CHARS = 4096


def from_environ(environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Every setting's raw value in ``environ`` and the variable it came from: the one reader of the
    ``SHAREDFS_*`` variables (the settings plugin's layer, and the registry's blocking before plugins load).

    A value longer than :data:`MAX_VALUE_CHARS` is refused before it is parsed; an exported-but-empty
    variable means "not set", as in most tools.
    """
    values: dict[str, str] = {}
    origins: dict[str, str] = {}
    for setting in SETTINGS:
        raw = environ.get(setting.env, "")
        if len(raw) > MAX_VALUE_CHARS:
            raise ConfigError(setting.env, raw[:40] + "...",
                              f"at most {MAX_VALUE_CHARS} characters ({setting.expected})", f"it has {len(raw)}")
        if raw.strip():
            values[setting.name] = raw
            origins[setting.name] = setting.env
    return values, origins
