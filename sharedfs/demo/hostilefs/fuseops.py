"""The FUSE operations of one hostilefs mount: passthrough to the backing directory, bent by its profile."""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import stat
import struct
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from .nodeviews import _CloseToOpen, _Handle, _inode, _OpCounter, _Retired, _Shadow, _Visibility
from .profiles import _LOCK_ERRNO, FLAP_LOOKUPS, OPERATIONS, UNLOCK_ON_CLOSE, Profile, _PathLike, node_of_pid

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


