"""hostilefs: a FUSE passthrough filesystem that fails like Lustre, GPFS and NFS (profiles: docs/demo-filesystems.md).

:mod:`~sharedfs.demo.hostilefs.profiles` (what each profile does), :mod:`~sharedfs.demo.hostilefs.nodeviews`
(what each simulated node sees), :mod:`~sharedfs.demo.hostilefs.fuseops` (the FUSE operations),
:mod:`~sharedfs.demo.hostilefs.server` (the server process, started by path through
:mod:`~sharedfs.demo.hostilefs.hostilefs`), :mod:`~sharedfs.demo.hostilefs.mounting` (:func:`mount`).
Standard library and relative imports only: the server process imports this package without sharedfs.
"""

from __future__ import annotations

from .mounting import FuseUnavailable, HostileMount, HostileMountError, fuse_available, is_mounted, mount
from .profiles import FSTYPE, LOCK_PROFILES, METADATA_OPS, PROFILES, Profile, metadata_ops, parse_profile

__all__ = [
    "FSTYPE",
    "LOCK_PROFILES",
    "METADATA_OPS",
    "PROFILES",
    "FuseUnavailable",
    "HostileMount",
    "HostileMountError",
    "Profile",
    "fuse_available",
    "is_mounted",
    "metadata_ops",
    "mount",
    "parse_profile",
]
