"""What each simulated node sees in the server: lagging entries, unflushed writes, lock shadows, stale handles."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from typing import Callable, Optional


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
