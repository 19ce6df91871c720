"""hostilefs: a FUSE passthrough filesystem that misbehaves like cluster filesystems.

It mirrors a backing directory onto a mount point and, depending on the
profile, breaks the things that break on Lustre, GPFS and NFS:

=================  ==========================================================
profile            behaviour
=================  ==========================================================
``plain``          honest passthrough; the kernel does local file locking
``lustre-noflock`` ``flock`` and POSIX (``fcntl``/``lockf``) locks fail with
                   ENOSYS (Lustre mounted without ``-o flock``)
``nfs-nolock``     the same locks fail with ENOLCK (NFS without lockd)
``localflock``     locks succeed but exclude only processes of the same
                   simulated node (GPFS, Lustre ``localflock``, NFS
                   ``local_lock``)
``lagging``        an entry created by one node stays invisible to the other
                   nodes for ``--lag-ms`` (lookup/open answer ENOENT, readdir
                   omits it) while mkdir / O_EXCL create of it answer EEXIST:
                   the NFS stale-cache state in which
                   ``os.makedirs(p, exist_ok=True)`` raises FileExistsError
``flapping``       ``lagging``, except that a listing of the directory shows the
                   other node's fresh entry and the next stat of it answers;
                   later ones say ENOENT again until the lag passes (MooseFS:
                   its client answers lookups from a negative-entry cache that
                   listing the directory does not clear)
``nfs-cto``        close-to-open consistency: while one node has a file open
                   for writing, the other nodes see its size and content as
                   of the writer's last close (empty for a file it created),
                   until the writer closes it (or fsyncs it)
``estale``         a file one node unlinks or renames over answers ESTALE to
                   the other nodes' open handles of it (read, fstat, close),
                   as NFS and GlusterFS answer a handle to a file another
                   client removed or replaced
=================  ==========================================================

Profiles combine with ``+``: ``lagging+localflock``, ``nfs-nolock+lagging``, ``nfs-cto+lagging``.
``--latency-ms N`` adds N ms to every metadata operation in any profile.
``--flush-ms N`` (``nfs-cto``) makes each ``close`` of a written file take N ms
before its data reaches the other nodes, as an NFS close waits for the server's
COMMIT: the window in which they read the file empty or short.

``--count-ops`` (``mount(..., count_ops=True)``) counts every operation the
server answers, per simulated node and per operation kind, so a test or a
benchmark can measure the load a workload puts on the (metadata) server:
:meth:`HostileMount.op_counts` asks the server over a Unix socket in its state
directory, and :func:`metadata_ops` sums the kinds a metadata server would
serve.  The kernel caches nothing of a hostilefs mount (every lookup reaches
the server), so the counts are an upper bound of what a caching client sends.

``nfs-cto`` fakes what NFS clients do with file data: a writer's data stays in
its node's page cache until ``close`` (or ``fsync``) sends it to the server, and
another node that opens the file meanwhile reads what the server has -- a file
copied in place (``shutil.copyfile``) reads empty or short there
(transformers#22555).  Every process of the writer's node sees the data at once
(one page cache per node).  An ``O_TRUNC`` open empties the file for every node
at once, as the SETATTR an NFS client sends for it does.  A single kernel's page
cache is coherent, so the profile opens the writer's files, and other nodes'
files while they are being written, with ``direct_io``: their reads and writes
reach the server, which answers each node with its own view.  (A shared ``mmap``
of such a file fails with ENODEV; files nobody writes are unaffected.)

A process's simulated node is the ``SHAREDFS_NODE_ID`` in its environment
(``default`` when unset).  The server reads it from ``/proc/<pid>/environ`` of
the caller of each operation, so every process started with a node environment
(see :mod:`sharedfs.testing.nodes`) behaves as if it ran on that node.

Files seeded directly in the *backing* directory are visible to every node at
once; files created through the mount are subject to ``lagging``.

Run the server by hand::

    python -m sharedfs.testing.hostilefs --profile localflock BACKING MOUNTPOINT

or, in tests, use :func:`mount` (or the ``hostile_mount`` pytest fixture),
which starts it in a subprocess and guarantees the mount goes away again.

This module is stdlib-only at import time; ``mfusepy`` (and libfuse) are only
imported by the server process.  Linux x86_64/aarch64 only.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import ctypes.util
import errno
import fcntl
import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Union

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
_LOCK_ERRNO = {"lustre-noflock": errno.ENOSYS, "nfs-nolock": errno.ENOLCK}

_PathLike = Union[str, "os.PathLike[str]"]

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


# --------------------------------------------------------------------------
# profiles
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# the filesystem (runs in the server process)
# --------------------------------------------------------------------------


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


class _Visibility:
    """Which simulated nodes may see freshly created entries (``lagging``).

    An entry is hidden from a node during ``lag_s`` after its creation unless
    that node created it (or created/opened it by name since).  Only entries
    made through the mount are tracked, so the table stays tiny: it is pruned
    whenever something new is recorded.
    """

    def __init__(self, lag_s: float, flap_lookups: int = 0) -> None:
        self.lag_s = lag_s
        self.flap_lookups = flap_lookups  # ``flapping``: lookups a listing lets through (0: not flapping)
        self._mu = threading.Lock()
        self._fresh: dict[str, tuple[float, set[str]]] = {}  # path -> (created, nodes that see it)
        self._primed: dict[tuple[str, str], int] = {}  # (path, node) -> lookups a listing let through
        self._newest = float("-inf")

    def active(self) -> bool:
        """Whether anything may be hidden: lets the common case skip the /proc read."""
        return time.monotonic() - self._newest < self.lag_s

    def hidden(self, path: str, caller_node: Callable[[], str]) -> bool:
        """Whether ``path`` is hidden from the calling node's lookups (``flapping``: a listing's pass used up).

        ``caller_node`` is only called for fresh entries: finding the node
        costs a /proc read, which most lookups need not pay.
        """
        node = self._hiding_from(path, caller_node)
        if node is None:
            return False
        with self._mu:
            left = self._primed.get((path, node), 0)
            if left:
                self._primed[(path, node)] = left - 1
        return not left

    def listed(self, path: str, caller_node: Callable[[], str]) -> bool:
        """Whether a listing shows ``path`` to the calling node (``flapping``: it does, and lets lookups through)."""
        node = self._hiding_from(path, caller_node)
        if node is None:
            return True
        if self.flap_lookups:
            with self._mu:
                self._primed[(path, node)] = self.flap_lookups
        return bool(self.flap_lookups)

    def _hiding_from(self, path: str, caller_node: Callable[[], str]) -> Optional[str]:
        """The calling node when ``path`` is fresh and that node has not learned it; else None."""
        with self._mu:
            entry = self._fresh.get(path)
        if entry is None or time.monotonic() - entry[0] >= self.lag_s:
            return None
        node = caller_node()
        return None if node in entry[1] else node

    def created(self, path: str, node: str) -> None:
        now = time.monotonic()
        with self._mu:
            for p in [p for p, (t, _) in self._fresh.items() if now - t >= self.lag_s]:
                del self._fresh[p]
            self._primed = {key: left for key, left in self._primed.items() if key[0] in self._fresh}
            self._fresh[path] = (now, {node})
            self._newest = now

    def learned(self, path: str, node: str) -> None:
        """``node`` just created/opened ``path`` by name, so its cache knows it."""
        with self._mu:
            entry = self._fresh.get(path)
            if entry is not None:
                entry[1].add(node)

    def removed(self, path: str) -> None:
        with self._mu:
            self._drop_tree(path)

    def renamed(self, old: str, new: str, node: str) -> None:
        """The target is new to every other node; moved children keep their age."""
        now = time.monotonic()
        with self._mu:
            self._drop_tree(new)
            for p in [p for p in self._fresh if p.startswith(old + "/")]:
                self._fresh[new + p[len(old):]] = self._fresh.pop(p)
            self._fresh.pop(old, None)
            self._fresh[new] = (now, {node})
            self._newest = now

    def _drop_tree(self, path: str) -> None:
        for p in [p for p in self._fresh if p == path or p.startswith(path + "/")]:
            del self._fresh[p]


class _Unflushed:
    """A file some node has open for writing (``nfs-cto``): what the server holds of it."""

    __slots__ = ("writers", "snapshot", "size", "mtime_ns")

    def __init__(self, snapshot: int, size: int, mtime_ns: int) -> None:
        self.writers: dict[str, int] = {}  # node -> its writing handles not closed yet
        self.snapshot = snapshot  # an unnamed file with the content as of the last close
        self.size = size
        self.mtime_ns = mtime_ns


class _CloseToOpen:
    """Which files are being written, by which nodes, and what the others see of them (``nfs-cto``).

    Keyed by inode, so a file renamed while open keeps its state.  An entry lives
    from the first writing open (or a write after the last flush) to the flush of
    the last writing handle: FUSE sends ``flush`` synchronously from ``close(2)``
    (``release`` may come later), which is when an NFS client sends the data.
    """

    def __init__(self, snapshot_dir: Optional[str]) -> None:
        self._mu = threading.Lock()
        self._files: dict[str, _Unflushed] = {}
        self._dir = snapshot_dir

    def __bool__(self) -> bool:
        return bool(self._files)  # the common case (nothing being written) skips every lookup

    def stale(self, inode: str, node: str) -> Optional[_Unflushed]:
        """The entry for ``inode`` if ``node`` does not write it (it sees the server's copy), else None."""
        with self._mu:
            entry = self._files.get(inode)
            return entry if entry is not None and node not in entry.writers else None

    def writing(self, inode: str, node: str, fd: int, new: bool) -> None:
        """``node`` starts writing through ``fd``; the others keep seeing the content it has now."""
        with self._mu:
            entry = self._files.get(inode)
            if entry is None:
                entry = self._files[inode] = self._snapshot(fd, empty=new)
            entry.writers[node] = entry.writers.get(node, 0) + 1

    def flushed(self, inode: str, node: str) -> None:
        """One of ``node``'s writing handles was closed: its data is the server's."""
        with self._mu:
            entry = self._files.get(inode)
            if entry is None or node not in entry.writers:
                return
            entry.writers[node] -= 1
            if entry.writers[node] <= 0:
                del entry.writers[node]
            if not entry.writers:
                del self._files[inode]
                os.close(entry.snapshot)

    def synced(self, inode: str, fd: int) -> None:
        """``fsync`` or a size change sent the data to the server: the others see it as it is now."""
        with self._mu:
            entry = self._files.get(inode)
            if entry is None:
                return
            fresh = self._snapshot(fd, empty=False)
            fresh.writers = entry.writers
            self._files[inode] = fresh
            os.close(entry.snapshot)

    def _snapshot(self, fd: int, empty: bool) -> _Unflushed:
        st = os.fstat(fd)
        snap = tempfile.TemporaryFile(dir=self._dir)
        copy = os.dup(snap.fileno())
        snap.close()  # the dup keeps the unnamed file
        if not empty:
            source = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)  # fd may be write-only
            try:
                offset = 0
                while True:
                    chunk = os.pread(source, 1 << 20, offset)
                    if not chunk:
                        break
                    os.pwrite(copy, chunk, offset)
                    offset += len(chunk)
            finally:
                os.close(source)
        size = os.fstat(copy).st_size
        return _Unflushed(copy, size, st.st_mtime_ns)

    @staticmethod
    def read(entry: _Unflushed, size: int, offset: int) -> bytes:
        return os.pread(entry.snapshot, size, offset)


class _Shadow:
    """An fd on a per-node shadow lock file; localflock takes the real lock on it.

    Closing an fd that another worker thread may still pass to a lock call
    would let the number be reused for an unrelated file, so closing is
    deferred until no call is using it (``busy``).
    """

    __slots__ = ("fd", "busy", "doomed")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.busy = 0
        self.doomed = False


class _Retired(Exception):
    """The shadow fd was retired (its file closed) before a lock call could use it."""


class _Handle:
    """One FUSE open file: the backing fd, its inode key, its flock mirror."""

    __slots__ = ("fd", "inode", "flock", "node", "writing", "stale")

    def __init__(self, fd: int, node: Optional[str] = None) -> None:
        st = os.fstat(fd)
        self.fd = fd
        self.inode = _inode(st)  # locks follow the inode across renames/links
        self.flock: Optional[_Shadow] = None
        # Who opened it (counted and nfs-cto mounts): the kernel releases files on nobody's behalf.
        self.node = node
        self.writing = False  # nfs-cto: its node has data the server has not got yet
        self.stale = False  # estale: another node removed or replaced its file


def _inode(st: os.stat_result) -> str:
    return f"{st.st_dev}-{st.st_ino}"


# struct flock on 64-bit Linux: short l_type, short l_whence, off_t l_start,
# off_t l_len, pid_t l_pid (+ padding to 32 bytes).
_FLOCK = struct.Struct("@hhqqi4x")
_UTIME_NOW = (1 << 30) - 1
_UTIME_OMIT = (1 << 30) - 2
# Metadata answers come from us on every call (no kernel caching), so that
# nodes cannot see each other's entries through the shared dentry cache.
_MOUNT_OPTIONS = dict(entry_timeout=0, attr_timeout=0, negative_timeout=0)


def _stat_dict(st: os.stat_result) -> dict[str, int]:
    return {
        "st_mode": st.st_mode,
        "st_ino": st.st_ino,
        "st_nlink": st.st_nlink,
        "st_uid": st.st_uid,
        "st_gid": st.st_gid,
        "st_size": st.st_size,
        "st_rdev": st.st_rdev,
        "st_blocks": st.st_blocks,
        "st_blksize": st.st_blksize,
        "st_atime": st.st_atime_ns,
        "st_mtime": st.st_mtime_ns,
        "st_ctime": st.st_ctime_ns,
    }


def _enoent() -> OSError:
    return OSError(errno.ENOENT, os.strerror(errno.ENOENT))


class _OpCounter:
    """Operations answered, per simulated node and per operation kind (``--count-ops``)."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {}

    def add(self, node: str, kind: str) -> None:
        with self._mu:
            per_node = self._counts.setdefault(node, {})
            per_node[kind] = per_node.get(kind, 0) + 1

    def snapshot(self, reset: bool = False) -> dict[str, dict[str, int]]:
        """The counts so far; ``reset`` starts a new window in the same step (nothing falls between two)."""
        with self._mu:
            counts = {node: dict(ops) for node, ops in self._counts.items()}
            if reset:
                self._counts = {}
        return counts


def _serve_control(path: str, counter: _OpCounter) -> None:
    """Answer ``stats`` / ``reset`` requests on the Unix socket ``path`` with the counts as one JSON line.

    A socket, not a signal: the main thread sits in libfuse's C loop, where no Python
    signal handler runs.  The socket lives in the server's private state directory.
    """
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)

    def loop() -> None:
        # Process-directed signals stay for the main thread, where libfuse's handler ends its loop.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
        while True:
            conn, _ = server.accept()
            with conn:
                try:
                    request = conn.makefile("rb").readline().strip()
                    if request not in (b"stats", b"reset"):
                        conn.sendall(b'{"error": "unknown request"}\n')
                        continue
                    conn.sendall(json.dumps(counter.snapshot(reset=request == b"reset")).encode() + b"\n")
                except OSError:
                    pass  # the client went away; the next one is served

    threading.Thread(target=loop, name="hostilefs-control", daemon=True).start()


class HostileOps:
    """mfusepy operations (used with ``raw_fi=True``) for one hostilefs mount.

    Not an ``mfusepy.Operations`` subclass on purpose: mfusepy only looks up
    the methods it finds, and this keeps the module importable without
    mfusepy/libfuse.  Missing methods (``lock``/``flock`` set to None) are
    left out of the libfuse table, so the kernel handles them itself.
    """

    use_ns = True  # mfusepy: timestamps as integer nanoseconds
    flag_utime_omit_ok = 1  # libfuse2: utimens understands UTIME_NOW/UTIME_OMIT

    def __init__(
        self,
        backing: _PathLike,
        profile: Profile,
        *,
        lag_ms: float = 2000,
        latency_ms: float = 0,
        shadow_dir: _PathLike,
        context: Any = None,
        count_ops: bool = False,
        snapshot_dir: Optional[str] = None,
        flush_ms: float = 0,
    ) -> None:
        self.root = os.path.realpath(backing)
        self.profile = profile
        self.latency_s = latency_ms / 1000.0
        self.vis = _Visibility(lag_ms / 1000.0, FLAP_LOOKUPS if profile.flapping else 0) if profile.lagging else None
        self.cto = _CloseToOpen(snapshot_dir) if profile.cto else None
        self.flush_s = flush_ms / 1000.0
        self.shadow_dir = str(shadow_dir)
        self._context = context or (lambda: (0, 0, 0))  # mfusepy.fuse_get_context
        self._mu = threading.Lock()
        self._handles: dict[int, _Handle] = {}
        self._next_handle = 1
        self._posix: dict[tuple[str, int], _Shadow] = {}  # (inode key, lock owner)
        self._i_am_root = os.geteuid() == 0
        if profile.locks == "plain":
            # No handlers at all: libfuse then does not ask for remote locking
            # and the kernel locks locally, across every process of the host.
            # mfusepy checks for each handler whether it is None (the documented way to leave one out).
            self.flock = None  # type: ignore[assignment,method-assign]
            self.lock = None  # type: ignore[assignment,method-assign]
        elif profile.locks in _LOCK_ERRNO:
            self.flock = self._refuse_lock  # type: ignore[assignment,method-assign]
            self.lock = self._refuse_lock  # type: ignore[assignment,method-assign]
        self.counter: Optional[_OpCounter] = _OpCounter() if count_ops else None
        if self.counter is not None:
            for name in OPERATIONS:
                method = getattr(self, name, None)
                if method is not None:  # flock/lock stay None under "plain": the kernel locks
                    setattr(self, name, self._counted(name, method))

    # ---- counting (--count-ops) -------------------------------------------

    def _counted(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` counting each call (``wraps`` keeps the signature, which mfusepy inspects)."""
        counter = self.counter
        assert counter is not None

        @functools.wraps(method)
        def counted(*args: Any, **kwargs: Any) -> Any:
            # In the worker thread serving the caller, where the FUSE context names it.
            counter.add(self._counted_node(name, args), self._counted_kind(name, args))
            return method(*args, **kwargs)

        return counted

    def _counted_node(self, name: str, args: tuple[Any, ...]) -> str:
        if name == "release":  # sent by the kernel on nobody's behalf: the opener's node
            handle = self._handles.get(args[1].fh) if len(args) > 1 else None
            if handle is not None and handle.node is not None:
                return handle.node
        return self._caller_node()

    @staticmethod
    def _counted_kind(name: str, args: tuple[Any, ...]) -> str:
        if name == "lock" and len(args) > 3:
            lk = args[3].contents
            if args[2] != fcntl.F_GETLK and lk.l_type == fcntl.F_UNLCK and lk.l_start == 0 and lk.l_len == 0:
                return UNLOCK_ON_CLOSE
        return name

    # ---- helpers -------------------------------------------------------

    def _real(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _caller_node(self) -> str:
        return node_of_pid(self._context()[2])

    def _meta(self) -> None:
        """Every metadata operation pays the configured latency."""
        if self.latency_s:
            time.sleep(self.latency_s)

    def _check_visible(self, path: str) -> None:
        if self.vis is not None and self.vis.active() and self.vis.hidden(path, self._caller_node):
            raise _enoent()

    def _created(self, path: str, real: str) -> None:
        uid, gid, pid = self._context()
        if self.vis is not None:
            self.vis.created(path, node_of_pid(pid))
        if self._i_am_root and uid:
            # The server runs as root: hand new entries to the caller, like a
            # real filesystem would, so non-root tests see their own files.
            try:
                os.lchown(real, uid, gid)
            except OSError:
                pass

    def _new_handle(self, fd: int, node: Optional[str] = None) -> int:
        if node is None and (self.counter is not None or self.profile.estale):
            node = self._caller_node()
        h = _Handle(fd, node)
        with self._mu:
            fh = self._next_handle
            self._next_handle += 1
            self._handles[fh] = h
        return fh

    def _handle(self, fi: Any) -> _Handle:
        # Handles are never reused, so a request racing a release gets EBADF
        # instead of reaching a newer file that happens to share an fd number.
        h = self._handles.get(fi.fh)
        if h is None:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        if h.stale:
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))
        return h

    def _going(self, path: str) -> Optional[str]:
        """estale: the inode at ``path`` before an unlink or a rename over it (``None``: nothing there)."""
        if not self.profile.estale:
            return None
        try:
            return _inode(os.lstat(self._real(path)))
        except OSError:
            return None

    def _gone(self, inode: Optional[str]) -> None:
        """estale: other nodes' open handles of the removed or replaced ``inode`` answer ESTALE from now on."""
        if inode is None:
            return
        node = self._caller_node()
        with self._mu:
            for h in self._handles.values():
                if h.inode == inode and h.node != node:
                    h.stale = True

    # ---- namespace and attributes --------------------------------------

    def getattr(self, path: Optional[str], fi: Any = None) -> dict[str, int]:
        self._meta()
        if fi is not None:
            h = self._handle(fi)
            return self._as_seen(os.fstat(h.fd), h.node)
        assert path is not None  # libfuse passes a path whenever no file handle is given
        self._check_visible(path)
        return self._as_seen(os.lstat(self._real(path)))

    def _as_seen(self, st: os.stat_result, node: Optional[str] = None) -> dict[str, int]:
        """``st`` as the calling node sees it: the server's size and mtime of a file another node writes."""
        attrs = _stat_dict(st)
        if self.cto:
            entry = self.cto.stale(_inode(st), node or self._caller_node())
            if entry is not None:
                attrs.update(st_size=entry.size, st_blocks=(entry.size + 511) // 512, st_mtime=entry.mtime_ns)
        return attrs

    def readdir(self, path: str, fh: int) -> list[Any]:
        self._meta()
        self._check_visible(path)
        vis = self.vis if self.vis is not None and self.vis.active() else None
        caller_node = functools.lru_cache(maxsize=None)(self._caller_node)  # read /proc at most once
        entries: list[Any] = [".", ".."]
        with os.scandir(self._real(path)) as it:
            for entry in it:
                # libfuse2 parks open-but-unlinked files as .fuse_hidden*; an
                # artifact of this test filesystem, not of the emulated one.
                if entry.name.startswith(".fuse_hidden"):
                    continue
                child = path.rstrip("/") + "/" + entry.name
                if vis is not None and not vis.listed(child, caller_node):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                entries.append((entry.name, {"st_mode": st.st_mode, "st_ino": st.st_ino}, 0))
        return entries

    def readlink(self, path: str) -> str:
        self._meta()
        self._check_visible(path)
        return os.readlink(self._real(path))

    def mknod(self, path: str, mode: int, dev: int) -> int:
        self._meta()
        real = self._real(path)
        os.mknod(real, mode, dev)
        self._created(path, real)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self._meta()
        real = self._real(path)
        os.mkdir(real, mode)  # EEXIST even when the name is hidden from the caller
        self._created(path, real)
        return 0

    def symlink(self, target: str, source: str) -> int:
        # mfusepy's naming: create ``target`` pointing at ``source``.
        self._meta()
        real = self._real(target)
        os.symlink(source, real)
        self._created(target, real)
        return 0

    def link(self, target: str, source: str) -> int:
        self._meta()
        real = self._real(target)
        os.link(self._real(source), real)
        self._created(target, real)
        return 0

    def unlink(self, path: str) -> int:
        self._meta()
        going = self._going(path)
        os.unlink(self._real(path))
        self._gone(going)
        if self.vis is not None:
            self.vis.removed(path)
        return 0

    def rmdir(self, path: str) -> int:
        self._meta()
        os.rmdir(self._real(path))
        if self.vis is not None:
            self.vis.removed(path)
        return 0

    def rename(self, old: str, new: str) -> int:
        self._meta()
        # libfuse unlinks an open file, or one a rename replaces, by renaming it to .fuse_hiddenXXXX first.
        going = self._going(old if os.path.basename(new).startswith(".fuse_hidden") else new)
        os.rename(self._real(old), self._real(new))
        self._gone(going)
        if self.vis is not None:
            self.vis.renamed(old, new, self._caller_node())
        return 0

    def chmod(self, path: str, mode: int) -> int:
        self._meta()
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._meta()
        os.lchown(self._real(path), uid, gid)
        return 0

    def truncate(self, path: Optional[str], length: int, fi: Any = None) -> int:
        self._meta()
        if fi is not None:
            fd = self._handle(fi).fd
            os.ftruncate(fd, length)
            if self.cto:
                self.cto.synced(_inode(os.fstat(fd)), fd)  # a SETATTR: the server has the new size
        else:
            assert path is not None  # libfuse passes a path whenever no file handle is given
            os.truncate(self._real(path), length)
            if self.cto:
                fd = os.open(self._real(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    self.cto.synced(_inode(os.fstat(fd)), fd)
                finally:
                    os.close(fd)
        return 0

    def utimens(self, path: str, times: Optional[tuple[int, int]] = None) -> int:
        self._meta()
        real = self._real(path)
        if times is None:
            os.utime(real, follow_symlinks=False)
            return 0
        atime, mtime = times
        if _UTIME_OMIT in (atime, mtime) or _UTIME_NOW in (atime, mtime):
            st, now = os.lstat(real), time.time_ns()
            atime = now if atime == _UTIME_NOW else st.st_atime_ns if atime == _UTIME_OMIT else atime
            mtime = now if mtime == _UTIME_NOW else st.st_mtime_ns if mtime == _UTIME_OMIT else mtime
        os.utime(real, ns=(atime, mtime), follow_symlinks=False)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        self._meta()
        sv = os.statvfs(self._real(path))
        keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                "f_favail", "f_flag", "f_namemax")
        return {k: getattr(sv, k) for k in keys}

    # ---- files ---------------------------------------------------------

    def open(self, path: str, fi: Any) -> int:
        self._meta()
        self._check_visible(path)
        fd = os.open(self._real(path), fi.flags | os.O_CLOEXEC)
        if self.cto is None:
            fi.fh = self._new_handle(fd)
        else:
            self._open_cto(fd, fi, new=False)
        return 0

    def _open_cto(self, fd: int, fi: Any, new: bool) -> None:
        """nfs-cto: a writing handle keeps its data from the other nodes until it is closed."""
        assert self.cto is not None
        node = self._caller_node()
        fi.fh = self._new_handle(fd, node)
        h = self._handle(fi)
        if fi.flags & os.O_ACCMODE != os.O_RDONLY and stat.S_ISREG(os.fstat(fd).st_mode):
            self.cto.writing(h.inode, node, fd, new)
            h.writing = True
            fi.direct_io = 1  # the writes reach us, not the one page cache every "node" shares
        elif self.cto.stale(h.inode, node) is not None:
            fi.direct_io = 1  # the reads reach us, who answer with the server's copy

    def create(self, path: str, mode: int, fi: Any) -> int:
        self._meta()
        real = self._real(path)
        existed = os.path.lexists(real)
        # fi.flags carries the caller's O_EXCL: a hidden-but-existing name
        # answers EEXIST here, just as on a stale NFS client.
        fd = os.open(real, fi.flags | os.O_CREAT | os.O_CLOEXEC, mode)
        if not existed:
            self._created(path, real)
        elif self.vis is not None:
            self.vis.learned(path, self._caller_node())
        if self.cto is None:
            fi.fh = self._new_handle(fd)
        else:
            self._open_cto(fd, fi, new=not existed)
        return 0

    def read(self, path: Optional[str], size: int, offset: int, fi: Any) -> bytes:
        h = self._handle(fi)
        if self.cto and h.node is not None:
            entry = self.cto.stale(h.inode, h.node)
            if entry is not None:
                return self.cto.read(entry, size, offset)
        return os.pread(h.fd, size, offset)

    def write(self, path: Optional[str], data: bytes, offset: int, fi: Any) -> int:
        h = self._handle(fi)
        if self.cto is not None and not h.writing and h.node is not None:
            # Written again after a close of a duplicate: unflushed again, the others see what is there now.
            self.cto.writing(h.inode, h.node, h.fd, new=False)
            h.writing = True
        return os.pwrite(h.fd, data, offset)

    def flush(self, path: Optional[str], fi: Any) -> int:
        if self.profile.estale:
            self._handle(fi)  # ESTALE from close(2), as GlusterFS answers after another client's rename-over
        if self.cto is not None:
            h = self._handle(fi)
            if h.writing and self.flush_s:
                time.sleep(self.flush_s)  # sending the data; the other nodes still see the server's copy
            self._flushed(h)
        return 0

    def _flushed(self, h: _Handle) -> None:
        """nfs-cto: ``close(2)`` sends the data to the server (FUSE's flush is synchronous, release is not)."""
        if self.cto is not None and h.writing and h.node is not None:
            h.writing = False
            self.cto.flushed(h.inode, h.node)

    def fsync(self, path: Optional[str], datasync: int, fi: Any) -> int:
        h = self._handle(fi)
        fd = h.fd
        os.fdatasync(fd) if datasync else os.fsync(fd)
        if self.cto is not None and h.writing:
            self.cto.synced(h.inode, fd)
        return 0

    def release(self, path: Optional[str], fi: Any) -> int:
        with self._mu:
            h = self._handles.pop(fi.fh, None)
        if h is None:
            return 0
        self._flushed(h)  # a writer that never flushed (none should): its data reaches the server now
        if h.flock is not None:  # closing the file drops its flock, as on any fs
            self._discard(h.flock)
        os.close(h.fd)
        return 0

    # ---- locks ---------------------------------------------------------
    #
    # The kernel sends flock(2) as FUSE_SETLK[W] with the FLOCK flag, which
    # libfuse hands to ``flock(path, fi, op)``; the owner is the open file
    # description, i.e. our handle.  POSIX locks arrive as ``lock(path, fi,
    # cmd, struct flock *)`` with ``fi.lock_owner`` identifying the process;
    # on every close() libfuse also calls ``lock(F_SETLK, F_UNLCK whole
    # file)`` for that owner, and on the last close of a flock'ed file it
    # calls ``flock(LOCK_UN)`` before ``release``.  Both end by retiring the
    # shadow fd; a request still parked in a blocking wait on it (its caller
    # was killed) closes it as soon as it returns, releasing what it got.

    def _refuse_lock(self, *args: Any) -> int:
        code = _LOCK_ERRNO[self.profile.locks]
        raise OSError(code, os.strerror(code))

    def _shadow(self, node: str, inode: str) -> _Shadow:
        """Open ``node``'s shadow lock file for ``inode``.

        Each node has its own shadow directory, hence no exclusion across
        nodes, while different handles of one node lock the same file.
        """
        node_dir = os.path.join(self.shadow_dir, node.encode().hex() or "00")
        os.makedirs(node_dir, exist_ok=True)
        name = os.path.join(node_dir, inode)
        return _Shadow(os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))

    @contextmanager
    def _using(self, shadow: _Shadow) -> Iterator[int]:
        """Borrow ``shadow.fd`` for one lock call; _Retired if it was retired."""
        with self._mu:
            if shadow.doomed:
                raise _Retired()
            shadow.busy += 1
        try:
            yield shadow.fd
        finally:
            with self._mu:
                shadow.busy -= 1
                close = shadow.doomed and shadow.busy == 0
            if close:
                os.close(shadow.fd)

    def _discard(self, shadow: _Shadow) -> None:
        """Close ``shadow`` (dropping its locks) once no lock call uses it."""
        with self._mu:
            shadow.doomed = True
            close = shadow.busy == 0
        if close:
            os.close(shadow.fd)

    def flock(self, path: Optional[str], fi: Any, op: int) -> int:  # localflock
        h = self._handle(fi)
        if h.flock is None:
            if op & fcntl.LOCK_UN:
                return 0
            shadow = self._shadow(self._caller_node(), h.inode)
            with self._mu:
                if h.flock is None:
                    h.flock, shadow = shadow, None  # type: ignore[assignment]  # None: the race was won
            if shadow is not None:  # another thread won the race
                os.close(shadow.fd)
        try:
            with self._using(h.flock) as fd:
                # A blocking request blocks this worker thread, exactly where
                # the caller waits; libfuse starts more workers for the rest.
                fcntl.flock(fd, op)
        except _Retired:  # the file was released meanwhile
            raise OSError(errno.EBADF, os.strerror(errno.EBADF)) from None
        return 0

    def _posix_shadow(self, key: tuple[str, int], create: bool) -> Optional[_Shadow]:
        with self._mu:
            shadow = self._posix.get(key)
        if shadow is None and create:
            new = self._shadow(self._caller_node(), key[0])
            with self._mu:
                shadow = self._posix.setdefault(key, new)
            if shadow is not new:  # another thread of the owner was quicker
                os.close(new.fd)
        return shadow

    def lock(self, path: Optional[str], fi: Any, cmd: int, lockp: Any) -> int:  # localflock
        lk = lockp.contents
        key = (self._handle(fi).inode, fi.lock_owner)  # the owner is the calling process
        unlock = lk.l_type == fcntl.F_UNLCK and cmd != fcntl.F_GETLK
        if unlock and lk.l_start == 0 and lk.l_len == 0:
            # Whole file, as libfuse sends on every close(): retire the fd,
            # which drops all of this owner's locks on the file at once.
            with self._mu:
                shadow = self._posix.pop(key, None)
            if shadow is not None:
                self._discard(shadow)
            return 0
        # OFD locks on the shadow fd: owned by that fd, not by this server
        # process, so the mirrors of two callers really conflict.
        ofd = {fcntl.F_GETLK: fcntl.F_OFD_GETLK, fcntl.F_SETLK: fcntl.F_OFD_SETLK,
               fcntl.F_SETLKW: fcntl.F_OFD_SETLKW}[cmd]
        arg = _FLOCK.pack(lk.l_type, os.SEEK_SET, lk.l_start, lk.l_len, 0)
        while True:
            shadow = self._posix_shadow(key, create=not unlock)
            if shadow is None:  # unlocking a range nothing was locked in
                return 0
            try:
                with self._using(shadow) as fd:
                    res = fcntl.fcntl(fd, ofd, arg)
                break
            except _Retired:  # a close() in another thread retired it: start afresh
                continue
        if cmd == fcntl.F_GETLK:
            l_type, _, start, length, _ = _FLOCK.unpack(res)
            lk.l_type = l_type
            if l_type != fcntl.F_UNLCK:
                lk.l_whence, lk.l_start, lk.l_len, lk.l_pid = os.SEEK_SET, start, length, 0
        return 0


# --------------------------------------------------------------------------
# server entry point
# --------------------------------------------------------------------------


def _may_allow_other() -> bool:
    """``allow_other`` needs root, or ``user_allow_other`` in /etc/fuse.conf."""
    if os.geteuid() == 0:
        return True
    try:
        with open("/etc/fuse.conf", encoding="utf-8") as f:
            return any(line.strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def _exit_when_orphaned(mountpoint: str, state_dir: str, poll_s: float = 0.5) -> None:
    """Unmount, clean up and exit once the process that started us is gone.

    Protects against stale mounts when a test run is killed: SIGTERM makes
    libfuse leave its loop and unmount; lazy unmount + exit is the fallback.
    Nobody is left to remove ``state_dir``, so we do.
    """
    parent = os.getppid()

    def watch() -> None:
        # Keep process-directed signals for the main thread, where libfuse's
        # handler interrupts its wait loop.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
        while os.getppid() == parent:
            time.sleep(poll_s)
        atexit.register(shutil.rmtree, state_dir, ignore_errors=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # a worker stuck in a lock wait keeps libfuse from exiting
        _detach(mountpoint)
        shutil.rmtree(state_dir, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def serve(
    backing: str,
    mountpoint: str,
    profile: str,
    *,
    lag_ms: float = 2000,
    latency_ms: float = 0,
    debug: bool = False,
    state_dir: Optional[str] = None,
    exit_with_parent: bool = False,
    count_ops: bool = False,
    flush_ms: float = 0,
) -> int:
    """Mount and serve in the foreground until unmounted or signalled.

    ``state_dir`` receives localflock's per-node shadow lock files (under
    ``locks/``); without it a private temporary directory is used and
    removed at exit.  ``exit_with_parent`` unmounts when the parent dies.
    ``count_ops`` counts operations per node and kind, served on
    ``state_dir/control.sock`` (see :meth:`HostileMount.op_counts`).
    """
    prof = parse_profile(profile)
    try:
        import mfusepy
    except ImportError:
        print("hostilefs: mfusepy is not installed: pip install mfusepy", file=sys.stderr)
        return 3
    except OSError as exc:  # mfusepy cannot find or load libfuse
        print(f"hostilefs: cannot load libfuse ({exc}): apt-get install libfuse2 (or libfuse3-3)",
              file=sys.stderr)
        return 3

    os.umask(0)  # the kernel already applied the caller's umask to modes
    own_state_dir = state_dir is None
    if state_dir is None:
        state_dir = tempfile.mkdtemp(prefix="hostilefs-")
    ops = HostileOps(backing, prof, lag_ms=lag_ms, latency_ms=latency_ms,
                     shadow_dir=os.path.join(state_dir, "locks"), context=mfusepy.fuse_get_context,
                     count_ops=count_ops, snapshot_dir=state_dir, flush_ms=flush_ms)
    if ops.counter is not None:
        _serve_control(os.path.join(state_dir, CONTROL_SOCKET), ops.counter)
    options: dict[str, Any] = dict(
        _MOUNT_OPTIONS,
        foreground=True,
        nothreads=False,  # blocking lock requests park a worker thread each
        allow_other=_may_allow_other(),  # other uids (tests dropping privileges) may use it
        default_permissions=True,  # the kernel checks modes (no FUSE_ACCESS), like a real fs
        fsname=f"hostilefs-{prof.name}",
        subtype="hostilefs",
        use_ino=True,
        debug=debug,
    )
    if mfusepy.fuse_version_major >= 3:
        # libfuse3 caps its worker pool at 10 threads by default, and 10
        # callers blocked in lock waits would stall the whole mount.  (3.14
        # also prints a harmless "Ignoring invalid max threads value".)
        options["max_threads"] = 256
    if exit_with_parent:
        _exit_when_orphaned(mountpoint, state_dir)
    try:
        mfusepy.FUSE(ops, mountpoint, raw_fi=True, **options)
    except RuntimeError as exc:
        # libfuse3 records the signal that ended the loop as a session error,
        # so fuse_main() reports a plain SIGTERM stop as 8 ("event loop
        # error"); mount failures use other codes.
        if not (mfusepy.fuse_version_major >= 3 and exc.args == (8,)):
            raise
    finally:
        if own_state_dir:
            shutil.rmtree(state_dir, ignore_errors=True)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sharedfs.testing.hostilefs", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="plain", help=f"one of {', '.join(PROFILES)}, combinable with '+'")
    parser.add_argument("--lag-ms", type=float, default=2000, help="visibility lag of the lagging profile")
    parser.add_argument("--latency-ms", type=float, default=0, help="added to every metadata operation")
    parser.add_argument("--flush-ms", type=float, default=0,
                        help="nfs-cto: how long a close of a written file takes before other nodes see its data")
    parser.add_argument("--debug", action="store_true", help="libfuse debug output on stderr")
    parser.add_argument("--state-dir", help="directory for lock shadow files (default: private temp dir)")
    parser.add_argument("--exit-with-parent", action="store_true",
                        help="unmount (and remove --state-dir) when the parent process dies")
    parser.add_argument("--count-ops", action="store_true",
                        help=f"count operations per simulated node and kind (served on STATE_DIR/{CONTROL_SOCKET})")
    parser.add_argument("backing")
    parser.add_argument("mountpoint")
    args = parser.parse_args(argv)
    try:
        parse_profile(args.profile)
    except ValueError as exc:
        parser.error(str(exc))
    return serve(args.backing, args.mountpoint, args.profile, lag_ms=args.lag_ms, latency_ms=args.latency_ms,
                 debug=args.debug, state_dir=args.state_dir, exit_with_parent=args.exit_with_parent,
                 count_ops=args.count_ops, flush_ms=args.flush_ms)


# --------------------------------------------------------------------------
# mount helpers (run in the test process)
# --------------------------------------------------------------------------


class FuseUnavailable(RuntimeError):
    """FUSE cannot work on this machine; ``str(exc)`` says why and what to install."""


class HostileMountError(RuntimeError):
    """hostilefs failed to start for a reason other than missing FUSE support."""


def _libfuse_path() -> Optional[str]:
    # The same search mfusepy does.
    return (os.environ.get("FUSE_LIBRARY_PATH") or ctypes.util.find_library("fuse")
            or ctypes.util.find_library("fuse3"))


@functools.lru_cache(maxsize=None)
def fuse_available() -> tuple[bool, str]:
    """``(True, "...")`` if hostilefs can probably mount here, else ``(False, reason)``.

    Checks the static prerequisites; mount permission itself shows only when
    mounting, where :func:`mount` raises :class:`FuseUnavailable`.
    """
    if not sys.platform.startswith("linux"):
        return False, f"hostilefs needs Linux FUSE (this is {sys.platform})"
    if not os.path.exists("/dev/fuse"):
        return False, ("/dev/fuse does not exist: no FUSE in this kernel or container "
                       "(containers need --device /dev/fuse --cap-add SYS_ADMIN)")
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return False, f"cannot open /dev/fuse: {exc.strerror}"
    if importlib.util.find_spec("mfusepy") is None:
        return False, "mfusepy is not installed: pip install mfusepy"
    if not _libfuse_path():
        return False, "libfuse not found: apt-get install libfuse2 (or libfuse3-3)"
    if os.geteuid() != 0 and not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return False, "mounting FUSE as non-root needs fusermount: apt-get install fuse3"
    return True, "FUSE is available"


def _unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts() -> list[tuple[str, str, str]]:
    """``(mount point, fstype, source)`` for every mount, from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) >= 5 and len(rfields) >= 2:
                out.append((_unescape_mountinfo(fields[4]), rfields[0], _unescape_mountinfo(rfields[1])))
    return out


def is_mounted(path: _PathLike, fstype: Optional[str] = None) -> bool:
    """Whether ``path`` is a mount point (of ``fstype``, if given)."""
    # abspath, not realpath: resolving a dead FUSE mount would fail or hang.
    target = os.path.abspath(path)
    return any(mp == target and (fstype is None or ft == fstype) for mp, ft, _ in _mounts())


def _detach(path: _PathLike) -> None:
    """Lazily unmount ``path`` (works while busy or after the server died)."""
    path = os.fspath(path)
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.umount2(os.fsencode(path), 2) == 0:  # MNT_DETACH
            return
    for cmd in (["fusermount3", "-u", "-z", path], ["fusermount", "-u", "-z", path], ["umount", "-l", path]):
        if shutil.which(cmd[0]):
            if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
                return


def _classify_failure(log: str, returncode: int) -> Exception:
    """Turn the server's dying words into FuseUnavailable or HostileMountError."""
    text = log.strip() or f"(no output, exit code {returncode})"
    lowered = text.lower()
    if "mfusepy is not installed" in lowered or "no module named 'mfusepy'" in lowered:
        return FuseUnavailable("mfusepy is not installed: pip install mfusepy")
    if "cannot load libfuse" in lowered or "unable to find libfuse" in lowered:
        return FuseUnavailable(f"libfuse unusable: {text}")
    if "device not found" in lowered or "/dev/fuse" in lowered:
        return FuseUnavailable(f"FUSE device unusable: {text}")
    if "not permitted" in lowered or "permission denied" in lowered or "fusermount" in lowered:
        return FuseUnavailable(f"mounting FUSE is not permitted here: {text}")
    return HostileMountError(f"hostilefs exited with code {returncode}:\n{text}")


_LIVE: "set[HostileMount]" = set()
_SCRIPT = Path(__file__).resolve()


class HostileMount:
    """A running hostilefs mount; unmounts on :meth:`unmount` or context exit.

    ``path`` is the mount point, ``backing`` the real directory behind it
    (write there to seed files every node sees at once).
    """

    def __init__(self, path: Path, backing: Path, profile: str, lag_ms: float, latency_ms: float,
                 process: "subprocess.Popen[bytes]", state_dir: str, count_ops: bool = False) -> None:
        self.path = path
        self.backing = backing
        self.profile = profile
        self.lag_ms = lag_ms
        self.latency_ms = latency_ms
        self.process = process
        self.state_dir = state_dir  # server.log + localflock shadow files; removed on unmount
        self.count_ops = count_ops
        self._log_text: Optional[str] = None
        self._closed = False

    def __repr__(self) -> str:
        state = "unmounted" if self._closed else "mounted"
        return f"<HostileMount {self.profile} {self.path} ({state}, pid {self.process.pid})>"

    def __enter__(self) -> "HostileMount":
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()

    @property
    def mounted(self) -> bool:
        return not self._closed and is_mounted(self.path, FSTYPE)

    def log(self) -> str:
        """The server's stdout/stderr so far (useful in assertion messages)."""
        if self._log_text is not None:
            return self._log_text
        try:
            with open(os.path.join(self.state_dir, "server.log"), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def op_counts(self, reset: bool = False) -> dict[str, dict[str, int]]:
        """``{node: {operation: count}}`` of every operation served so far (``count_ops=True`` mounts only).

        ``reset=True`` returns the counts and starts from zero in the same step, so consecutive
        calls measure back-to-back windows without losing an operation in between.  Operations
        the kernel makes on nobody's behalf count under node ``default``.
        """
        if not self.count_ops:
            raise HostileMountError(f"{self} counts no operations: mount it with count_ops=True")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(30)
            conn.connect(os.path.join(self.state_dir, CONTROL_SOCKET))
            conn.sendall(b"reset\n" if reset else b"stats\n")
            answer = conn.makefile("rb").readline()
        counts = json.loads(answer)
        if "error" in counts:
            raise HostileMountError(f"hostilefs control socket: {counts['error']}")
        return counts

    def unmount(self, grace: float = 2.0) -> None:
        """Unmount and stop the server. Idempotent; never leaves a stale mount.

        SIGTERM lets libfuse unmount and exit (~15 ms).  A server with a
        worker still parked in a blocking lock cannot finish that way, so
        after ``grace`` seconds the mount is detached lazily and the server
        killed; callers still inside it then get ECONNABORTED.
        """
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        proc = self.process
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    pass
            if is_mounted(self.path):
                _detach(self.path)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if is_mounted(self.path):
                _detach(self.path)
        finally:
            self._log_text = self.log()
            shutil.rmtree(self.state_dir, ignore_errors=True)


def mount(
    backing: _PathLike,
    mountpoint: _PathLike,
    profile: str = "plain",
    *,
    lag_ms: float = 2000,
    latency_ms: float = 0,
    timeout: float = 10.0,
    debug: bool = False,
    count_ops: bool = False,
    flush_ms: float = 0,
) -> HostileMount:
    """Mount hostilefs over ``backing`` at ``mountpoint`` and wait until it serves.

    Both directories are created if missing.  ``count_ops`` counts every operation per
    simulated node and kind (read them with :meth:`HostileMount.op_counts`); ``flush_ms`` is ``nfs-cto``'s
    time a close of a written file takes to reach the other nodes.  Raises :class:`FuseUnavailable`
    when FUSE cannot work here and :class:`HostileMountError` for other
    failures.  The server runs as ``sys.executable .../hostilefs.py`` (by
    path, so a half-written ``sharedfs/__init__.py`` cannot break it), in
    its own session, and unmounts itself if the calling process dies.
    """
    parse_profile(profile)  # fail fast on typos
    ok, reason = fuse_available()
    if not ok:
        raise FuseUnavailable(reason)
    backing_p = Path(os.path.realpath(backing))
    mnt = Path(os.path.realpath(mountpoint))
    backing_p.mkdir(parents=True, exist_ok=True)
    if is_mounted(mnt, FSTYPE):  # left over from a killed run
        _detach(mnt)
    elif is_mounted(mnt):
        raise HostileMountError(f"{mnt} is already a mount point")
    mnt.mkdir(parents=True, exist_ok=True)

    state_dir = tempfile.mkdtemp(prefix="hostilefs-")
    cmd = [sys.executable, str(_SCRIPT), "--profile", profile, "--lag-ms", str(lag_ms),
           "--latency-ms", str(latency_ms), "--state-dir", state_dir, "--exit-with-parent"]
    if flush_ms:
        cmd += ["--flush-ms", str(flush_ms)]
    if debug:
        cmd.append("--debug")
    if count_ops:
        if len(os.fsencode(os.path.join(state_dir, CONTROL_SOCKET))) >= 108:  # sun_path, NUL included
            shutil.rmtree(state_dir, ignore_errors=True)
            raise HostileMountError(f"the control socket path under {state_dir} is too long for a Unix socket: "
                                    "point TMPDIR at a shorter directory")
        cmd.append("--count-ops")
    cmd += [str(backing_p), str(mnt)]
    env = {k: v for k, v in os.environ.items()
           if k not in (NODE_ENV, "SHAREDFS_FAULT_PREFIXES")}  # the server is nobody's node
    with open(os.path.join(state_dir, "server.log"), "wb") as log:
        # New session: a terminal Ctrl-C must not kill the server before the
        # test process has unmounted.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    m = HostileMount(mnt, backing_p, profile, lag_ms, latency_ms, proc, state_dir, count_ops)
    _LIVE.add(m)
    deadline = time.monotonic() + timeout
    try:
        while not is_mounted(mnt, FSTYPE):
            rc = proc.poll()
            if rc is not None:
                raise _classify_failure(m.log(), rc)
            if time.monotonic() > deadline:
                raise HostileMountError(f"hostilefs did not mount {mnt} within {timeout}s:\n{m.log()}")
            time.sleep(0.02)
        os.stat(mnt)  # first request: returns once the server answers
        if count_ops:
            m.op_counts(reset=True)  # the socket is bound before the mount serves; start from zero
    except BaseException:
        m.unmount()
        raise
    return m


def metadata_ops(counts: Mapping[str, Mapping[str, int]], node: Optional[str] = None) -> int:
    """How many of ``counts`` (from :meth:`HostileMount.op_counts`) a metadata server would serve.

    Summed over every node, or for ``node`` only.
    """
    nodes = [node] if node is not None else list(counts)
    return sum(n for name in nodes for op, n in counts.get(name, {}).items() if op in METADATA_OPS)


@atexit.register
def _unmount_all() -> None:
    for m in list(_LIVE):
        m.unmount()


if __name__ == "__main__":
    sys.exit(main())
