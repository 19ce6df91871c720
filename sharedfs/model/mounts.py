"""Which mount holds a path (mountinfo, ``statfs(2)``), and what its FUSE client's documentation and options say.

On every activation's path, so stdlib only: ``ctypes`` is imported only inside :func:`statfs_magic`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from sharedfs.fs.safefile import read_untrusted
from sharedfs.model.fsinfo import COHERENT, MOUNTINFO, NODE_LOCAL, Mount, parse_mountinfo, parse_options
from sharedfs.model.structs import frozen

__all__ = ["FUSE_CLIENTS", "OPTIONS_CAP", "TITLE_CAP", "FuseClient", "clear_mount_cache", "client_options",
           "fuse_client", "mount_for", "statfs_magic"]

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


#: The FUSE clients sharedfs knows, each row from its project's public documentation (``docs``;
#: the sources are linked in docs/filesystems.md).  A bucket client has no lock handlers, so the
#: kernel answers flock and fcntl for this node only.
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
            options.update(parse_options(args.pop(0)))
        elif arg.startswith("-o") and len(arg) > 2:
            options.update(parse_options(arg[2:]))
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
