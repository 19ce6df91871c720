"""``sharedfs locks``'s walk: each PATH's directories opened by descriptor, each entry handed to its format's reader."""

from __future__ import annotations

import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterator

from sharedfs.fs import oslocks
from sharedfs.fs.directory import Changed, Directory, Identity, identity
from sharedfs.locks import _marker
from sharedfs.locks.markerfiles import OWN_NAME_PATTERN, break_turn_row, marker_row, own_name_row
from sharedfs.locks.names import TORCH_BATON_NAME, TORCH_GUARD_SUFFIX
from sharedfs.locks.nativeprobe import NATIVE_SUFFIX, native_row
from sharedfs.locks.rows import FREE, MARKER, TOO_DEEP, UNKNOWN, Row
from sharedfs.locks.torchbaton import torch_baton_row, torch_guard
from sharedfs.shardcache.coordination import PARTS, in_coordination_tree, shard_record_row, sibling_name

__all__ = ["MAX_DEPTH", "Descent", "LocksError", "Place", "Walk", "find"]

#: Filesystem calls per second the walk makes at most: a metadata server (Lustre MDS, an NFS
#: server) serves every node of the cluster, and one person's look must not slow their jobs down.
MAX_CALLS_PER_SECOND = 2000.0
#: Levels below a PATH the walk descends at most.  A framework's cache is a few levels deep (plus the folders
#: of a repository or an archive it holds); a deeper directory is reported, not walked, so a member's chain of
#: thousands of directories costs at most this many levels (and this many open descriptors, one per level).
MAX_DEPTH = 128
#: A terminal sees progress (on stderr) once a walk takes this long, then at most this often.
PROGRESS_AFTER = 1.0


class LocksError(Exception):
    """Bad input (a path that does not exist): said in one line, nothing is touched."""


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
_LOCK_NAMES = re.compile(r".*(" + re.escape(NATIVE_SUFFIX) + "|" + re.escape(_marker.SUFFIX) + ")|"
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
    sibling = sibling_name(top.path)
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
    in_shard_tree = in_coordination_tree(path)
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
    if part in PARTS:
        return shard_record_row(where, name, part, walk)
    if name.endswith(_marker.SUFFIX):
        return marker_row(where, name, walk)
    if name.endswith(_marker.SUFFIX + _marker.BREAK_SUFFIX):
        return break_turn_row(where, name, walk)
    own = OWN_NAME_PATTERN.fullmatch(name)
    if own is not None:
        return own_name_row(where, name, own.group(1), walk)
    if name + _marker.SUFFIX in names and not single:
        return None  # the marker's row speaks for this lock (a native kind on a shared filesystem takes both)
    if name == TORCH_BATON_NAME and (torch_guard(names) or part == ""):
        return torch_baton_row(where, name, names, walk, entry)
    if name.endswith(NATIVE_SUFFIX) or name == TORCH_BATON_NAME + TORCH_GUARD_SUFFIX or part == "stripes" or single:
        return native_row(where, name, walk, entry)
    return None

