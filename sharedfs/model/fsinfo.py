"""Which mount holds a path, and the vocabulary for what its filesystem can do.

This module is the *mechanics*: it parses ``/proc/self/mountinfo``, asks
``statfs(2)`` for the superblock magic number, finds the mount containing a
path and, for a FUSE client, reads the options it runs with, which mountinfo never
shows (:func:`client_options`: its parameter file or its command line).  It also holds :data:`FUSE_CLIENTS`,
the one table of what each FUSE client's documentation says it does.  The
*rules* (what Lustre with ``localflock`` can do, why GPFS ``flock`` must not be
trusted, what a MooseFS mount's options change, ...) live in the ``filesystem``
plugin (``sharedfs.plugins.filesystem``), which turns a :class:`Mount` into an
:class:`FsInfo` through the ``sharedfs_classify_filesystem`` hook.

Stdlib only, and imported lazily (never at interpreter start): ``ctypes`` is
imported inside :func:`statfs_magic`, the only function that needs it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import field, replace
from typing import Any

from sharedfs.fs.safefile import read_untrusted
from sharedfs.model.structs import frozen

__all__ = [
    "FUSE_CLIENTS",
    "KINDS",
    "LOCK_STATES",
    "MAGIC",
    "MOUNTINFO",
    "FsInfo",
    "FuseClient",
    "Mount",
    "clear_mount_cache",
    "client_options",
    "fuse_client",
    "mount_for",
    "parse_mountinfo",
    "statfs_magic",
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


# --------------------------------------------------------------------------
# FUSE clients


@frozen
class FuseClient:
    """What one FUSE client's own documentation says it does (a row of :data:`FUSE_CLIENTS`).

    Lock states are those with the client's default options; ``local_flock`` / ``local_posix``
    name the options that make them node-local.  ``caches`` maps each option that sets a metadata
    cache timeout to its documented default (``None``: the client's own default, not stated here).
    """

    name: str
    kind: str
    fstypes: tuple[str, ...]
    flock: str
    posix: str
    hard_links: bool
    o_excl_atomic: bool
    #: Source prefixes of a mount that mountinfo shows as plain ``fuse`` (no subtype).
    sources: tuple[str, ...] = ()
    #: Its process names (argv[0] or, behind an interpreter, argv[1]): where its options are read.
    daemons: tuple[str, ...] = ()
    local_flock: tuple[str, ...] = ()
    local_posix: tuple[str, ...] = ()
    caches: tuple[tuple[str, str | None], ...] = ()
    #: A file at the mount's root where the client lists the parameters it runs with (MooseFS's
    #: ``.params``: its process title hides its command line); read instead of the command line.
    params_file: str = ""
    #: An object-store bucket: what one client creates is checked against that client's view only.
    bucket: bool = False
    docs: str = ""


#: The FUSE clients sharedfs knows, from each project's public documentation (``docs``):
#: JuiceFS "POSIX compatibility" (flock and POSIX record locks are global, hard links, atomic
#: metadata transactions) and `juicefs mount --help` (META CACHE); mfsmount(8) (global flock/fcntl
#: locks unless -o mfsnobsdlocks / mfsnoposixlocks, cache timeouts, mfsmount.cfg); GlusterFS's
#: features/locks translator (locks granted by the bricks) and mount.glusterfs(8); ceph-fuse(8)
#: (locks by the MDS, caches kept coherent by capabilities); 3FS's FUSE client (src/fuse/FuseOps.cc
#: implements link and create but no flock/getlk/setlk, so the kernel locks on this node only; its
#: caches are attr_timeout/entry_timeout/negative_timeout in the client's configuration file);
#: gcsfuse's troubleshooting page ("GCSFuse doesn't support hardlinks"), blobfuse2's README,
#: Mountpoint for Amazon S3's SEMANTICS.md ("POSIX file locks are not supported", "Hard links ...
#: are unsupported", no coordination between mounts; fsname "mountpoint-s3" without a subtype) and
#: s3fs's README ("no hard links", "no coordination between multiple clients").  A bucket client
#: has no lock handlers, so the kernel answers flock and fcntl for this node only.
FUSE_CLIENTS: tuple[FuseClient, ...] = (
    FuseClient("JuiceFS", "juicefs", ("fuse.juicefs",), COHERENT, COHERENT, True, True,
               sources=("JuiceFS:",), daemons=("juicefs",),
               caches=(("attr-cache", "1"), ("entry-cache", "1"), ("dir-entry-cache", "1"),
                       ("negative-entry-cache", "0")),
               docs="https://juicefs.com/docs/community/posix_compatibility"),
    FuseClient("MooseFS", "moosefs", ("fuse.mfs", "fuse.mfsmount", "fuse.moosefs"), COHERENT, COHERENT, True, True,
               sources=("mfs#",),
               local_flock=("mfsnobsdlocks",), local_posix=("mfsnoposixlocks",),
               caches=(("mfsattrcacheto", "1.0"), ("mfsentrycacheto", "0.0"), ("mfsdirentrycacheto", "1.0"),
                       ("mfsnegentrycacheto", "0.0")),
               params_file=".params",
               docs="https://github.com/moosefs/moosefs/blob/master/mfsmanpages/mfsmount.8"),
    FuseClient("GlusterFS", "glusterfs", ("fuse.glusterfs", "glusterfs"), COHERENT, COHERENT, True, True,
               daemons=("glusterfs",),
               caches=(("attribute-timeout", "1"), ("entry-timeout", "1"), ("negative-timeout", "0")),
               docs="https://docs.gluster.org/en/main/Administrator-Guide/Setting-Up-Clients/"),
    FuseClient("CephFS (ceph-fuse)", "cephfs", ("fuse.ceph-fuse", "fuse.ceph"), COHERENT, COHERENT, True, True,
               sources=("ceph-fuse",), daemons=("ceph-fuse",),
               docs="https://docs.ceph.com/en/latest/man/8/ceph-fuse/"),
    FuseClient("3FS", "3fs", ("fuse.hf3fs",), NODE_LOCAL, NODE_LOCAL, True, True,
               sources=("hf3fs",),
               caches=(("attr_timeout", None), ("entry_timeout", None), ("negative_timeout", None)),
               docs="https://github.com/deepseek-ai/3FS/blob/main/docs/design_notes.md"),
    FuseClient("gcsfuse (a Cloud Storage bucket)", "bucket", ("fuse.gcsfuse",), NODE_LOCAL, NODE_LOCAL, False, False,
               sources=("gcsfuse",), daemons=("gcsfuse",), caches=(("metadata-cache-ttl-secs", None),),
               bucket=True, docs="https://cloud.google.com/storage/docs/cloud-storage-fuse/overview"),
    FuseClient("blobfuse2 (an Azure Blob Storage container)", "bucket", ("fuse.blobfuse2",), NODE_LOCAL, NODE_LOCAL,
               False, False, sources=("blobfuse2",), daemons=("blobfuse2",), caches=(("attr-cache-timeout", None),),
               bucket=True, docs="https://github.com/Azure/azure-storage-fuse"),
    FuseClient("Mountpoint for Amazon S3 (an S3 bucket)", "bucket", ("fuse.mountpoint-s3",), NODE_LOCAL, NODE_LOCAL,
               False, False, sources=("mountpoint-s3",), daemons=("mount-s3",), caches=(("metadata-ttl", None),),
               bucket=True, docs="https://github.com/awslabs/mountpoint-s3/blob/main/doc/SEMANTICS.md"),
    FuseClient("s3fs (an S3 bucket)", "bucket", ("fuse.s3fs",), NODE_LOCAL, NODE_LOCAL, False, False,
               sources=("s3fs",), daemons=("s3fs",), caches=(("stat_cache_expire", None),),
               bucket=True, docs="https://github.com/s3fs-fuse/s3fs-fuse#limitations"),
)


def fuse_client(mount: Mount) -> FuseClient | None:
    """The :data:`FUSE_CLIENTS` row for ``mount``: by its fstype, or by its source when the fstype is plain ``fuse``."""
    fstype = mount.fstype.lower()
    for client in FUSE_CLIENTS:
        if fstype in client.fstypes:
            return client
    if fstype == "fuse":
        for client in FUSE_CLIENTS:
            if mount.source.startswith(client.sources):
                return client
    return None


#: Bytes read of a process's command line or of a client's option file (both are small; a cap
#: keeps a hostile one from costing more).
OPTIONS_CAP = 64 * 1024
#: setproctitle cuts a rewritten process title to this many bytes (``SPT_MAXTITLE`` in its C implementations,
#: which JuiceFS's Go port keeps): a title this long may have lost options at its end.
TITLE_CAP = 255


def _read_capped(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(OPTIONS_CAP)
    except OSError:
        return None


def _argv_options(args: list[str], valued: frozenset[str]) -> dict[str, str | None]:
    """``-o a,b=c`` / ``-oa,b`` / ``--key=value`` / ``--flag`` (and ``--key value`` for ``valued`` keys)."""
    options: dict[str, str | None] = {}
    args = list(args)
    while args:
        arg = args.pop(0)
        if arg == "-o" and args:
            options.update(_parse_options(args.pop(0)))
        elif arg.startswith("-o") and len(arg) > 2:
            options.update(_parse_options(arg[2:]))
        elif arg.startswith("--") and len(arg) > 2:
            key, eq, value = arg[2:].partition("=")
            if not eq and key in valued and args and not args[0].startswith("-"):
                value, eq = args.pop(0), "="
            options[key] = value if eq else None
    return options


def _params_file_options(mount: Mount, client: FuseClient) -> dict[str, str | None] | None:
    """The ``name: value`` lines of the client's parameter file (MooseFS: ``mfsnobsdlocks: (defined)``).

    MooseFS serves ``.params`` itself at its root (a name nobody can create, rename over or remove
    there), root-only (0400): another user gets ``None``, "cannot tell".
    """
    try:
        got = read_untrusted(os.path.join(mount.mount_point, client.params_file), OPTIONS_CAP)
    except OSError:
        return None
    if got is None or got[1].st_uid != 0:
        return None
    options: dict[str, str | None] = {}
    for line in got[0].decode("utf-8", "replace").splitlines():
        key, colon, value = line.partition(": ")
        value = value.strip()
        if colon and value != "(not defined)":
            options[key.strip()] = None if value == "(defined)" else value
    return options


def _names_mount(arg: str, mount_point: str) -> bool:
    return os.path.isabs(arg) and os.path.normpath(arg) in (mount_point, os.path.realpath(mount_point))


def client_options(mount: Mount, client: FuseClient) -> dict[str, str | None] | None:
    """The options the client serving ``mount`` runs with, or ``None`` where they cannot be seen.

    A client with a parameter file (MooseFS's ``.params``) is asked through it.  Otherwise
    mountinfo shows only the kernel's options; the client's own (``--attr-cache 3``) are on its
    command line.  A process counts when it runs one of the client's ``daemons``, names the mount
    point as an argument and belongs to the user who mounted it (the mount's ``user_id``): another
    user cannot pose as the client with a command line of her own.  Where several match, every
    option of each counts.  A client in another PID namespace (a container's sidecar) or behind
    ``hidepid`` is not seen, nor one whose rewritten title may have been cut (:data:`TITLE_CAP`): ``None``.
    """
    if client.params_file:
        return _params_file_options(mount, client)
    if not client.daemons:
        return None
    owner = mount.options.get("user_id") or "0"
    valued = frozenset(name for name, _ in client.caches)
    found: dict[str, str | None] | None = None
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            if str(os.stat(f"/proc/{pid}").st_uid) != owner:
                continue
        except OSError:
            continue
        raw = _read_capped(f"/proc/{pid}/cmdline")
        argv = [os.fsdecode(arg) for arg in raw.split(b"\0") if arg] if raw else []
        if len(argv) == 1:  # a process that rewrote its title (JuiceFS, hiding a password): one spaced string
            if len(os.fsencode(argv[0])) >= TITLE_CAP:
                continue  # perhaps cut short: an option cut off cannot be told from one never given
            argv = argv[0].split()
        if not any(os.path.basename(arg) in client.daemons for arg in argv[:2]):
            continue
        if not any(_names_mount(arg, mount.mount_point) for arg in argv[1:]):
            continue
        found = {**(found or {}), **_argv_options(argv[1:], valued)}
    return found


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


def _parse_options(*texts: str) -> dict[str, str | None]:
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
        options=_parse_options(mount_opts, super_opts),
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
# statfs


_statfs_fn: Any = None


def statfs_magic(path: str | os.PathLike[str]) -> int | None:
    """The ``f_type`` of ``statfs(path)`` (libc via ctypes), or ``None`` on failure.

    Python's ``os.statvfs`` does not expose ``f_type``, hence ctypes.  On a hung
    NFS server this call blocks like any other access to ``path``.
    """
    global _statfs_fn
    import ctypes

    if _statfs_fn is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            # statfs64 has the same layout on 64-bit and avoids EOVERFLOW on
            # 32-bit; musl >= 1.2.4 dropped the *64 names, hence the fallback.
            fn = getattr(libc, "statfs64", None) or libc.statfs
        except (OSError, AttributeError):
            _statfs_fn = False
            return None
        fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _statfs_fn = fn
    if _statfs_fn is False:
        return None
    # struct statfs is 120 bytes on x86-64/aarch64 and smaller elsewhere;
    # f_type is always its first member.
    buf = ctypes.create_string_buffer(256)
    try:
        if _statfs_fn(os.fsencode(path), buf) != 0:
            return None
    except (OSError, ValueError):  # ValueError: embedded NUL in path
        return None
    import platform

    # f_type is a `long` except on s390x, where it is an `unsigned int`.
    ctype = ctypes.c_uint if platform.machine() == "s390x" else ctypes.c_ulong
    # Magic numbers are 32-bit; mask so 0xFF534D42 stays positive everywhere.
    return ctype.from_buffer(buf).value & 0xFFFFFFFF


# --------------------------------------------------------------------------
# mount_for

# st_dev -> the mounts of that device (magic filled in), in mountinfo order.
_cache: dict[int, tuple[Mount, ...]] = {}


def clear_mount_cache() -> None:
    """Forget everything :func:`mount_for` learnt (call it after mounting or unmounting)."""
    _cache.clear()


def _nearest_existing(path: str) -> str:
    while True:
        try:
            os.stat(path)
            return path
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            # PermissionError: a component we may not search; its parent is
            # the closest thing we can stat.
            parent = os.path.dirname(path)
            if parent == path:
                return path
            path = parent


def _contains(mount_point: str, path: str) -> bool:
    if mount_point == "/":
        return True
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def _innermost(mounts: tuple[Mount, ...], path: str) -> Mount | None:
    """The mount with the longest mount point containing ``path``; the later wins a tie."""
    best: Mount | None = None
    for mount in mounts:
        if _contains(mount.mount_point, path) and (best is None or len(mount.mount_point) >= len(best.mount_point)):
            best = mount
    return best


def _read_mountinfo(device: str | None = None) -> list[Mount]:
    try:
        with open(MOUNTINFO, "rb") as f:
            # Paths are bytes; surrogateescape keeps undecodable ones usable with os.*.
            return parse_mountinfo(os.fsdecode(f.read()), device)
    except OSError:
        return []


def _with_client(mount: Mount) -> Mount:
    """``mount`` with its FUSE client's own options, where the client takes any (read once per device)."""
    client = fuse_client(mount)
    if client is None or not (client.daemons or client.params_file):
        return mount
    return replace(mount, client_options=client_options(mount, client))


def mount_for(path: str | os.PathLike[str]) -> Mount:
    """The mount containing ``path``.

    Symlinks are resolved (``realpath``); a path that does not exist yet is
    looked up through its nearest existing ancestor.  Among the mounts listed in
    ``/proc/self/mountinfo`` the ones whose device matches the ancestor's
    ``st_dev`` are preferred (this sees through a mount stacked *over* a
    directory that had mounts below it); then the longest mount point that
    contains the path wins, and a later mount shadows an earlier one at the
    same mount point.  Results are cached per ``st_dev``; call
    :func:`clear_mount_cache` (or ``mount_for.cache_clear()``) after mounts
    change.

    If mountinfo cannot be read (no ``/proc``), a synthetic mount with
    ``fstype="unknown"`` is returned so the caller still gets the conservative
    classification.
    """
    existing = _nearest_existing(os.path.realpath(os.fspath(path)))
    dev = os.stat(existing).st_dev
    mounts = _cache.get(dev)
    if mounts is None:
        device = f"{os.major(dev)}:{os.minor(dev)}"
        same_device = _read_mountinfo(device)
        magic = statfs_magic(existing)
        if same_device:
            mounts = tuple(_with_client(replace(m, magic=magic)) for m in same_device)
        else:
            # btrfs subvolumes (and a few others) report an st_dev that
            # mountinfo does not list: fall back to the plain prefix match.
            mounts = tuple(replace(m, magic=magic) for m in _read_mountinfo())
        if not mounts:
            mounts = (Mount(mount_point="/", fstype="unknown", device=device, magic=magic),)
        _cache[dev] = mounts
    found = _innermost(mounts, existing)
    if found is None:
        # Device matched but no mount point contains the path (a chroot or a
        # private mount namespace showing another view): use the whole table.
        found = _innermost(tuple(_read_mountinfo()), existing)
        if found is None:
            found = Mount(mount_point="/", fstype="unknown", magic=statfs_magic(existing))
        else:
            found = replace(found, magic=statfs_magic(existing))
    return found


mount_for.cache_clear = clear_mount_cache  # type: ignore[attr-defined]


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
