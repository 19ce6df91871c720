"""Real distributed filesystems on one machine (JuiceFS, MooseFS, GlusterFS): a volume, one FUSE mount per node.

:mod:`~sharedfs.demo.realfs.kinds` (what each kind needs), :mod:`~sharedfs.demo.realfs.daemons` (starting them),
:mod:`~sharedfs.demo.realfs.volumes` (:func:`volume`), :mod:`~sharedfs.demo.realfs.reaper` (teardown, also after
the caller died).  Linux, root; standard library only.
"""

from __future__ import annotations

from .kinds import (
    APT_PACKAGES,
    FSTYPES,
    KINDS,
    LAG_S,
    PROFILES,
    PYPI_PACKAGES,
    RealFSError,
    RealFSUnavailable,
    Volume,
    installable,
    unavailable,
)
from .volumes import volume

__all__ = [
    "APT_PACKAGES",
    "FSTYPES",
    "KINDS",
    "LAG_S",
    "PROFILES",
    "PYPI_PACKAGES",
    "RealFSError",
    "RealFSUnavailable",
    "Volume",
    "installable",
    "unavailable",
    "volume",
]
