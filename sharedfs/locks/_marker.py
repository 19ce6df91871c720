"""The existence marker: ``<lock>.held``, created ``O_EXCL``, holding the holder's record, and broken only on evidence.

docs/architecture.md, "Locks", says when a marker is broken and what takers killed half-way leave."""

from __future__ import annotations

import binascii
import errno
import logging
import os
import re
import threading
import time
import weakref
from typing import Callable

from sharedfs.fs import stale
from sharedfs.fs.directory import Directory, identity
from sharedfs.fs.recordfile import create_record_in, discard_if_same, same_file
from sharedfs.model.records import HolderRecord
from sharedfs.model.structs import frozen

log = logging.getLogger("sharedfs")

SUFFIX = ".held"
BREAK_SUFFIX = ".break"
#: Creating a marker and writing its record takes microseconds; a marker still empty after this
#: long lost its writer (killed in between, or ENOSPC).
EMPTY_GRACE = 30.0
#: Breaking takes milliseconds; a break marker this old belongs to a breaker that died.
BREAK_GRACE = 30.0


def marker_path(lock_file: str) -> str:
    """The marker of ``lock_file``.

    Not the lock file itself: a native lock file stays on disk after release (filelock,
    datasets and every framework leave it), so an existence lock on that name would be held
    forever by the first process that ever used a native lock there.
    """
    return lock_file + SUFFIX


@frozen
class Seen:
    """A marker as a waiter read it: its bytes and identity, and what they say.

    ``readable`` is False for what sharedfs never writes (a symlink, a FIFO, a directory, a
    file over the size cap, one we may not read): nothing can be concluded from it.
    """

    data: bytes
    identity: tuple[int, int, int]  # st_dev, st_ino, st_ctime_ns of the file that was read
    record: HolderRecord | None
    readable: bool = True
    owner: int = -1  # the uid owning the file


def create(path: str, record: HolderRecord, mode: int) -> int:
    """Create the marker ``path`` holding ``record``; the descriptor stays open while held.

    Raises :class:`FileExistsError` while someone holds it.  The record is written to a file of
    this taker's own first and then hard-linked to the marker's name (the NFS-safe way to create
    a lock file, open(2)): the marker never exists without its record.  Creating it empty and
    writing after would leave an empty marker behind a taker SIGKILLed in between (every waiter
    stuck for :data:`EMPTY_GRACE`), and on NFS an unflushed write shows other clients an empty
    marker while its holder is alive (the client flushes before a link).  Filesystems without
    hard links get ``O_EXCL`` and a write.  A record that cannot be written (ENOSPC, EDQUOT)
    leaves nothing behind and raises.  Every step is made in the lock's directory, opened once
    (:class:`~sharedfs.fs.directory.Directory`).
    """
    where, name = Directory.containing(path)
    with where:
        return create_in(where, name, record, mode)


def create_in(where: Directory, name: str, record: HolderRecord, mode: int) -> int:
    """:func:`create` of the marker ``name`` in the open directory ``where``."""
    data = record.to_bytes()
    if where.lexists(name):  # one lookup while someone holds it, instead of making and removing a file every poll
        raise FileExistsError(errno.EEXIST, "the lock marker exists", where.join(name))
    if where.path not in _NO_LINKS:
        fd = _create_linked(where, name, data, mode)
        if fd is not None:
            return fd
    return create_record_in(where, name, data, mode)


#: Directories whose filesystem refused a hard link: markers there are created O_EXCL and then written.
_NO_LINKS: set[str] = set()


def own_name(marker: str, data: bytes) -> str:
    """The name a taker writes its record under before linking it to ``marker`` (derived from the record,
    so whoever breaks a dead holder's marker can remove a name the holder had no time to)."""
    return f"{marker}.{binascii.crc32(data):08x}"


class Tampered(FileExistsError):
    """Another process removed or replaced this taker's own record file before it was linked to the marker.

    A :class:`FileExistsError` (the lock counts as held for this attempt, and the taker tries again with a
    fresh own name or waits), never a conclusion about the filesystem: a directory swapped in at that name
    makes link(2) answer EPERM, which must not read as "this filesystem has no hard links".
    """


def _create_linked(where: Directory, name: str, data: bytes, mode: int) -> int | None:
    """The marker made by link(2); ``None`` when this filesystem has no hard links."""
    temp = own_name(name, data)
    try:
        fd = create_record_in(where, temp, data, mode)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "another taker's record file has this name", where.join(temp)) from None
    mine: tuple[int, int] | None = None
    try:
        try:  # once, now: on NFS (ESTALE) or FUSE an fstat of a file another process removed fails
            mine = identity(fd)
        except OSError:
            raise _tampered(where.join(temp)) from None
        try:
            where.link(temp, name)
            failed: OSError | None = None
        except OSError as exc:
            exc.filename = where.join(name)
            failed = exc
        # NFS may report an error for a link that was made (a retransmitted request answered EEXIST),
        # so whether the marker is ours is asked of the name itself (open(2) checks the link count;
        # the identity also tells a file swapped in before the link, and needs no fresh link count).
        try:
            linked = identity(where.lstat(name)) == mine
        except FileNotFoundError:
            linked = False
        if failed is not None and not linked:
            # What link(2) answered is about the filesystem only while our own name still is our file: a
            # directory swapped in there answers EPERM, a name removed underneath ENOENT.  Either way
            # someone else is in the lock directory: this attempt fails as contention (fail closed), and
            # the directory keeps the link protocol.
            if not where.names(temp, mine):
                raise _tampered(where.join(temp))
            if failed.errno in _NO_LINK_ERRNOS:
                _NO_LINKS.add(where.path)
                where.discard_if_same(temp, mine)
                _close_quietly(fd)
                return None
            raise failed
        if not linked:
            # Someone swapped our own name for another file between its creation and the link:
            # what now sits at the marker is theirs, so the lock counts as held (fail closed).
            raise FileExistsError(errno.EEXIST, "the lock marker was replaced while it was being made",
                                  where.join(name))
        # The marker is ours now, and the own name goes.  Unlinked without looking first (no extra metadata
        # operation on every acquire): what another process may have put at that name is a directory, which
        # unlink(2) refuses, or a file it could have removed itself (without the sticky bit it may remove any
        # file here; with it, it can only move its own files).  A refusal must not fail an acquire whose
        # marker is already linked: that marker would stay behind a live process that never holds the lock.
        where.unlink_quietly(temp)
    except BaseException:
        if mine is not None:
            where.discard_if_same(temp, mine)
        _close_quietly(fd)  # a FUSE client whose file was swapped for a directory answers EIO even here
        raise
    return fd


def _close_quietly(fd: int) -> None:
    """Close ``fd`` on a path that is already failing: the descriptor is freed whatever close(2) answers."""
    try:
        os.close(fd)
    except OSError:
        pass


def _tampered(temp: str) -> Tampered:
    return Tampered(errno.EEXIST, "this taker's own record file was removed or replaced before it could be "
                                  "linked to the lock marker", temp)


_NO_LINK_ERRNOS = {errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV}


def read(path: str) -> Seen | None:
    """The marker at ``path`` as it is now; ``None`` when it is gone.  Never raises for hostile content."""
    try:
        where, name = Directory.containing(path)
    except FileNotFoundError:
        return None
    except OSError:
        return Seen(b"", (0, 0, 0), None, readable=False)
    with where:
        return read_in(where, name)


def read_in(where: Directory, name: str) -> Seen | None:
    """:func:`read` of ``name`` in the open directory ``where``."""
    try:
        got = where.read_untrusted(name)
    except FileNotFoundError:
        return None
    if got is None:
        return Seen(b"", (0, 0, 0), None, readable=False)
    data, st = got
    return Seen(data, (st.st_dev, st.st_ino, st.st_ctime_ns), HolderRecord.parse(data) if data else None,
                owner=st.st_uid)


#: A waiter looks for leftover own names in a lock's directory at most this often (seconds, per directory and
#: process): one listing of a directory the metadata server serves to every node.
COLLECT_EVERY = 600.0
_collected: dict[str, float] = {}


def collect_leftovers(marker: str, dead: Callable[[HolderRecord], bool], *, force: bool = False) -> int:
    """Remove the own-name files (``<marker>.<crc>``) takers left when killed before their link; how many went.

    A taker SIGKILLed between writing its record under its own name and linking it to the
    marker leaves that file, and nobody ever uses the name again (it is derived from the dead
    taker's record).  Called by a waiter (at most every :data:`COLLECT_EVERY` per directory,
    unless ``force``) and after breaking a dead holder's marker; ``sharedfs locks`` shows the
    rest, and ``--clear-dead`` removes them the same way.  See :func:`collect_in`.
    """
    directory, base = os.path.split(marker)
    directory = directory or "."
    now = time.monotonic()
    if not force and now - _collected.get(directory, -COLLECT_EVERY) < COLLECT_EVERY:
        return 0
    _collected[directory] = now
    try:
        where = Directory.open(directory)
    except OSError:
        return 0
    with where:
        return collect_in(where, base, dead)


def collect_in(where: Directory, marker: str, dead: Callable[[HolderRecord], bool]) -> int:
    """The own-name files of the marker named ``marker`` in ``where`` that may go, removed; how many went.

    One goes only when it is exactly what sharedfs writes there (a regular file whose record's
    own name is its name, with no second name: not a marker's), its writer is provably gone
    (``dead``: the ``sharedfs_holder_alive`` rule; "cannot tell" keeps it), and it is still the
    file that was read, in the same open directory.
    """
    prefix = marker + "."
    removed = 0
    try:
        entries = [entry.name for entry in where.listing()
                   if entry.name.startswith(prefix) and _OWN_HEX.fullmatch(entry.name, len(prefix))]
    except OSError:
        return 0
    for name in entries:
        try:
            got = where.read_untrusted(name)
        except FileNotFoundError:
            continue
        if got is None:
            continue  # not a file sharedfs wrote: cannot tell
        data, st = got
        record = HolderRecord.parse(data) if data else None
        if record is None or own_name(marker, data) != name or st.st_nlink != 1:
            continue  # not a taker's record under its own name, or still a marker's second name
        if dead(record) is True and _unlink_quietly(where, name, identity(st)):
            removed += 1
    return removed


#: An own name's suffix: the record's crc32 in 8 hex digits.
_OWN_HEX = re.compile(r"[0-9a-f]{8}")


def _unlink_quietly(where: Directory, name: str, file: tuple[int, int]) -> bool:
    """:meth:`~sharedfs.fs.directory.Directory.unlink_if_same` that answers False instead of raising."""
    try:
        return where.unlink_if_same(name, file)
    except OSError:
        return False


class NotAllowed(PermissionError):
    """The directory does not let this user remove the dead holder's marker (another user's file)."""


def break_stale(path: str, seen: Seen, breaker: HolderRecord,
                dead: Callable[[HolderRecord], bool | None]) -> bool:
    """Remove the marker ``path`` if it is still exactly ``seen``; True when this call removed it.

    Every step is made in the marker's directory, opened once: see :func:`break_in`.
    """
    try:
        where, name = Directory.containing(path)
    except OSError:
        return False
    with where:
        return break_in(where, name, seen, breaker, dead)


def break_in(where: Directory, name: str, seen: Seen, breaker: HolderRecord,
             dead: Callable[[HolderRecord], bool | None]) -> bool:
    """Remove the marker ``name`` in ``where`` if it is still exactly ``seen``; True when this call removed it.

    Breakers take turns through ``<marker>.break``, which holds the ``breaker``'s record, so a
    breaker killed half-way is recognised by ``dead`` (the holder check) as soon as it is gone;
    one nobody can vouch for is cleared after :data:`BREAK_GRACE`.  The turn is created, the
    marker re-read, checked and removed, and the turn removed, all relative to ``where``:
    a parent directory renamed meanwhile changes nothing here.  Raises :class:`NotAllowed`
    when the directory forbids it (a sticky directory, or no write permission): then only the
    marker's owner or an administrator can clear it.
    """
    turn = name + BREAK_SUFFIX
    try:
        fd = create_in(where, turn, breaker, 0o600)
    except FileExistsError:
        _clear_dead_breaker(where, turn, dead)
        return False
    except PermissionError as exc:
        raise NotAllowed(exc.errno, exc.strerror, where.join(name)) from None
    except OSError:
        return False
    try:
        now = read_in(where, name)
        if now is None or not now.readable or now.data != seen.data or now.identity != seen.identity:
            return False  # released, renewed or replaced since we looked
        st = where.lstat(name)
        if (st.st_dev, st.st_ino, st.st_ctime_ns) != seen.identity:
            return False
        if not where.unlink_if_same(name, identity(st)):
            return False
        if st.st_nlink > 1:  # its holder died between linking its record and removing its own name
            where.discard_if_same(own_name(name, seen.data), identity(st))
        return True
    except PermissionError as exc:  # a sticky directory: only the owner (or root) may unlink it
        raise NotAllowed(exc.errno, exc.strerror, where.join(name)) from None
    except OSError:
        return False
    finally:
        try:
            where.discard_if_same(turn, identity(fd))
        finally:
            stale.close(fd)  # ESTALE: our turn was cleared elsewhere meanwhile; the descriptor is freed anyway


def _clear_dead_breaker(where: Directory, turn: str, dead: Callable[[HolderRecord], bool | None]) -> None:
    seen = read_in(where, turn)
    if seen is None or not seen.readable:
        return
    try:
        st = where.lstat(turn)
    except OSError:
        return
    if (st.st_dev, st.st_ino, st.st_ctime_ns) != seen.identity:
        return  # another breaker's turn began meanwhile
    if (seen.record is not None and dead(seen.record) is True) or time.time() - st.st_mtime > BREAK_GRACE:
        where.discard_if_same(turn, identity(st))


def _unlink_if_same(path: str, st: os.stat_result) -> None:
    """Unlink ``path`` only while it is still the file ``st`` describes (never a successor's); never raises."""
    discard_if_same(path, identity(st))


class Watch:
    """How long a waiter has seen one marker unchanged, on the waiter's own monotonic clock.

    Leases and empty markers expire by *not changing* for a while; measuring that with the
    waiter's clock avoids comparing file times written by another node's clock.
    """

    def __init__(self) -> None:
        self._identity: tuple[tuple[int, int, int], bytes] | None = None
        self._since = 0.0

    def unchanged_for(self, seen: Seen) -> float:
        key = (seen.identity, seen.data)
        now = time.monotonic()
        if key != self._identity:
            self._identity, self._since = key, now
        return now - self._since


# -- lease renewal ----------------------------------------------------------------------------


class _Renewer:
    """One daemon thread per process renews every lease this process holds.

    A lease is renewed by touching its marker (through the descriptor that created it)
    every third of its duration; a waiter takes over a marker that stayed unchanged for
    the whole duration, so a holder that is alive but stopped (SIGSTOP, a hung NFS
    server) loses the lock, which is what a lease trades for progress.
    """

    def __init__(self) -> None:
        self._held: weakref.WeakValueDictionary[int, _Lease] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def add(self, lease: _Lease) -> None:
        with self._lock:
            self._held[id(lease)] = lease
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="sharedfs-lease", daemon=True)
                self._thread.start()
        self._wake.set()

    def remove(self, lease: _Lease) -> None:
        with self._lock:
            self._held.pop(id(lease), None)

    def _run(self) -> None:
        while True:
            with self._lock:
                leases = list(self._held.values())
            now = time.monotonic()
            for lease in leases:
                if now >= lease.due:
                    lease.renew()
            pause = min((lease.due for lease in leases), default=now + 60.0) - time.monotonic()
            self._wake.wait(timeout=max(0.01, pause))
            self._wake.clear()


class _Lease:
    def __init__(self, fd: int, path: str, seconds: float) -> None:
        self.fd, self.path, self.period = fd, path, seconds / 3
        self.due = time.monotonic() + self.period
        self.lost = False

    def renew(self) -> None:
        self.due = time.monotonic() + self.period
        try:
            os.utime(self.fd)
            ok = same_file(self.path, self.fd)
        except OSError:
            ok = False
        if not ok and not self.lost:
            self.lost = True
            log.error("the lease on %s was taken over by another process while this one still held it "
                      "(it did not renew the marker in time: stopped, or a hung filesystem); the two may "
                      "overlap. Raise SHAREDFS_LEASE_SECONDS, or use a non-lease lock kind.", self.path)


_renewer = _Renewer()


def start_lease(fd: int, path: str, seconds: float) -> _Lease:
    lease = _Lease(fd, path, seconds)
    _renewer.add(lease)
    return lease


def stop_lease(lease: _Lease) -> None:
    _renewer.remove(lease)
