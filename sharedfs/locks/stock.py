"""A lock file held the way stock filelock (``filelock.FileLock``, without sharedfs) holds it on its filesystem.

So programs without sharedfs are excluded from a framework's lock file too (docs/architecture.md, "Locks")."""

from __future__ import annotations

import errno
import os
import re
import uuid

from sharedfs.fs.polledfile import NO_LINKS, create_unlinked, replace_foreign, unlink_quietly
from sharedfs.fs.recordfile import create_record, identity, unlink_if_same
from sharedfs.fs.safefile import read_untrusted

__all__ = ["EXISTENCE", "FLOCK", "StockLockFile", "stock_mechanism"]

FLOCK = "flock"
EXISTENCE = "existence"
#: How stock filelock locks a file in each directory probed so far (stock_mechanism).
_mechanisms: dict[str, str | None] = {}
#: Names of the second link a sharedfs holder keeps to an existence lock file it created: ``lock.<hex>.sharedfs``.
_TWIN = re.compile(r"\.[0-9a-f]{32}\.sharedfs\Z")


def stock_mechanism(directory: str) -> str | None:
    """How stock filelock (``FileLock``, as torch without sharedfs takes it) holds a lock file in ``directory``.

    ``"flock"`` where flock works (filelock's Unix lock; the file stays after release);
    ``"existence"`` where flock answers ENOSYS (filelock >= 3.24 falls back to ``SoftFileLock``
    there: the lock is the file's existence, created ``O_EXCL``); ``None`` where flock fails
    otherwise (ENOLCK: NFS without lockd), where filelock raises before it holds anything, so
    no process without sharedfs holds such a file.  Asked once per directory, of a file of
    sharedfs's own (creating the lock file itself would take the lock where existence is the lock).
    Raises :class:`FileNotFoundError` while ``directory`` does not exist.
    """
    if directory in _mechanisms:
        return _mechanisms[directory]
    import fcntl

    probe = os.path.join(directory, f".sharedfs-probe-{uuid.uuid4().hex}")
    fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        mechanism: str | None = FLOCK
    except OSError as exc:
        mechanism = EXISTENCE if exc.errno == errno.ENOSYS else None
    finally:
        os.close(fd)
        unlink_quietly(probe)
    _mechanisms[directory] = mechanism
    return mechanism


class StockLockFile:
    """A lock file (torch's own ``<build_dir>/lock``), held the way stock filelock holds it on its filesystem.

    ``flock``: an exclusive flock of the file, which stays on disk (as filelock leaves it).
    ``existence``: the file itself, made as a hard link of a complete record in filelock's
    own format (``<pid>\\n<host>\\n``, which every filelock that reads records parses, and whose
    holder it judges alive on this host as it judges its own), so no poller ever reads half a
    record.  The holder keeps its first name, ``lock.<hex>.sharedfs``, while it holds: a second
    link nobody without sharedfs makes, which is how the next sharedfs holder knows the file
    was a sharedfs holder's.  That holder held the sharedfs lock the next one holds now, so
    it is gone, and its file is taken over by :func:`~sharedfs.fs.polledfile.replace_foreign`.
    Any other holder's file is waited for, as stock filelock waits.
    """

    def __init__(self, path: str, mechanism: str) -> None:
        self.path = path
        self.mechanism = mechanism
        self._fd: int | None = None  # flock: the locked descriptor
        self._twin: str | None = None  # existence: this holder's first name of the file
        self._held: tuple[int, int] | None = None
        self.took_over: str | None = None  # existence: the dead sharedfs holder's twin this hold replaced

    def try_acquire(self) -> bool:
        return self._try_flock() if self.mechanism == FLOCK else self._try_existence()

    def release(self) -> None:
        if self._fd is not None:
            import fcntl

            fd, self._fd = self._fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        if self._held is not None:
            held, self._held = self._held, None
            unlink_if_same(self.path, held)  # frees it; then the second name goes
        if self._twin is not None:
            twin, self._twin = self._twin, None
            unlink_quietly(twin)

    def holder(self) -> str:
        """Who holds the file, as far as its record says (for a long wait's message)."""
        if self.mechanism == FLOCK:
            return f"a live process (the kernel drops the flock of a dead one; `fuser -v {self.path}` on each node)"
        try:
            got = read_untrusted(self.path)
        except FileNotFoundError:
            return "nobody any more"
        lines = got[0].decode("utf-8", "replace").split("\n") if got else []
        if len(lines) >= 2 and lines[0].isdigit():
            return f"pid {lines[0]} on {lines[1]}, by its record"
        return "a process that left no record sharedfs can read"

    # -- flock ---------------------------------------------------------------------------------------

    def _try_flock(self) -> bool:
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except PermissionError:  # another user's lock file without group write: read-only does for flock
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                return False
            raise
        try:
            if os.fstat(fd).st_nlink == 0 or identity(os.lstat(self.path)) != identity(os.fstat(fd)):
                raise FileNotFoundError  # locked a file someone removed or replaced meanwhile: try again
        except FileNotFoundError:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            return False
        self._fd = fd
        return True

    # -- existence -----------------------------------------------------------------------------------

    def _try_existence(self) -> bool:
        try:
            seen = os.lstat(self.path)
        except FileNotFoundError:
            return self._create()
        return self._take_over_if_sharedfs(seen)

    def _create(self) -> bool:
        twin = self._new_twin()
        try:
            os.link(twin, self.path)
        except FileExistsError:
            if os.stat(twin).st_nlink < 2:  # NFS answers EEXIST for a retransmitted link of its own success
                unlink_quietly(twin)
                return False
        except OSError as exc:
            unlink_quietly(twin)
            if exc.errno not in NO_LINKS:
                raise
            # No hard links here: created O_EXCL and written at once, and no later holder can tell it was ours.
            self._held = create_unlinked(self.path, _stock_record())
            return self._held is not None
        self._twin, self._held = twin, identity(os.stat(twin))
        return True

    def _take_over_if_sharedfs(self, seen: os.stat_result) -> bool:
        left = self._twin_of(seen)
        if left is None:
            return False  # a program without sharedfs holds it (or left it): waited for, as filelock waits
        ours = self._new_twin()
        try:
            replaced = replace_foreign(self.path, identity(seen), ours)
        except BaseException:
            unlink_quietly(ours)
            raise
        if not replaced:
            unlink_quietly(ours)
            return False
        unlink_quietly(left)
        self._twin, self._held, self.took_over = ours, identity(os.stat(ours)), left
        return True

    def _twin_of(self, seen: os.stat_result) -> str | None:
        """The second name a sharedfs holder gave the file ``seen``, if it has one."""
        if seen.st_nlink < 2:
            return None
        directory, base = os.path.split(self.path)
        try:
            names = os.listdir(directory or ".")
        except OSError:
            return None
        for name in names:
            if name.startswith(base) and _TWIN.match(name, len(base)):
                candidate = os.path.join(directory, name)
                try:
                    if identity(os.lstat(candidate)) == identity(seen):
                        return candidate
                except FileNotFoundError:
                    continue
        return None

    def _new_twin(self) -> str:
        twin = f"{self.path}.{uuid.uuid4().hex}.sharedfs"
        os.close(create_record(twin, _stock_record(), 0o666))
        return twin


def _stock_record() -> bytes:
    """filelock's soft-lock record of this process, in the two-line form every filelock that reads records parses."""
    import socket

    return f"{os.getpid()}\n{socket.gethostname()}\n".encode()
