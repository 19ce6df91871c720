"""Logs speak once: one line per decision, from one process per node (else every rank and worker repeats it)."""

from __future__ import annotations

import logging

from sharedfs.machinery import runtime
from sharedfs.machinery.hookspecs import NAME

log = logging.getLogger(NAME)
_said: set[str] = set()


def decision(message: str, *, level: int = logging.INFO, every_rank: bool = False) -> None:
    """Log ``message`` once per process, from the node leader only unless ``every_rank``."""
    if message in _said:
        return
    _said.add(message)
    if not log.isEnabledFor(level):
        return  # nobody listens (the default level): asking the plugins who we are would be wasted work
    if not every_rank:
        try:
            if not runtime.identity().is_node_leader:
                return
        except Exception:  # noqa: BLE001 - a log line must never fail the caller
            pass
    log.log(level, message)
