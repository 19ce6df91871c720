"""The hostilefs profiles (docs/demo-filesystems.md): constants, the parser, and which simulated node a caller is on.

Standard library only: the server process loads it too, without the sharedfs package.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Mapping, Optional, Union

NODE_ENV = "SHAREDFS_NODE_ID"
DEFAULT_NODE = "default"
_NODE_KEY = b"\0" + NODE_ENV.encode() + b"="
#: ``/proc/self/mountinfo`` fstype of a hostilefs mount (``subtype=hostilefs``).
FSTYPE = "fuse.hostilefs"

#: Profiles deciding what file locks do; at most one per mount.
LOCK_PROFILES = ("plain", "lustre-noflock", "nfs-nolock", "localflock")
#: Every base profile name; combine with ``+``.
PROFILES = LOCK_PROFILES + ("lagging", "flapping", "nfs-cto", "estale")
#: ``flapping``: the lookups of a hidden name one listing lets through: one stat (the kernel's LOOKUP, then
#: GETATTR, as the mount caches nothing).
FLAP_LOOKUPS = 2
_PathLike = Union[str, "os.PathLike[str]"]
_LOCK_ERRNO = {"lustre-noflock": errno.ENOSYS, "nfs-nolock": errno.ENOLCK}



#: Every operation the server implements (what ``--count-ops`` counts).
OPERATIONS = ("getattr", "readdir", "readlink", "mknod", "mkdir", "symlink", "link", "unlink", "rmdir", "rename",
              "chmod", "chown", "truncate", "utimens", "statfs", "open", "create", "read", "write", "flush",
              "fsync", "release", "flock", "lock")
#: Counted apart from ``lock``: the whole-file POSIX unlock libfuse sends on every close(2) of a file on a
#: filesystem with a lock handler; a kernel client looks at its own lock list and usually sends nothing.
UNLOCK_ON_CLOSE = "unlock-on-close"
#: The operations a cluster filesystem's metadata server serves: lookups and attributes, namespace changes,
#: open and close (Lustre's MDS_CLOSE), and locks (Lustre's flock goes to the MDT).  Left out: data (read,
#: write, fsync go to object servers), flush, which FUSE sends on every close(2) beside the release, and
#: UNLOCK_ON_CLOSE.
METADATA_OPS = frozenset(OPERATIONS) - {"read", "write", "flush", "fsync"}
#: The server's control socket (``--count-ops``), inside its private state directory.
CONTROL_SOCKET = "control.sock"




@dataclass(frozen=True)
class Profile:
    """A parsed profile string: one lock behaviour plus the optional lag and close-to-open data."""

    name: str
    locks: str  # one of LOCK_PROFILES
    lagging: bool
    cto: bool = False  # nfs-cto
    estale: bool = False
    flapping: bool = False  # lagging, with listings that show the hidden name for a lookup or two


def parse_profile(name: str) -> Profile:
    """Parse ``"localflock"``, ``"lagging+nfs-nolock"``... Raises ValueError."""
    locks, lagging, cto, estale, flapping = "plain", False, False, False, False
    parts = [p.strip() for p in name.split("+") if p.strip()]
    if not parts:
        raise ValueError("empty hostilefs profile")
    for part in parts:
        if part == "lagging":
            lagging = True
        elif part == "flapping":
            lagging = flapping = True
        elif part == "nfs-cto":
            cto = True
        elif part == "estale":
            estale = True
        elif part in LOCK_PROFILES:
            if part != "plain" and locks not in ("plain", part):
                raise ValueError(f"profile {name!r} combines two lock behaviours ({locks}, {part})")
            if part != "plain":
                locks = part
        else:
            raise ValueError(f"unknown hostilefs profile {part!r}; known: {', '.join(PROFILES)}")
    return Profile(name=name, locks=locks, lagging=lagging, cto=cto, estale=estale, flapping=flapping)


def node_of_pid(pid: int) -> str:
    """The simulated node of process/thread ``pid``: its SHAREDFS_NODE_ID at exec time.

    Deliberately not cached: pids are recycled (pid_max is often 32768) and a
    forked child touches the mount with its parent's environment before it
    execs into its own, so any per-pid cache would hand out stale nodes.
    Reading a small /proc file costs tens of microseconds, well below one
    FUSE round trip.
    """
    if pid <= 0:  # requests the kernel makes on nobody's behalf
        return DEFAULT_NODE
    chunks = [b"\0"]
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(fd)
    except OSError:  # the process is gone, or /proc hides it
        return DEFAULT_NODE
    data = b"".join(chunks)
    start = data.find(_NODE_KEY)
    if start < 0:
        return DEFAULT_NODE
    start += len(_NODE_KEY)
    end = data.find(b"\0", start)
    return data[start:end if end >= 0 else None].decode("utf-8", "replace") or DEFAULT_NODE


def metadata_ops(counts: Mapping[str, Mapping[str, int]], node: Optional[str] = None) -> int:
    """How many of ``counts`` (from :meth:`HostileMount.op_counts`) a metadata server would serve.

    Summed over every node, or for ``node`` only.
    """
    nodes = [node] if node is not None else list(counts)
    return sum(n for name in nodes for op, n in counts.get(name, {}).items() if op in METADATA_OPS)

