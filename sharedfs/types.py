"""What plugins and shims import: the hook marker and the types the hooks pass and return.

The public home of these names (the modules that define them are the kernel's own and may
move); a plugin is ``from sharedfs.types import hookimpl, Policy, ...`` and nothing else of
the kernel's inside.  The hook specifications themselves, with their documentation, are in
:mod:`sharedfs.machinery.hookspecs`; docs/architecture.md shows a whole plugin and a whole shim.
"""

from __future__ import annotations

from sharedfs.machinery.hookspecs import hookimpl
from sharedfs.machinery.shimbase import RebindingShim, Shim, ShimContext
from sharedfs.model.fsinfo import FsInfo, Mount
from sharedfs.model.identity import ProcessIdentity
from sharedfs.model.policy import CachePlacement, CacheRequest, Layer, LockChoice, Policy, TeamCache
from sharedfs.model.records import HolderRecord

__all__ = [
    "CachePlacement",
    "CacheRequest",
    "FsInfo",
    "HolderRecord",
    "Layer",
    "LockChoice",
    "Mount",
    "Policy",
    "ProcessIdentity",
    "RebindingShim",
    "Shim",
    "ShimContext",
    "TeamCache",
    "hookimpl",
]
