"""Built-in plugin: what each cluster filesystem can do for locking, from the mount alone, each rule with its source.

Where options cannot tell, it answers with the weaker claim; it is ``trylast`` so a site's plugin answers first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from sharedfs.types import (
    ABSENT,
    COHERENT,
    MAGIC,
    NODE_LOCAL,
    FsInfo,
    FuseClient,
    Mount,
    fuse_client,
    hookimpl,
    magic_name,
)

__all__ = ["classify", "sharedfs_classify_filesystem"]


# Filesystems only this node can see.  A lock that excludes every process on
# the node excludes everyone, so they count as local.
_BLOCK_FS = ("ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "jfs", "reiserfs", "bcachefs", "nilfs2")
_MEDIA_FS = ("vfat", "msdos", "exfat", "ntfs", "ntfs3", "hfs", "hfsplus", "udf", "iso9660", "squashfs", "erofs")
_MEMORY_FS = ("ramfs", "devtmpfs")
_PSEUDO_FS = ("proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "hugetlbfs", "debugfs", "tracefs")
_PSEUDO_FS_2 = ("securityfs", "pstore", "bpf", "configfs", "efivarfs", "binfmt_misc", "fusectl")
_LOCAL_FSTYPES = frozenset(_BLOCK_FS + _MEDIA_FS + _MEMORY_FS + _PSEUDO_FS + _PSEUDO_FS_2)


@hookimpl(trylast=True)  # the built-in rule: a site plugin's plain @hookimpl answers first
def sharedfs_classify_filesystem(mount: Mount) -> FsInfo | None:
    """Hook implementation: the built-in classification (always answers)."""
    return classify(mount)


def classify(mount: Mount) -> FsInfo:
    """Classify ``mount`` by its fstype, falling back to the statfs magic."""
    fstype = mount.fstype.lower()
    rule = _BY_FSTYPE.get(fstype)
    client = fuse_client(mount) if rule is None else None
    if client is not None:
        # A FUSE client named by its subtype (or, mounted as plain "fuse", by its source: old
        # ceph-fuse builds, Mountpoint for Amazon S3): what its documentation says it does.
        return _fuse_client(mount, client)
    if rule is None and (fstype.startswith("fuse.") or fstype in ("fuse", "virtiofs")):
        rule = _fuse
    if rule is None and fstype in _LOCAL_FSTYPES:
        rule = _local
    if rule is None and mount.magic is not None:
        # An fstype we do not know (a vendor rename, or no mountinfo at all):
        # the superblock magic still names the filesystem.
        rule = _BY_MAGIC.get(mount.magic)
    return (rule or _unknown)(mount)


def _info(mount: Mount, kind: str, shared: bool, flock: str, posix: str, o_excl_atomic: bool, *notes: str,
          **more: Any) -> FsInfo:
    """One classification: who sees the files, what each lock does there, whether O_EXCL is atomic, and why."""
    return FsInfo(mount=mount, kind=kind, shared=shared, flock=flock, posix=posix, o_excl_atomic=o_excl_atomic,
                  notes=notes, **more)


# --------------------------------------------------------------------------
# Shared filesystems


def _lustre(mount: Mount) -> FsInfo:
    # mount.lustre(8): "flock" = coherent across clients, "localflock" =
    # client-local only, "noflock" = applications get ENOSYS.  llite's
    # ll_show_options() prints ",flock" or ",localflock" whenever the flag is
    # set -- including builds configured with flock on by default
    # (CONFIG_ENABLE_FLOCK in ll_init_sbi) -- and prints nothing for noflock.
    # The noflock file_operations route both .flock and .lock to
    # ll_file_noflock, so POSIX locks fail alike.
    opts = mount.options
    if "localflock" in opts:
        # The silent failure: both nodes "hold" the lock (filelock#389 shows it on GPFS).
        return _info(mount, "lustre", True, NODE_LOCAL, NODE_LOCAL, True,
                     "Lustre mounted with localflock: flock succeeds but excludes only "
                     "processes on the same node (POSIX fcntl locks likewise).")
    if "flock" in opts:
        return _info(mount, "lustre", True, COHERENT, COHERENT, True,
                     "Lustre mounted with flock: flock and POSIX locks are granted by "
                     "the Lustre lock manager and exclude processes on every client.")
    # filelock >= 3.10.5 turns this ENOSYS into NotImplementedError
    # (datasets#6395); older filelock spun forever (filelock#67).
    return _info(mount, "lustre", True, ABSENT, ABSENT, True,
                 "Lustre mounted without flock or localflock: flock and POSIX locks "
                 "fail with ENOSYS (Function not implemented).", flock_errno="ENOSYS", posix_errno="ENOSYS")


def _gpfs(mount: Mount) -> FsInfo:
    # IBM Storage Scale keeps flock() on the node but arbitrates fcntl()
    # byte-range locks across the cluster: filelock#389 (two nodes holding a
    # filelock.FileLock at once) and ibm-granite/granite.build#322.
    return _info(mount, "gpfs", True, NODE_LOCAL, COHERENT, True,
                 "GPFS (IBM Storage Scale): flock succeeds but excludes only processes "
                 "on the same node; POSIX fcntl locks exclude across nodes.")


def _nfs_version(mount: Mount) -> str:
    # The kernel always prints vers= (nfs_show_mount_options); the fstype is
    # the fallback for hand-written Mounts.
    vers = mount.options.get("vers") or mount.options.get("nfsvers")
    if vers:
        return vers
    return "4" if mount.fstype.lower() == "nfs4" else "3"


def _nfs(mount: Mount) -> FsInfo:
    opts = mount.options
    vers = _nfs_version(mount)
    major = vers.split(".")[0]
    # nfs_show_mount_options() always prints local_lock=none|flock|posix|all,
    # for every NFS version.  "nolock" makes the kernel set both local-lock
    # flags (fs/nfs/fs_context.c, Opt_lock negated), i.e. local_lock=all:
    # locks then *succeed* and exclude only this client (nfs(5), "lock /
    # nolock").  Kernels before 2.6.37 print no local_lock, hence the fallback.
    local_lock = opts.get("local_lock") or ("all" if "nolock" in opts else "none")
    if local_lock not in ("none", "flock", "posix", "all"):
        local_lock = "all"  # a value this code does not know: trust neither lock
    flock_local = local_lock in ("flock", "all")
    posix_local = local_lock in ("posix", "all")
    notes = []
    if local_lock != "none":
        # realiti4/claude-swap#372: two nodes on local_lock=all overlapped
        # in 2653 of 2829 acquisitions.
        which = {"all": "flock and POSIX locks", "flock": "flock", "posix": "POSIX fcntl locks"}
        cause = f"local_lock={local_lock}"
        if "nolock" in opts:
            cause = "nolock (which implies local_lock=all)"
        notes.append(
            f"NFS mounted with {cause}: {which[local_lock]} succeed but exclude only processes on this client."
        )
    if not flock_local:
        # flock(2) NOTES: since Linux 2.6.12 NFS emulates flock() with a POSIX
        # lock on the whole file, sent to the server.
        notes.append(
            "NFS emulates flock with a whole-file POSIX byte-range lock sent to the "
            "server, so it excludes across clients (and conflicts with fcntl locks "
            "on the same file)."
        )
    if major in ("2", "3") and not (flock_local and posix_local):
        # NFSv2/3 locks go through the separate NLM protocol (lockd + rpc.statd).
        # When those are not running or are firewalled, lock calls fail with
        # ENOLCK "No locks available" (datasets#1672, DataBiosphere/toil#4846);
        # filelock's soft-lock fallback does not catch ENOLCK.
        notes.append(
            f"NFSv{major} locks need the NLM side protocol (lockd and rpc.statd); "
            "if either is down, lock calls fail with ENOLCK - run `sharedfs doctor` "
            "to test this mount."
        )
    # open(2): O_EXCL is atomic on NFS only with NFSv3 or later (on Linux >= 2.6).
    o_excl = major not in ("2",)
    if not o_excl:
        notes.append("NFSv2 cannot create a file exclusively: O_CREAT|O_EXCL is not atomic.")
    return _info(mount, "nfs", True, NODE_LOCAL if flock_local else COHERENT,
                 NODE_LOCAL if posix_local else COHERENT, o_excl, *notes)


def _beegfs(mount: Mount) -> FsInfo:
    # The BeeGFS client handles flock/fcntl in the local kernel unless
    # beegfs-client.conf sets tuneUseGlobalFileLocks=true (default false).
    # That setting is not a mount option (the client's mount options are
    # cfgFile, sysMgmtdHost, logLevel, ...), so it is invisible here.
    cfg = mount.options.get("cfgFile") or "beegfs-client.conf"
    return _info(mount, "beegfs", True, NODE_LOCAL, NODE_LOCAL, True,
                 "BeeGFS: flock and POSIX locks exclude across nodes only if "
                 f"{cfg} sets tuneUseGlobalFileLocks=true (the default is false), "
                 "which the mount does not show; assumed node-local. A site plugin "
                 "can declare them coherent.")


def _cephfs(mount: Mount) -> FsInfo:
    # Both the kernel client (fs/ceph/locks.c: ceph_lock, ceph_flock) and
    # ceph-fuse send flock and fcntl requests to the MDS, which arbitrates
    # them for every client.
    client = "ceph-fuse" if mount.fstype.lower() != "ceph" else "kernel client"
    return _info(mount, "cephfs", True, COHERENT, COHERENT, True,
                 f"CephFS ({client}): flock and POSIX locks are granted by the metadata server and exclude "
                 "across nodes.")


def _cifs(mount: Mount) -> FsInfo:
    # flock(2) NOTES: up to Linux 5.4 flock() is not propagated over SMB
    # (local only); since 5.5 it is emulated with an SMB byte-range lock on
    # the whole file.  The kernel version is not part of the mount, so flock
    # is taken as node-local.  fcntl locks go to the server as byte-range
    # locks unless the mount says "nobrl" (mount.cifs(8)), which keeps them
    # on the client.
    nobrl = "nobrl" in mount.options
    notes = [
        ("SMB/CIFS: flock is shared with the server only on Linux 5.5 or later and is assumed node-local."),
    ]
    if nobrl:
        notes.append(
            "Mounted with nobrl: POSIX fcntl locks are not sent to the server and exclude only processes on this node."
        )
    else:
        notes.append(
            "POSIX fcntl locks are sent to the server as byte-range locks and "
            "exclude across clients. SMB byte-range locks are mandatory: while one "
            "is held, reading or writing the locked range through another open "
            "file fails with EACCES."
        )
    return _info(mount, "cifs", True, NODE_LOCAL, NODE_LOCAL if nobrl else COHERENT, True, *notes)


def _fuse(mount: Mount) -> FsInfo:
    sub = mount.subtype or mount.fstype
    if mount.fstype.lower() == "fuseblk":
        # fuseblk is a FUSE driver over a local block device (ntfs-3g, exfat-fuse).
        return _info(mount, "fuse", False, COHERENT, COHERENT, True,
                     "FUSE over a local block device (fuseblk): only this node sees it, "
                     "so the kernel's node-wide locks exclude everyone.")
    # A FUSE daemon without lock handlers gets the kernel's local locking,
    # which excludes only this host (checked here with
    # mfusepy); with handlers, it may say anything.  Whether a daemon creates
    # files exclusively is also up to it (object-store gateways often cannot),
    # and NFS/FUSE show the lock-file unlink race of webdataset#386.
    return _info(mount, "fuse", True, NODE_LOCAL, NODE_LOCAL, False,
                 f"FUSE filesystem '{sub}': treated as shared with no trustworthy lock; "
                 "the kernel handles its locks on this node only unless the daemon "
                 "implements them, and O_EXCL is as atomic as the daemon makes it.")


def _fuse_client(mount: Mount, client: FuseClient) -> FsInfo:
    """A FUSE client of :data:`~sharedfs.model.mounts.FUSE_CLIENTS`: its documented facts, then the options
    it was started with (which mountinfo never shows: they are read from its command line)."""
    options = mount.client_options
    flock, posix = client.flock, client.posix
    notes = [_client_locks(client)]
    for kind, switches in (("flock", client.local_flock), ("POSIX locks", client.local_posix)):
        if not switches:
            continue
        if options is None:
            # The weaker claim: a MooseFS mounted with mfsnobsdlocks would let two nodes hold one lock.
            hidden = (f"its {client.params_file} at the mount's root is readable by root only" if client.params_file
                      else "its client runs in another container or PID namespace, or /proc hides it")
            notes.append(f"Whether {client.name} runs with {' or '.join(switches)} (which makes {kind} node-local) "
                         f"cannot be seen here ({hidden}): {kind} assumed node-local; a site plugin can declare it "
                         "coherent.")
        elif any(switch in options for switch in switches):
            verb = "succeeds but excludes" if kind == "flock" else "succeed but exclude"
            notes.append(f"{client.name} mounted with {' / '.join(s for s in switches if s in options)}: {kind} "
                         f"{verb} only processes on the same node.")
        else:
            continue
        flock, posix = (NODE_LOCAL, posix) if kind == "flock" else (flock, NODE_LOCAL)
    if client.bucket:
        notes.append("No hard links, and a file created with O_EXCL is checked against this client's own view "
                     "only: no lock, marker or exclusive create excludes another node there.")
    elif not client.hard_links:
        notes.append(f"{client.name} has no hard links.")
    if client.caches:
        notes.append(_client_caches(client, options))
    return _info(mount, client.kind, True, flock, posix, client.o_excl_atomic, *notes,
                 name=client.name, hard_links=client.hard_links)


def _client_locks(client: FuseClient) -> str:
    if client.flock == COHERENT:
        return (f"{client.name}: flock and POSIX locks are granted by the filesystem's servers and exclude "
                "processes on every client (with its default options).")
    return (f"{client.name}: its FUSE client has no lock handlers, so the kernel grants flock and POSIX locks for "
            "this node only.")


def _client_caches(client: FuseClient, options: Mapping[str, str | None] | None) -> str:
    """Its metadata cache timeouts: as started (when its command line was read), else the defaults."""
    if options is None:  # not readable by this user: the handover line says what is waited instead
        names = ", ".join(name for name, _ in client.caches)
        return (f"{client.name} metadata caches ({names}): cannot be read here; another node's new names, "
                "removals and sizes can take that long to show here.")
    seen = options
    parts = []
    for name, default in client.caches:
        value = seen.get(name)
        parts.append(f"{name}={value}" if value is not None else
                     f"{name}={default} (default)" if default is not None else f"{name} (its default)")
    return (f"{client.name} metadata caches (seconds): {', '.join(parts)}; another node's new names, removals "
            "and sizes can take that long to show here.")


# --------------------------------------------------------------------------
# Local and unknown filesystems


def _local_info(mount: Mount, kind: str, what: str) -> FsInfo:
    return _info(mount, kind, False, COHERENT, COHERENT, True,
                 f"{what}: only this node sees it, so flock and POSIX locks exclude every process that can reach "
                 "the file.")


def _overlay(mount: Mount) -> FsInfo:
    # Container root filesystems: overlayfs over local layers.
    return _local_info(mount, "overlay", "Overlay filesystem (container layers on this node)")


def _tmpfs(mount: Mount) -> FsInfo:
    return _local_info(mount, "tmpfs", "tmpfs (memory of this node)")


def _local(mount: Mount) -> FsInfo:
    name = mount.fstype
    if name in ("", "unknown"):  # reached through the statfs magic
        name = magic_name(mount.magic) or name
    return _local_info(mount, "local", f"Local filesystem '{name}'")


def _unknown(mount: Mount) -> FsInfo:
    # The hookspec's rule: an unknown filesystem is shared with no trustworthy lock.
    return _info(mount, "unknown", True, NODE_LOCAL, NODE_LOCAL, False,
                 f"Unknown filesystem '{mount.fstype}': treated as shared, with no lock "
                 "trusted to exclude other nodes and O_EXCL not assumed atomic.")


_BY_FSTYPE: dict[str, Callable[[Mount], FsInfo]] = {
    "lustre": _lustre,
    "gpfs": _gpfs,
    "nfs": _nfs,
    "nfs4": _nfs,
    "beegfs": _beegfs,
    "fhgfs": _beegfs,  # BeeGFS's name before 2014
    "ceph": _cephfs,
    "cifs": _cifs,
    "smb3": _cifs,  # the same kernel driver, mounted with `mount -t smb3`
    "fuseblk": _fuse,
    "overlay": _overlay,
    "tmpfs": _tmpfs,
}

_BY_MAGIC: dict[int, Callable[[Mount], FsInfo]] = {
    MAGIC["lustre"]: _lustre,
    MAGIC["gpfs"]: _gpfs,
    MAGIC["nfs"]: _nfs,
    MAGIC["beegfs"]: _beegfs,
    MAGIC["cephfs"]: _cephfs,
    MAGIC["cifs"]: _cifs,
    MAGIC["smb2"]: _cifs,
    MAGIC["fuse"]: _fuse,
    MAGIC["overlay"]: _overlay,
    MAGIC["tmpfs"]: _tmpfs,
    MAGIC["ext4"]: _local,
    MAGIC["xfs"]: _local,
    MAGIC["btrfs"]: _local,
    MAGIC["zfs"]: _local,
    MAGIC["proc"]: _local,
}
