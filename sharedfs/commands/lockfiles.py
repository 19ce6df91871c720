"""``sharedfs locks PATH...``: every lock under a tree, who holds it, and which holders are provably gone.

At 3 a.m. a job waits on a lock, and the person on call has ``ls``, ``cat`` and ``rm``.  A wrong
``rm`` breaks a live lock on another node (the stale-lock reports ishandhanani/srt-slurm#251 and
modelscope#1778 are the other half of that situation).  This command answers the question
directly, with the same evidence the lock itself uses:

* **what**: existence markers (``<lock>.held``) with their holder records, native lock files
  (probed without blocking), shard-cache download claims and reader records, torch's build
  baton, and the own-name files (``<lock>.held.<crc>``) and break turns (``<lock>.held.break``)
  of takers that were killed half-way;
* **state**: ``held``, ``dead``, ``unknown`` or ``free``.  Alive, dead and "cannot tell" come from
  the one rule every lock uses (the ``sharedfs_holder_alive`` hook: local evidence on this node,
  or the scheduler); nothing here has a rule of its own;
* **clearing**: ``--clear-dead`` removes exactly the dead markers, through the lock's own
  breaking protocol (:func:`sharedfs.locks._marker.break_stale`: a break turn, then the marker
  only while it is still byte for byte and inode for inode the dead holder's), so a holder that
  took the lock meanwhile keeps it.  ``unknown`` is never cleared.

The tree is untrusted (any member of a group can plant a symlink, a FIFO or a huge file in a
shared cache, or exchange a directory of hers for a symlink while the walk runs): one listing
per directory, no symlink followed, no open that can block, records read under a size cap, and
a bounded rate of filesystem calls (a metadata server serves everyone).  Each directory is opened
once, from its parent's descriptor kept open meanwhile, and at most :data:`MAX_DEPTH` levels down:
a deeper one is reported (a ``too-deep`` row, ``unknown``), not walked.  Anything unreadable is
``unknown``, never ``free``.  **A clear never leaves its tree; every removal is made by
descriptor**: each directory is opened from its parent's descriptor (``O_NOFOLLOW``, and it
must still be the directory the parent's listing showed), every file is read, checked and
removed relative to that descriptor (:class:`~sharedfs.fs.directory.Directory`), and a
directory that changed between the listing and the open is skipped with one line.  Run as
root, a clear removes only what the file's owner could have removed herself.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import stat
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sharedfs.fs import oslocks
from sharedfs.fs.directory import Changed, Directory, Identity, identity, owner_may_remove
from sharedfs.locks import _marker
from sharedfs.locks.names import TORCH_BATON_KIND, TORCH_BATON_NAME, TORCH_GUARD_SUFFIX
from sharedfs.model.records import HolderRecord, user_name
from sharedfs.shardcache import META, SIBLING_SUFFIX

log = logging.getLogger("sharedfs")

#: Filesystem calls per second the walk makes at most: a metadata server (Lustre MDS, an NFS
#: server) serves every node of the cluster, and one person's look must not slow their jobs down.
MAX_CALLS_PER_SECOND = 2000.0
#: Levels below a PATH the walk descends at most.  A framework's cache is a few levels deep (plus the folders
#: of a repository or an archive it holds); a deeper directory is reported, not walked, so a member's chain of
#: thousands of directories costs at most this many levels (and this many open descriptors, one per level).
MAX_DEPTH = 128
#: A terminal sees progress (on stderr) once a walk takes this long, then at most this often.
PROGRESS_AFTER = 1.0

HELD, DEAD, UNKNOWN, FREE = "held", "dead", "unknown", "free"
#: Exit status: nothing held (free or dead only), something held or undecidable, an error.
EXIT_FREE, EXIT_HELD, EXIT_ERROR = 0, 1, 2

#: Row kinds: what the file is (the lock's own kind, for a marker, is the holder's ``lock_kind``).
MARKER, NATIVE, OWN_NAME, BREAK_TURN = "marker", "native", "own-name", "break-turn"
SHARD_CLAIM, SHARD_READER, TORCH_BATON = "shard-claim", "shard-reader", "torch-baton"
#: Not a lock: a directory MAX_DEPTH below a PATH, not walked (``unknown``: what is below it nobody looked at).
TOO_DEEP = "too-deep"

#: ``<lock>.held.<crc32 of the record, 8 hex>``: a taker's record before it is linked to the marker.
_OWN_NAME = re.compile(r"(.+" + re.escape(_marker.SUFFIX) + r")\.([0-9a-f]{8})")
#: The shard cache's coordination tree (sharedfs.shardcache's layout): ``<parent>/.<cache>.sharedfs/``
#: or ``<cache>/.sharedfs/``, with ``claims/`` (download claims) and ``inuse/`` (readers).
_SHARD_TREE = re.compile(r"\..+" + re.escape(SIBLING_SUFFIX) + "|" + re.escape(META))
#: What a native lock file is called by the frameworks: filelock/datasets/hub ``*.lock``, torch's ``lock``.
_NATIVE_SUFFIX = ".lock"


class LocksError(Exception):
    """Bad input (a path that does not exist): said in one line, nothing is touched."""


# -- rows -------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One lock as this command saw it."""

    lock: str  # the lock's name: the lock file a program locks (``x.lock`` for ``x.lock.held``)
    kind: str
    state: str
    evidence: str
    file: str  # the file this row was read from
    record: HolderRecord | None = None
    owner: int | None = None  # uid owning the file
    changed: float | None = None  # the file's mtime, for rows without a record
    cleared: bool | None = None  # --clear-dead: True when this run removed it
    #: What --clear-dead needs: the marker as read (its bytes and identity), or None when never clearable.
    seen: _marker.Seen | None = field(default=None, repr=False)
    native_holder: dict[str, Any] | None = None
    #: Where ``file`` is, for --clear-dead: its directory as the walk reached it, and its name there.
    place: Place | None = field(default=None, repr=False)
    name: str = ""

    @property
    def since(self) -> float | None:
        return self.record.acquired_at if self.record is not None else self.changed

    @property
    def user(self) -> str | None:
        uid = self.record.uid if self.record is not None and self.record.uid is not None else self.owner
        return user_name(uid) if uid is not None else None

    def holder(self) -> dict[str, Any] | None:
        if self.native_holder is not None:
            return self.native_holder
        record = self.record
        if record is None:
            return None
        return {"user": self.user, "uid": record.uid, "node": record.node, "host": record.host or None,
                "pid": record.pid, "boot": record.boot_id, "job": record.slurm_job, "step": record.slurm_step,
                "since": record.acquired_at, "lock_kind": record.kind}

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lock": self.lock, "kind": self.kind, "state": self.state, "holder": self.holder(),
               "evidence": self.evidence, "file": self.file}
        if self.cleared is not None:
            out["cleared"] = self.cleared
        return out


# -- the walk ---------------------------------------------------------------------------------------


class Place:
    """A directory as the walk reached it: a top the operator named, then one real directory at a time.

    Never a path to resolve again: a :class:`Descent` opens it from its parent's open descriptor with
    ``O_NOFOLLOW`` and checks that it is still the directory (device and inode) its parent's listing
    showed, so whatever is swapped in meanwhile is refused, not entered.
    """

    __slots__ = ("depth", "ident", "name", "parent", "path", "top")

    def __init__(self, top: Directory, parent: Place | None = None, name: str = "",
                 ident: Identity | None = None) -> None:
        self.top, self.parent, self.name, self.ident = top, parent, name, ident
        self.depth: int = 0 if parent is None else parent.depth + 1  # levels below the top
        self.path: str = top.path if parent is None else os.path.join(parent.path, name)

    def child(self, name: str, ident: Identity) -> Place:
        return Place(self.top, self, name, ident)


class Descent:
    """The directories from a top down to the last :class:`Place` entered, open, each from its parent's descriptor.

    Entering a place keeps the open ancestors it shares with the last one and opens only the rest,
    one ``openat`` per level (identity checked), so a depth-first walk opens each directory once.
    Re-descending from the top for every directory instead cost depth² calls: minutes for a member's
    chain of 2,000 directories.  At most ``MAX_DEPTH + 1`` descriptors are open (the walk goes no
    deeper); the directories it returns are its own, closed by :meth:`close`.
    """

    def __init__(self, call: Callable[[int], None] | None = None) -> None:
        self._open: list[tuple[Place, Directory]] = []
        self._call = call

    def enter(self, place: Place) -> Directory:
        """``place`` open; :class:`Changed` when a level opened now is no longer what its parent's listing showed."""
        missing = []
        here: Place | None = place
        while here is not None and not self._is_open(here):
            missing.append(here)
            here = here.parent
        self._close_below(0 if here is None else here.depth + 1)
        for step in reversed(missing):
            if self._call is not None:
                self._call(1)
            if step.parent is None:
                below = Directory(os.dup(step.top.fd), step.top.path)
            else:
                below = self._open[-1][1].subdirectory(step.name, step.ident)
            self._open.append((step, below))
        return self._open[-1][1]

    def _is_open(self, place: Place) -> bool:
        return place.depth < len(self._open) and self._open[place.depth][0] is place

    def _close_below(self, depth: int) -> None:
        while len(self._open) > depth:
            self._open.pop()[1].close()

    def close(self) -> None:
        self._close_below(0)

    def __enter__(self) -> Descent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Walk:
    """Filesystem calls at a bounded rate, counted; progress on a terminal."""

    def __init__(self, rate: float = MAX_CALLS_PER_SECOND, progress: bool | None = None) -> None:
        self.rate = rate
        self.calls = 0
        self.directories = 0
        self.entries = 0
        self.errors: list[str] = []
        #: Directories skipped because they changed between their parent's listing and their open.
        self.skipped: list[str] = []
        #: The tops the operator named, open for the whole run (closed by :func:`run`).
        self.tops: list[Directory] = []
        #: The directory being walked and its ancestors, open (closed after each PATH and by :func:`run`).
        self.descent = Descent(self.call)
        #: Directories met at MAX_DEPTH below the current PATH, not walked: (their parent, their name).
        self.deep: list[tuple[Place, str]] = []
        self._started = time.monotonic()
        self._shown = 0.0
        self.progress = sys.stderr.isatty() if progress is None else progress
        self._proc_locks: dict[tuple[int, int, int], list[tuple[str, int]]] | None = None

    def call(self, n: int = 1) -> None:
        """Account for ``n`` filesystem calls about to be made; sleep when ahead of the rate."""
        self.calls += n
        ahead = self.calls / self.rate - (time.monotonic() - self._started)
        if ahead > 0:
            time.sleep(ahead)

    def show(self, done: bool = False) -> None:
        if not self.progress:
            return
        now = time.monotonic()
        if done:
            if self._shown:
                sys.stderr.write("\r\033[K")
                sys.stderr.flush()
            return
        if now - self._started < PROGRESS_AFTER or now - self._shown < 0.5:
            return
        self._shown = now
        sys.stderr.write(f"\rsharedfs locks: {self.directories} directories, {self.entries} entries looked at ...")
        sys.stderr.flush()

    def enter(self, place: Place) -> Directory | None:
        """``place`` open (the walk's own: not closed by the caller), or ``None`` (said) when it changed since it
        was listed or cannot be opened."""
        try:
            return self.descent.enter(place)
        except Changed as exc:
            self.skipped.append(f"skipped {exc.filename}: {exc.strerror} since its parent was listed; "
                                "nothing below it was looked at")
        except FileNotFoundError:
            pass  # removed while we walked
        except OSError as exc:
            self.errors.append(f"cannot open {place.path}: {exc.strerror or exc}")
        return None

    def listing(self, where: Directory) -> list[os.DirEntry[str]] | None:
        """One listing of ``where`` (``None``, said, when it cannot be listed)."""
        self.call()
        try:
            entries = where.listing()
        except FileNotFoundError:
            return []  # removed while we walked
        except OSError as exc:
            self.errors.append(f"cannot list {where.path}: {exc.strerror or exc}")
            return None
        self.directories += 1
        self.entries += len(entries)
        self.show()
        return entries

    def proc_locks(self) -> dict[tuple[int, int, int], list[tuple[str, int]]]:
        """This node's kernel locks (``/proc/locks``, read once per run)."""
        if self._proc_locks is None:
            self._proc_locks = oslocks.held_here()
        return self._proc_locks


#: A lock's own names, for telling a free lock that leaves no file from a path that names nothing.
_LOCK_NAMES = re.compile(r".*(" + re.escape(_NATIVE_SUFFIX) + "|" + re.escape(_marker.SUFFIX) + ")|"
                         + re.escape(TORCH_BATON_NAME))


def find(paths: list[str], walk: Walk) -> Iterator[tuple[str, list[Row]]]:
    """For each PATH: (PATH, its rows).  Raises :class:`LocksError` for a path that cannot be a lock or tree.

    The tops it opens stay in ``walk.tops`` (rows refer to them) until the caller closes them.
    """
    for given in paths:  # every argument checked before any walk: a typo in the last one wastes no walk
        if not given.strip():
            raise LocksError("an empty PATH (an unset variable in a script?): name a directory or a lock file")
        if not os.path.isdir(os.path.dirname(os.path.abspath(given))):
            raise LocksError(f"{given}: no such file or directory")
    for given in paths:
        path = os.path.abspath(given)
        try:
            st = os.stat(path)  # the argument itself may be a symlink to the cache (the operator's intent)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise LocksError(f"{given}: {exc.strerror}") from None
        if st is not None and stat.S_ISDIR(st.st_mode):
            top = _open_top(path, given, walk)
            yield path, list(_tree_rows(Place(top), walk))
            continue
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            raise LocksError(f"{given}: no such file or directory")
        rows = _one_lock_rows(Place(_open_top(parent, given, walk)), os.path.basename(path), walk)
        if st is None and all(row.state == FREE for row in rows) and not _LOCK_NAMES.fullmatch(os.path.basename(path)):
            raise LocksError(f"{given}: no such file or directory (nothing of a lock is there either: check the "
                             "spelling; a free lock that leaves no file is named by its lock file, e.g. x.lock)")
        yield path, rows


def _open_top(path: str, given: str, walk: Walk) -> Directory:
    walk.call()
    try:
        top = Directory.open(path)
    except OSError as exc:
        raise LocksError(f"{given}: {exc.strerror}") from None
    walk.tops.append(top)
    return top


def _tree_rows(start: Place, walk: Walk) -> Iterator[Row]:
    stack = [start]
    # A shard cache keeps its coordination tree beside it (<parent>/.<cache>.sharedfs): looked at too, as a
    # top of its own reached from the parent's descriptor (never through a symlink).
    top = start.top
    sibling = f".{os.path.basename(top.path.rstrip(os.sep))}.sharedfs"
    walk.call(2)
    try:
        with Directory.open(os.path.dirname(top.path.rstrip(os.sep)) or os.sep) as parent:
            if stat.S_ISDIR(parent.lstat(sibling).st_mode):
                beside = parent.subdirectory(sibling)
                walk.tops.append(beside)
                stack.append(Place(beside))
    except OSError:
        pass  # none there (or a symlink, or a file: not a coordination tree)
    try:
        while stack:
            place = stack.pop()
            where = walk.enter(place)  # its ancestors are still open: one openat, not one per level
            if where is not None:
                yield from _directory_rows(place, where, walk, stack)
    finally:
        walk.descent.close()
    if walk.deep:
        yield _too_deep_row(walk)


def _too_deep_row(walk: Walk) -> Row:
    """The directories this PATH's walk did not enter (MAX_DEPTH below it), as one row and one line."""
    (parent, name), more = walk.deep[0], len(walk.deep) - 1
    walk.deep.clear()
    path = os.path.join(parent.path, name)
    evidence = (f"more than {MAX_DEPTH} levels below {parent.top.path}, the deepest `sharedfs locks` looks (no "
                "framework's cache nests so deep): not walked, so nothing below it was looked at"
                + (f", nor below {more} more directories as deep" if more else "")
                + "; to look there, name that directory as PATH")
    walk.skipped.append(f"not walked: {path}: {evidence}")
    return Row(path, TOO_DEEP, UNKNOWN, evidence, path)


def _directory_rows(place: Place, where: Directory, walk: Walk, stack: list[Place]) -> Iterator[Row]:
    entries = walk.listing(where)
    if entries is None:
        return
    names = {entry.name for entry in entries}
    path = place.path
    in_shard_tree = _SHARD_TREE.fullmatch(os.path.basename(os.path.dirname(path))) is not None
    part = os.path.basename(path) if in_shard_tree else ""
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            is_dir = entry.is_dir(follow_symlinks=False)  # d_type: free, except on a few filesystems
        except FileNotFoundError:
            continue  # gone meanwhile
        except OSError as exc:
            walk.errors.append(f"cannot look at {where.join(entry.name)}: {exc.strerror or exc}")
            continue
        if is_dir:
            # A shard cache's tmp/ holds private download directories (0700, others' own): nothing to see.
            if not (in_shard_tree and part == "tmp") and not entry.name.endswith(_marker.SUFFIX):
                if place.depth >= MAX_DEPTH:
                    walk.deep.append((place, entry.name))
                    continue
                walk.call()
                try:
                    ident = identity(entry.stat(follow_symlinks=False))
                except FileNotFoundError:
                    continue  # gone meanwhile
                except OSError as exc:
                    walk.errors.append(f"cannot look at {where.join(entry.name)}: {exc.strerror or exc}")
                    continue
                stack.append(place.child(entry.name, ident))
                continue
        row = _classify(where, entry.name, names, part, walk, entry)
        if row is not None:
            row.place, row.name = place, entry.name
            yield row


def _one_lock_rows(place: Place, base: str, walk: Walk) -> list[Row]:
    """PATH names one lock (its lock file or its marker): that lock's files, from one listing of its directory."""
    if base.endswith(_marker.SUFFIX):
        base = base[:-len(_marker.SUFFIX)]
    where = walk.enter(place)
    entries = walk.listing(where) if where is not None else None
    lock = os.path.join(place.path, base)
    rows = []
    if where is not None:
        try:
            names = {entry.name for entry in entries or ()}
            for entry in sorted(entries or (), key=lambda e: e.name):
                if entry.name == base or entry.name.startswith(base + _marker.SUFFIX):
                    row = _classify(where, entry.name, names, "", walk, entry, single=entry.name == base)
                    if row is not None:
                        row.place, row.name = place, entry.name
                        rows.append(row)
        finally:
            walk.descent.close()
    if not rows and entries is not None:
        rows.append(Row(lock, MARKER, FREE, f"neither {lock} nor {_marker.marker_path(lock)} exists: not held "
                        "(released since, or not the path of a lock: check it)", lock))
    return rows


def _classify(where: Directory, name: str, names: set[str], part: str, walk: Walk, entry: os.DirEntry[str],
              single: bool = False) -> Row | None:
    """The row of one directory entry, or ``None`` when it is no lock (most files: no call made)."""
    if part in ("claims", "inuse"):
        return _shard_record(where, name, part, walk)
    if name.endswith(_marker.SUFFIX):
        return _marker_row(where, name, walk)
    if name.endswith(_marker.SUFFIX + _marker.BREAK_SUFFIX):
        return _break_turn_row(where, name, walk)
    own = _OWN_NAME.fullmatch(name)
    if own is not None:
        return _own_name_row(where, name, own.group(1), walk)
    if name + _marker.SUFFIX in names and not single:
        return None  # the marker's row speaks for this lock (a native kind on a shared filesystem takes both)
    if name == TORCH_BATON_NAME and (_torch_guard(names) or part == ""):
        return _torch_or_native(where, name, names, walk, entry)
    if name.endswith(_NATIVE_SUFFIX) or name == TORCH_BATON_NAME + TORCH_GUARD_SUFFIX or part == "stripes" or single:
        return _native_row(where, name, walk, entry)
    return None


def _torch_guard(names: set[str]) -> bool:
    guard = TORCH_BATON_NAME + TORCH_GUARD_SUFFIX
    return guard in names or guard + _marker.SUFFIX in names


# -- markers ----------------------------------------------------------------------------------------


def _read(where: Directory, name: str, walk: Walk) -> _marker.Seen | None:
    walk.call(4)  # open, fstat, read, close
    return _marker.read_in(where, name)


def _not_a_record(where: Directory, name: str, walk: Walk) -> tuple[str, int | None, float | None]:
    """What sits at ``name`` that sharedfs never writes: its description, owner and age (one lstat)."""
    walk.call()
    try:
        st = where.lstat(name)
    except OSError as exc:
        return f"it cannot be looked at ({exc.strerror})", None, None
    mode = st.st_mode
    what = ("a symlink" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a directory" if stat.S_ISDIR(mode) else "a socket or device" if not stat.S_ISREG(mode) else
            f"a file of {st.st_size} bytes (records are at most a few hundred)" if st.st_size > 4096 else
            "a file this user may not read")
    return what, st.st_uid, st.st_mtime


def _marker_row(where: Directory, name: str, walk: Walk) -> Row | None:
    path = where.join(name)
    lock = path[:-len(_marker.SUFFIX)]
    seen = _read(where, name, walk)
    if seen is None:
        return None  # released while we looked
    if not seen.readable:
        what, owner, changed = _not_a_record(where, name, walk)
        return Row(lock, MARKER, UNKNOWN, f"{what} sits at the marker, which sharedfs never writes: the lock counts "
                   "as held for every waiter. If nobody uses this lock, ask its owner to remove it", path,
                   owner=owner, changed=changed)
    if seen.record is None:
        empty = not seen.data
        why = ("an empty marker: its taker was killed between creating and writing it (or is writing it now); "
               f"waiters break it once it stays empty for {_marker.EMPTY_GRACE:g} s") if empty else (
            "the marker holds no record sharedfs can read (garbage, or another program's): the lock counts as "
            "held for every waiter. If nobody uses this lock, ask its owner to remove it")
        return Row(lock, MARKER, UNKNOWN, why, path, owner=seen.owner)
    record = seen.record
    state, evidence = judge(record)
    if os.path.basename(lock) == TORCH_BATON_NAME + TORCH_GUARD_SUFFIX:
        evidence = f"torch extension build lock of {os.path.dirname(lock)}: {evidence}"
    if record.kind == "lease" and state != DEAD:
        evidence += (f"; a lease: waiters take it over once it stays unrenewed for "
                     f"{record.lease_seconds or 0:g} s")
    elif record.kind in ("flock", "posix") and state != DEAD:
        evidence += f"; a {record.kind} lock's waiter that takes {record.kind} on {os.path.basename(lock)} breaks it"
    return Row(lock, MARKER, state, evidence, path, record=record, owner=seen.owner,
               seen=seen if state == DEAD else None)


def _break_turn_row(where: Directory, name: str, walk: Walk) -> Row | None:
    path = where.join(name)
    lock = path[:-len(_marker.SUFFIX + _marker.BREAK_SUFFIX)]
    seen = _read(where, name, walk)
    if seen is None:
        return None
    if seen.record is None:
        what = "an empty or unreadable file" if seen.readable else _not_a_record(where, name, walk)[0]
        return Row(lock, BREAK_TURN, UNKNOWN, f"the break turn is {what}; breakers clear it after "
                   f"{_marker.BREAK_GRACE:g} s", path, owner=seen.owner)
    state, evidence = judge(seen.record)
    return Row(lock, BREAK_TURN, state, f"a process breaking a dead holder's marker: {evidence}", path,
               record=seen.record, owner=seen.owner, seen=seen if state == DEAD else None)


def _own_name_row(where: Directory, name: str, marker: str, walk: Walk) -> Row | None:
    """``<lock>.held.<crc>``: a taker's record under its own name, before (or while) it is linked to the marker."""
    path = where.join(name)
    lock = where.join(marker[:-len(_marker.SUFFIX)])
    seen = _read(where, name, walk)
    if seen is None:
        return None
    if seen.record is None or _marker.own_name(marker, seen.data) != name:
        return Row(lock, OWN_NAME, UNKNOWN, "named like a taker's own record file, but its content is not the "
                   "record its name says: not sharedfs's; the lock is unaffected by it", path, owner=seen.owner)
    state, evidence = judge(seen.record)
    if state == DEAD:
        evidence = f"left by a taker killed while it created the marker: {evidence}"
    elif state == HELD:
        evidence = f"a taker creating the marker right now: {evidence}"
    return Row(lock, OWN_NAME, state, evidence, path, record=seen.record, owner=seen.owner,
               seen=seen if state == DEAD else None)


# -- native lock files ------------------------------------------------------------------------------

#: struct flock (Linux, 64-bit off_t): l_type, l_whence, l_start, l_len, l_pid (+ padding the kernel writes).
_FLOCK = "hhqqi"
_FLOCK_SIZE = 32


def _native_row(where: Directory, name: str, walk: Walk, entry: os.DirEntry[str]) -> Row | None:
    path = lock = where.join(name)
    try:
        if entry.is_symlink():
            return Row(lock, NATIVE, UNKNOWN, "a symlink where a lock file should be: not followed (a planted "
                       "link would make every locker lock another file)", path)
        if not entry.is_file(follow_symlinks=False):
            return Row(lock, NATIVE, UNKNOWN, "not a regular file where a lock file should be (a FIFO, socket or "
                       "device: not opened)", path)
    except OSError:
        return None
    walk.call(2)  # open, fstat
    try:
        fd = where.open_file(name, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Row(lock, NATIVE, UNKNOWN, f"cannot open it to probe ({exc.strerror}): whether it is locked "
                   "cannot be told from here", path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Row(lock, NATIVE, UNKNOWN, "not a regular file where a lock file should be", path,
                       owner=st.st_uid)
        return _probe(fd, st, lock, path, walk)
    finally:
        walk.call()
        os.close(fd)


def _probe(fd: int, st: os.stat_result, lock: str, path: str, walk: Walk) -> Row:
    """Is the native lock on ``fd`` held?  Never blocks, never keeps a lock."""
    here = walk.proc_locks().get((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    if here:
        how, pid = here[0]
        return Row(lock, NATIVE, HELD, f"a {how} lock held by pid {pid} on this node (/proc/locks); the kernel "
                   "drops it when that process ends", path, owner=st.st_uid,
                   native_holder=_local_holder(pid, how))
    walk.call(2)
    if _try_shared_flock(fd) == "blocked":
        return Row(lock, NATIVE, HELD, "flock held by a process on another node (a non-blocking probe from here "
                   "was refused); its node's kernel or lock manager drops it when that process ends", path,
                   owner=st.st_uid, changed=st.st_mtime)
    walk.call()
    posix_pid = _posix_holder(fd)
    if posix_pid is not None:
        where = f"pid {posix_pid} (as the lock manager names it)" if posix_pid > 0 else "a process"
        return Row(lock, NATIVE, HELD, f"a POSIX lock held by {where} on another node (F_GETLK from here); "
                   "released when that process ends", path, owner=st.st_uid, changed=st.st_mtime)
    return Row(lock, NATIVE, FREE, "a lock file nobody holds (flock and POSIX probes from here); lock files "
               "stay after release, as filelock leaves them", path, owner=st.st_uid, changed=st.st_mtime)


def _try_shared_flock(fd: int) -> str:
    """``blocked`` when someone holds flock on ``fd``'s file; a shared lock taken for a moment otherwise."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return "blocked" if exc.errno in oslocks.CONTENTION else "failed"
    fcntl.flock(fd, fcntl.LOCK_UN)
    return "free"


def _posix_holder(fd: int) -> int | None:
    """The pid of a POSIX lock holder on ``fd``'s file (0 when the lock manager gives none), or ``None``."""
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0).ljust(_FLOCK_SIZE, b"\0")
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        l_type, _, _, _, pid = struct.unpack(_FLOCK, answer[:struct.calcsize(_FLOCK)])
    except (OSError, struct.error):
        return None  # no POSIX locks on this filesystem (ENOLCK, ENOSYS): nobody holds one
    return None if l_type == fcntl.F_UNLCK else max(pid, 0)


def _local_holder(pid: int, how: str) -> dict[str, Any]:
    try:
        uid: int | None = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        uid = None
    from sharedfs.machinery import runtime

    return {"user": user_name(uid) if uid is not None else None, "uid": uid, "node": runtime.policy().node_id,
            "host": os.uname().nodename, "pid": pid, "boot": None, "job": None, "step": None, "since": None,
            "lock_kind": how.lower()}


def _torch_or_native(where: Directory, name: str, names: set[str], walk: Walk,
                     entry: os.DirEntry[str]) -> Row | None:
    """torch's ``<build_dir>/lock``: torch < 2.14's baton (held while it exists) or torch >= 2.14's flock file."""
    path = where.join(name)
    seen = _read(where, name, walk)
    if seen is None:
        return None
    if seen.record is not None and seen.record.kind == TORCH_BATON_KIND:
        state, evidence = judge(seen.record)
        if state == DEAD:
            evidence += ("; the next sharedfs build of this extension replaces it in one rename under the build "
                         "lock (torch without sharedfs may be polling it: it is never removed here)")
        return Row(path, TORCH_BATON, state, f"torch's extension build baton of a sharedfs builder: {evidence}",
                   path, record=seen.record, owner=seen.owner)
    row = _native_row(where, name, walk, entry)
    if row is None or row.state != FREE or not _torch_guard(names):
        return row
    row.kind, row.state = TORCH_BATON, UNKNOWN
    row.evidence = ("torch's extension build lock with no record: torch >= 2.14's flock file (then free: nobody "
                    "holds flock on it) or torch < 2.14's baton of a builder without sharedfs (held while it "
                    "exists; it waits forever for a killed one). Remove it only if no build of this extension "
                    "runs on any node")
    return row


# -- shard cache ------------------------------------------------------------------------------------


def _shard_record(where: Directory, name: str, part: str, walk: Walk) -> Row | None:
    kind = SHARD_CLAIM if part == "claims" else SHARD_READER
    path = lock = where.join(name)
    seen = _read(where, name, walk)
    if seen is None:
        return None
    record = seen.record
    if record is None:
        what = "an empty or garbled record" if seen.readable else _not_a_record(where, name, walk)[0]
        return Row(lock, kind, UNKNOWN, f"{what}: the shard cache keeps its shard for a minute after it last "
                   "changed, then removes it", path, owner=seen.owner)
    if record.kind == "published":
        return Row(lock, kind, FREE, "the shard's download finished (published); the claim lives as long as "
                   "the shard", path, record=record, owner=seen.owner)
    state, evidence = judge(record)
    if kind == SHARD_CLAIM:
        what = "a shard download in progress" if state != DEAD else "a download whose downloader is gone"
        after = "; the next download of the shard takes it over under the shard's lock" if state == DEAD else ""
    else:
        what = "a reader keeping its shard from eviction" if state != DEAD else "a reader that is gone"
        after = "; the next eviction removes it" if state == DEAD else ""
    return Row(lock, kind, state, f"{what}: {evidence}{after}", path, record=record, owner=seen.owner)


# -- judging: the one rule --------------------------------------------------------------------------


def judge(record: HolderRecord) -> tuple[str, str]:
    """(state, evidence) of a holder record: the ``sharedfs_holder_alive`` hook's answer, in words.

    ``unchanged_for`` is ``None``: this command has not watched the marker, so a lease is not
    judged by its expiry here (its waiters do that), only by the evidence for its process.
    """
    from sharedfs.machinery import runtime

    policy = runtime.policy()
    alive = runtime.registry().holder_alive(record, policy, None)
    local = record.node == policy.node_id and policy.node_id_trusted and record.same_process_space()
    job = f"{record.slurm_job}" + (f".{record.slurm_step}" if record.slurm_step else "") if record.slurm_job else ""
    if alive is True:
        if local:
            return HELD, f"pid {record.pid} is running on this node"
        if job:
            return HELD, f"Slurm reports job {job} as still active"
        return HELD, "a liveness plugin vouches for its holder"
    if alive is False:
        if local:
            return DEAD, (f"pid {record.pid} is gone from this node (same boot and PID namespace as the record), "
                          "or now belongs to a process that started later")
        if job:
            return DEAD, f"Slurm reports that job {job} ended"
        return DEAD, "a liveness plugin says its holder is gone"
    return UNKNOWN, _undecidable(record, policy, job)


def _undecidable(record: HolderRecord, policy: Any, job: str) -> str:
    """Why nobody here can tell, and what would make it decidable."""
    if record.node == policy.node_id and not policy.node_id_trusted:
        return (f"its record names node {record.node}, which is this process's node id, but that id conflicts with "
                "the scheduler's (see `sharedfs status`): unset SHAREDFS_NODE_ID and look again")
    if record.node == policy.node_id:
        return (f"its record names this node ({record.node}) but another boot or PID namespace (the node "
                "rebooted, a container, or two machines share the name): its pid means nothing here"
                + (f"; Slurm could not be asked about job {job}" if job else ""))
    scheduler = (f"Slurm could not be asked about job {job} (squeue/scontrol missing or not answering, or the "
                 "slurm plugin off): asking it from a node where squeue works also decides"
                 if job else "its record names no Slurm job to ask the scheduler about")
    return (f"it ran on node {record.node}, whose processes nobody here can see, and {scheduler}. To decide, run "
            f"this command on {record.node} (`ssh {record.node}` or `srun -w {record.node}`)")


# -- clearing ---------------------------------------------------------------------------------------


class ClearRefused(Exception):
    """This row's file stays: the directory does not let this user remove it, or (as root) its owner could not."""


def clear(row: Row, descent: Descent | None = None) -> bool:
    """Remove a dead row's file by its lock's own protocol; True when this call removed it.

    Everything happens in the row's directory as the walk reached it, opened again from the top
    through ``descent`` (which keeps what the previous row's clear opened, so each directory is
    opened once per clear, not once per level): a directory that changed since is not entered
    (:class:`Changed`, raised), so nothing outside the tree the operator named is ever removed,
    or created.
    """
    seen = row.seen
    if row.state != DEAD or seen is None or row.place is None:
        return False
    if descent is None:
        with Descent() as own:
            return _clear_in(own.enter(row.place), row, seen)
    return _clear_in(descent.enter(row.place), row, seen)


def _clear_in(where: Directory, row: Row, seen: _marker.Seen) -> bool:
    from sharedfs.machinery import runtime

    policy = runtime.policy()
    registry = runtime.registry()
    try:
        st = where.lstat(row.name)
    except FileNotFoundError:
        return False
    if (st.st_dev, st.st_ino, st.st_ctime_ns) != seen.identity:
        return False  # not the file that was judged dead
    if os.geteuid() == 0 and not owner_may_remove(where.stat(), st):
        # Root may remove anything anywhere; a clear acts for the dead holder, so it removes only what that
        # holder could have removed itself (a file planted where its owner may not write is not its lock).
        raise ClearRefused(f"{user_name(st.st_uid)} could not remove it from {where.path} (no write permission "
                           "there), so it is no lock of theirs to clear: root leaves it")

    def dead(other: HolderRecord) -> bool:
        return registry.holder_alive(other, policy, None) is False

    if row.kind == MARKER:
        breaker = HolderRecord.mine(policy.node_id, "break")
        try:
            for _ in range(3):  # another breaker's turn (a waiter breaking the same dead holder) ends in ms
                if _marker.break_in(where, row.name, seen, breaker, dead):
                    return True
                now = _marker.read_in(where, row.name)
                if now is None or now.data != seen.data or now.identity != seen.identity:
                    return False  # released, or broken and taken by someone else meanwhile: theirs now
                time.sleep(0.05)
        except _marker.NotAllowed:
            owner = user_name(row.owner) if row.owner is not None else "its owner"
            raise ClearRefused(f"it belongs to {owner} and its directory does not let you remove another user's "
                               "file (sticky or read-only); ask them or an administrator to run: "
                               f"sharedfs locks --clear-dead {row.lock}") from None
        return False
    if row.kind in (OWN_NAME, BREAK_TURN):
        # No taker ever writes these names again (an own name is derived from the dead taker's record,
        # a break turn is created O_EXCL): removing the file still exactly as read is all the protocol asks.
        if row.kind == OWN_NAME and st.st_nlink > 1:
            return False  # still the marker's second name: the marker's break removes both
        try:
            return where.unlink_if_same(row.name, identity(st))
        except OSError:
            return False
    return False


def _look_again(row: Row, descent: Descent) -> None:
    """A dead marker this run did not remove: what is there now (a waiter may have broken it and taken the lock)."""
    if row.place is None:
        return
    try:
        now = _marker.read_in(descent.enter(row.place), row.name or os.path.basename(row.file))
    except OSError:
        return
    if now is None:
        row.state, row.evidence = FREE, row.evidence + "; gone before this run removed it (released or broken)"
        return
    if now.record is None or now.identity == (row.seen.identity if row.seen else None):
        row.evidence += "; not removed this time (another process was breaking it): run again"
        return
    state, evidence = judge(now.record)
    row.record, row.state, row.seen = now.record, state, None
    row.evidence = f"broken and taken again while this run looked: now {evidence}"


# -- the command ------------------------------------------------------------------------------------


def selected(row: Row, older_than: float | None, user: str | None, now: float) -> bool:
    if user is not None:
        uid = row.record.uid if row.record is not None and row.record.uid is not None else row.owner
        if row.native_holder is not None:
            uid = row.native_holder.get("uid")
        if uid is None or user not in (user_name(uid), str(uid)):
            return False
    if older_than is not None:
        since = row.since
        if since is None or now - since < older_than:
            return False
    return True


def run(paths: list[str], *, clear_dead: bool = False, older_than: float | None = None, user: str | None = None,
        walk: Walk | None = None, say: Callable[[str], None] | None = None) -> tuple[list[Row], list[str], int]:
    """Rows, errors and the exit status of ``sharedfs locks``."""
    walk = walk or Walk()
    try:
        return _run(paths, clear_dead, older_than, user, walk)
    finally:
        walk.descent.close()
        for top in walk.tops:
            top.close()
        walk.tops.clear()


def _run(paths: list[str], clear_dead: bool, older_than: float | None, user: str | None,
         walk: Walk) -> tuple[list[Row], list[str], int]:
    now = time.time()
    rows: list[Row] = []
    errors: list[str] = []
    try:
        for _, found in find(paths, walk):
            # A subtree not walked is said whatever the selection: what is below it may be selected.
            rows.extend(row for row in found if row.kind == TOO_DEEP or selected(row, older_than, user, now))
    finally:
        walk.show(done=True)
    errors.extend(walk.errors)
    if clear_dead:
        with Descent(walk.call) as descent:
            _clear_dead(rows, walk, errors, descent)
    status = EXIT_HELD if any(r.state in (HELD, UNKNOWN) for r in rows) or walk.skipped else EXIT_FREE
    if errors:
        status = EXIT_ERROR
    return rows, errors, status


def _clear_dead(rows: list[Row], walk: Walk, errors: list[str], descent: Descent) -> None:
    # Markers first: an own-name file that is a dead marker's second name goes with its marker.  Each kind in the
    # walk's order, so the descent reopens only the levels one row's directory does not share with the last.
    for row in sorted((r for r in rows if r.state == DEAD and r.seen is not None),
                      key=lambda r: r.kind != MARKER):
        try:
            row.cleared = clear(row, descent)
        except ClearRefused as refused:
            row.cleared = False
            errors.append(f"cannot remove {row.file}: {refused}")
            continue
        except Changed as exc:
            row.cleared = False
            walk.skipped.append(f"not removed {row.file}: {exc.filename} {exc.strerror} since the walk "
                                "listed it (nothing outside the tree is touched)")
            continue
        except OSError as exc:
            row.cleared = False
            errors.append(f"cannot remove {row.file}: {exc.strerror or exc}")
            continue
        if row.cleared:
            log.info("removed %s (%s)", row.file, row.evidence)
        elif row.kind == MARKER:
            _look_again(row, descent)


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def holder_text(row: Row, now: float) -> str:
    holder = row.holder()
    if holder is None:
        owner = f"file of {row.user}" if row.user else "no record"
        age = f", last changed {_age(now - row.changed)} ago" if row.changed is not None else ""
        return owner + age
    parts = [holder["user"] or "?", f"pid {holder['pid']}", f"node {holder['node']}"]
    if holder.get("job"):
        parts.append(f"Slurm job {holder['job']}" + (f".{holder['step']}" if holder.get("step") else ""))
    if holder.get("since"):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
        parts.append(f"since {when} ({_age(now - holder['since'])})")
    return ", ".join(parts)


def text_lines(rows: list[Row], *, cleared: bool, single: bool) -> list[str]:
    now = time.time()
    lines = []
    free = 0
    for row in rows:
        if row.state == FREE and not single:
            free += 1
            continue
        state = row.state.upper() + (" (removed)" if row.cleared else "")
        kind = row.kind if row.record is None or row.kind != MARKER else f"{row.record.kind} marker"
        lines.append(f"{state:<16} {kind:<14} {row.lock}")
        lines.append(f"{'':<16} holder   : {holder_text(row, now)}")
        lines.append(f"{'':<16} evidence : {row.evidence}")
        if row.file != row.lock:
            lines.append(f"{'':<16} file     : {row.file}")
    counts = {state: sum(1 for r in rows if r.state == state) for state in (HELD, DEAD, UNKNOWN)}
    summary = (f"{counts[HELD]} held, {counts[DEAD]} dead, {counts[UNKNOWN]} unknown"
               + (f"; {free} free lock files not shown" if free else ""))
    lines.append(summary if lines else f"no lock is held here ({summary})")
    removed = sum(1 for r in rows if r.cleared)
    if cleared:
        lines.append(f"removed {removed} dead marker(s) through the lock's own breaking protocol")
    elif counts[DEAD]:
        lines.append("dead holders' markers can be removed safely with: sharedfs locks --clear-dead PATH "
                     "(live holders, and holders nobody here can vouch for, keep their locks)")
    if counts[UNKNOWN]:
        lines.append("unknown is never cleared: run this command where the holder ran, or where the scheduler "
                     "can be asked (see each evidence line)")
    return lines


def main(paths: list[str], *, as_json: bool, clear_dead: bool, older_than: float | None,
         user: str | None) -> int:
    import json

    if older_than is not None and not older_than >= 0:
        print(f"sharedfs locks: --older-than must be a number of seconds >= 0, not {older_than}", file=sys.stderr)
        return EXIT_ERROR
    if user is not None and not _known_user(user):
        print(f"sharedfs locks: --user {user}: no such user (give a user name or a numeric uid)", file=sys.stderr)
        return EXIT_ERROR
    walk = Walk()
    try:
        rows, errors, status = run(paths, clear_dead=clear_dead, older_than=older_than, user=user, walk=walk)
    except LocksError as exc:
        print(f"sharedfs locks: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if as_json:
        print(json.dumps([row.as_json() for row in rows], indent=2))
    else:
        single = all(not os.path.isdir(p) for p in paths)
        # A subtree not walked is not a lock: its line goes to stderr with the skipped ones.
        listed = [row for row in rows if row.kind != TOO_DEEP]
        print("\n".join(text_lines(listed, cleared=clear_dead, single=single)))
    for line in walk.skipped:
        print(f"sharedfs locks: {line}", file=sys.stderr)
    for error in errors:
        print(f"sharedfs locks: {error}", file=sys.stderr)
    return status


def _known_user(user: str) -> bool:
    """A user name this system knows, or a numeric uid (a departed user's files keep theirs)."""
    if user.isdigit():
        return True
    import pwd

    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


__all__ = ["EXIT_ERROR", "EXIT_FREE", "EXIT_HELD", "LocksError", "Row", "Walk", "judge", "main", "run"]
