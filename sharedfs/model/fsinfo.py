"""The vocabulary for a mount and what its filesystem can do: :class:`Mount`, :class:`FsInfo`, mountinfo's lines."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import field, replace
from typing import Any

from sharedfs.model.structs import frozen

__all__ = [
    "KINDS",
    "LOCK_STATES",
    "MAGIC",
    "MOUNTINFO",
    "FsInfo",
    "Mount",
    "parse_mountinfo",
]

MOUNTINFO = "/proc/self/mountinfo"

#: ``statfs(2)`` ``f_type`` values of the filesystems sharedfs tells apart.
#: Kernel ones are from ``include/uapi/linux/magic.h``; Lustre, GPFS, BeeGFS
#: (ex-FhGFS) and ZFS are out of tree and their values are the ones their
#: clients set and coreutils ``stat -f`` knows (``S_MAGIC_*`` in ``stat.c``).
MAGIC: dict[str, int] = {
    "lustre": 0x0BD00BD0,  # LL_SUPER_MAGIC (lustre/llite)
    "gpfs": 0x47504653,  # "GPFS"
    "nfs": 0x6969,  # NFS_SUPER_MAGIC, NFSv2/3/4 alike
    "beegfs": 0x19830326,  # BEEGFS_MAGIC, formerly FHGFS
    "cephfs": 0x00C36400,  # CEPH_SUPER_MAGIC (kernel client; ceph-fuse is FUSE)
    "cifs": 0xFF534D42,  # CIFS_SUPER_MAGIC, "\xffSMB"
    "smb2": 0xFE534D42,  # SMB2_SUPER_MAGIC, "\xfeSMB" (SMB2/3 dialects)
    "fuse": 0x65735546,  # FUSE_SUPER_MAGIC (fuse.*, fuseblk, virtiofs)
    "overlay": 0x794C7630,  # OVERLAYFS_SUPER_MAGIC
    "tmpfs": 0x01021994,  # TMPFS_MAGIC
    "ext4": 0xEF53,  # EXT4_SUPER_MAGIC, shared by ext2 and ext3
    "xfs": 0x58465342,  # XFS_SUPER_MAGIC, "XFSB"
    "btrfs": 0x9123683E,  # BTRFS_SUPER_MAGIC
    "zfs": 0x2FC12FC1,  # ZFS (OpenZFS on Linux)
    "proc": 0x9FA0,  # PROC_SUPER_MAGIC
}

#: Values of :attr:`FsInfo.kind`.
KINDS = (
    "lustre",
    "gpfs",
    "nfs",
    "beegfs",
    "cephfs",
    "cifs",
    "juicefs",
    "moosefs",
    "glusterfs",
    "3fs",
    "bucket",
    "fuse",
    "overlay",
    "tmpfs",
    "local",
    "unknown",
)

#: Values of :attr:`FsInfo.flock` and :attr:`FsInfo.posix`:
#: ``coherent`` excludes every process that can reach the file (on a shared
#: filesystem: processes on all nodes); ``node-local`` succeeds but excludes
#: only processes on the same node; ``absent`` fails (see the ``*_errno`` field).
LOCK_STATES = ("coherent", "node-local", "absent")
COHERENT, NODE_LOCAL, ABSENT = LOCK_STATES


# --------------------------------------------------------------------------
# Mount


@frozen
class Mount:
    """One line of ``/proc/self/mountinfo`` (plus the ``statfs`` magic, if known).

    ``options`` merges the per-mount options (``rw,nosuid,relatime``) with the
    superblock options (``rw,flock,lazystatfs``; the superblock wins on a
    repeated key); a flag option maps to ``None``.  ``raw_options`` keeps both
    raw strings as ``"<per-mount>,<superblock>"``.  Treat ``options`` as
    read-only: it is excluded from the hash so a :class:`Mount` can key a cache.
    """

    mount_point: str
    fstype: str
    source: str = ""
    options: Mapping[str, str | None] = field(default_factory=dict, hash=False)
    raw_options: str = ""
    mount_id: int = -1
    device: str = ""
    magic: int | None = None
    root: str = "/"
    #: A FUSE client's own options (``mfsnobsdlocks``, ``--attr-cache=3``), which mountinfo never
    #: shows, read from the command line of the client's process (:func:`client_options`);
    #: ``None`` when it was not looked for or not found.
    client_options: Mapping[str, str | None] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        # A private copy: a caller mutating its dict must not change a frozen Mount.
        object.__setattr__(self, "options", dict(self.options))
        if self.client_options is not None:
            object.__setattr__(self, "client_options", dict(self.client_options))

    @property
    def read_only(self) -> bool:
        """True when the mount or its superblock is read-only."""
        return "ro" in self.options

    @property
    def subtype(self) -> str | None:
        """The part after the dot of ``fuse.<subtype>`` (``None`` otherwise)."""
        _, dot, sub = self.fstype.partition(".")
        return sub if dot and sub else None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (``magic_name`` is the :data:`MAGIC` key, if any)."""
        return {
            "mount_point": self.mount_point,
            "fstype": self.fstype,
            "source": self.source,
            "options": dict(self.options),
            "raw_options": self.raw_options,
            "mount_id": self.mount_id,
            "device": self.device,
            "magic": self.magic,
            "magic_name": magic_name(self.magic),
            "root": self.root,
            "client_options": None if self.client_options is None else dict(self.client_options),
        }


def magic_name(magic: int | None) -> str | None:
    """The :data:`MAGIC` key for ``magic``, or ``None``."""
    if magic is None:
        return None
    for name, value in MAGIC.items():
        if value == magic:
            return name
    return None


_OCTAL_ESCAPE = r"\\([0-7]{3})"  # compiled (and cached by re) when a mount point has an escape


def _unescape(text: str) -> str:
    r"""Undo the kernel's ``mangle()``: ``\040`` space, ``\011`` tab, ``\012``
    newline, ``\134`` backslash (and ``\043`` ``#`` on some kernels)."""
    if "\\" not in text:
        return text
    return re.sub(_OCTAL_ESCAPE, lambda m: chr(int(m.group(1), 8)), text)


def _split_options(text: str) -> list[str]:
    """Split a comma-separated option string, keeping commas inside double quotes.

    SELinux contexts are printed quoted because they contain commas, e.g.
    ``context="system_u:object_r:container_file_t:s0:c1,c2"``.
    """
    if '"' not in text:  # the common case: nothing quoted, a plain split says the same
        return [part for part in text.split(",") if part]
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part for part in parts if part]


def parse_options(*texts: str) -> dict[str, str | None]:
    options: dict[str, str | None] = {}
    for text in texts:
        for item in _split_options(text):
            key, eq, value = item.partition("=")
            options[key] = value if eq else None
    return options


def _parse_line(line: str) -> Mount:
    # Format (proc(5)):
    #   36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    #   (1)(2)(3)   (4)   (5)      (6)      (7)... (8) (9)   (10)         (11)
    # (7) is zero or more optional fields ended by the single "-" (8).  Paths
    # are escaped, so a literal " - " can only be that separator.
    left, sep, right = line.partition(" - ")
    if not sep:
        raise ValueError("no ' - ' separator")
    fields = left.split()
    mount_id, _parent_id, device, root, mount_point, mount_opts = fields[:6]
    # The source is printed as-is and may be empty ("tmpfs  rw"), so split on
    # single spaces rather than on runs of whitespace.
    right_fields = right.split(" ", 2)
    fstype = right_fields[0]
    source = right_fields[1] if len(right_fields) > 1 else ""
    super_opts = right_fields[2] if len(right_fields) > 2 else ""
    return Mount(
        mount_point=_unescape(mount_point),
        fstype=_unescape(fstype),
        source=_unescape(source),
        options=parse_options(mount_opts, super_opts),
        raw_options=f"{mount_opts},{super_opts}" if super_opts else mount_opts,
        mount_id=int(mount_id),
        device=device,
        root=_unescape(root),
    )


def parse_mountinfo(text: str, device: str | None = None) -> list[Mount]:
    """Parse the text of ``/proc/<pid>/mountinfo`` into mounts, in file order.

    File order matters: a later mount at the same mount point shadows an
    earlier one.  A line that does not parse is skipped rather than hiding
    every other mount (the kernel appends new fields as optional fields, which
    this parser already tolerates).  ``device`` (``"major:minor"``) keeps only
    that device's lines, which are then the only ones parsed: a node with
    hundreds of mounts pays for the one a lock is on.
    """
    mounts: list[Mount] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if device is not None:
            fields = line.split(None, 3)
            if len(fields) < 3 or fields[2] != device:
                continue
        try:
            mounts.append(_parse_line(line))
        except (ValueError, IndexError):
            continue
    return mounts


# --------------------------------------------------------------------------
# FsInfo


@frozen
class FsInfo:
    """What the filesystem holding a path can do, as far as locking is concerned.

    Produced by the ``sharedfs_classify_filesystem`` hook; the built-in answer
    comes from ``sharedfs.plugins.filesystem``.

    :param mount: the mount that was classified.
    :param kind: one of :data:`KINDS`.
    :param shared: visible from other nodes (an unknown filesystem is shared).
    :param flock: BSD ``flock(2)``: one of :data:`LOCK_STATES`.
    :param posix: POSIX ``fcntl``/``lockf`` record locks: one of :data:`LOCK_STATES`.
    :param o_excl_atomic: ``O_CREAT|O_EXCL`` is atomic across every process that
        sees the file (what an existence lock needs).
    :param flock_errno: the errno name ``flock`` fails with when ``absent``
        (``"ENOSYS"``, ``"ENOLCK"``), if known.
    :param posix_errno: likewise for POSIX locks.
    :param notes: plain-language sentences saying why.
    :param name: the filesystem's own name when it is known beyond its kind ("JuiceFS",
        "gcsfuse (a Cloud Storage bucket)"); ``status`` and ``doctor`` show it.
    :param hard_links: whether ``link(2)`` works there (``None``: not known).
    :param cache_seconds: the longest metadata cache timeout (seconds) this mount's clients keep on any
        node, as a site knows it (a site plugin): the next holder of a lock after one on another node
        waits that long where the client's own options cannot be read (docs/api.md, "What the next
        holder sees").  ``None``: not declared.
    """

    mount: Mount
    kind: str
    shared: bool
    flock: str
    posix: str
    o_excl_atomic: bool
    flock_errno: str | None = None
    posix_errno: str | None = None
    notes: tuple[str, ...] = ()
    name: str | None = None
    hard_links: bool | None = None
    cache_seconds: float | None = None

    def __post_init__(self) -> None:
        # Checked here so a site plugin's typo fails loudly instead of
        # silently reading as "not coherent".
        if self.kind not in KINDS:
            raise ValueError(f"FsInfo.kind={self.kind!r}; expected one of {', '.join(KINDS)}")
        for name in ("flock", "posix"):
            value = getattr(self, name)
            if value not in LOCK_STATES:
                raise ValueError(f"FsInfo.{name}={value!r}; expected one of {', '.join(LOCK_STATES)}")
        object.__setattr__(self, "notes", tuple(self.notes))
        seconds = self.cache_seconds
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not 0 <= seconds < float("inf")):
            raise ValueError(f"FsInfo.cache_seconds={seconds!r}; expected seconds (a number >= 0) or None")

    def with_refused(self, refused: Mapping[str, str]) -> FsInfo:
        """This classification corrected by what was seen at run time: ``{"flock": "ENOLCK"}``
        means a flock on this mount failed with ENOLCK, whatever the mount options promised."""
        changes: dict[str, Any] = {}
        notes = list(self.notes)
        for kind, errno_name in refused.items():
            changes[kind] = ABSENT
            changes[f"{kind}_errno"] = errno_name
            notes.append(f"{kind} failed with {errno_name} at run time on this mount.")
        return replace(self, notes=tuple(notes), **changes)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view."""
        return {
            "mount": self.mount.as_dict(),
            "kind": self.kind,
            "shared": self.shared,
            "flock": self.flock,
            "flock_errno": self.flock_errno,
            "posix": self.posix,
            "posix_errno": self.posix_errno,
            "o_excl_atomic": self.o_excl_atomic,
            "name": self.name,
            "hard_links": self.hard_links,
            "cache_seconds": self.cache_seconds,
            "notes": list(self.notes),
        }
