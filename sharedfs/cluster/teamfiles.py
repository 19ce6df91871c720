"""Team caches: what this process creates in a cache a group of users shares becomes the group's.

Recorded by an audit hook and given to the group by descriptor, never via the umask (docs/security.md, Team caches).
"""

from __future__ import annotations

import atexit
import logging
import os
import stat
import struct
import sys
import threading
import time
from collections.abc import Iterable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, Callable

from sharedfs.fs import trustedpath
from sharedfs.fs.safefile import NOFOLLOW
from sharedfs.model.records import group_name

if TYPE_CHECKING:  # pragma: no cover
    from sharedfs.model.policy import Policy, TeamCache

__all__ = ["CODE_ROOTS", "WATCHED", "SettlingLockMixin", "default_acl_group", "give", "give_fd", "give_tree",
           "group_mode", "is_code_root", "refuse", "refused", "settle_pending", "settling", "team_of", "watch"]

#: ``system.posix_acl_default``: a 4-byte version header, then (tag u16, perm u16, id u32) entries.
_ACL_VERSION = 2
_ACL_GROUP = 0x08  # a named group entry
_ACL_WRITE = 0x02
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT


def default_acl_group(directory: str) -> int | None:
    """The first named group the default ACL of ``directory`` grants write access, if any."""
    try:
        raw = os.getxattr(directory, "system.posix_acl_default")
    except (OSError, AttributeError):  # no ACL, a filesystem without them, or no xattr support
        return None
    if len(raw) < 4 or struct.unpack_from("<I", raw)[0] != _ACL_VERSION:
        return None
    for offset in range(4, len(raw) - 7, 8):
        tag, perm, ident = struct.unpack_from("<HHI", raw, offset)
        if tag == _ACL_GROUP and perm & _ACL_WRITE:
            return ident
    return None


#: Write bits a file under a code root never keeps: only its owner may change code others import.
CODE_WRITERS = stat.S_IWGRP | stat.S_IWOTH


def group_mode(mode: int, is_dir: bool, code: bool = False, top: bool = False) -> int:
    """``mode`` with the group's bits of a team cache added: dirs g+rwx and setgid, files g+rw (g+x if u+x).

    ``code`` (a module cache): files g+r and never group- or world-writable, dirs also sticky;
    its ``top`` directory (on ``sys.path``) g+rx and setgid, never group- or world-writable.
    """
    if is_dir and top:
        return (mode | stat.S_IRGRP | stat.S_IXGRP | stat.S_ISGID) & ~CODE_WRITERS
    if is_dir:
        return mode | stat.S_IRWXG | stat.S_ISGID | (stat.S_ISVTX if code else 0)
    if code:
        return (mode | stat.S_IRGRP | ((mode & stat.S_IXUSR) >> 3)) & ~CODE_WRITERS
    return mode | stat.S_IRGRP | stat.S_IWGRP | ((mode & stat.S_IXUSR) >> 3)


def give_fd(fd: int, team: TeamCache, st: os.stat_result | None = None, code: bool = False,
            top: bool = False) -> bool:
    """Give the file or directory open as ``fd`` (the caller's own) the team's group and bits.

    True when something changed.  Never raises: an entry that cannot be changed stays as it
    is (its owner sees it as before; ``sharedfs doctor`` reports it).
    """
    try:
        st = st or os.fstat(fd)
        changed = False
        if st.st_gid != team.gid:
            os.fchown(fd, -1, team.gid)  # a member may give her own file to her group
            changed = True
        mode = stat.S_IMODE(st.st_mode)
        want = group_mode(mode, stat.S_ISDIR(st.st_mode), code, top)
        if want != mode or (changed and not stat.S_ISDIR(st.st_mode)):
            os.fchmod(fd, want)
            changed = True
        return changed
    except OSError:
        return False


# -- watched roots ----------------------------------------------------------------------------------


class _Roots(MutableMapping[str, "TeamCache"]):
    """The watched cache roots (real paths) and their teams.

    A mapping so that a shim registers a root through its patcher (``unpatch`` forgets it,
    ``sharedfs status`` lists it); the audit hook reads an immutable snapshot.
    """

    __name__ = "sharedfs.cluster.teamfiles.WATCHED"

    def __init__(self) -> None:
        self._data: dict[str, TeamCache] = {}
        self.prefixes: tuple[tuple[str, str, TeamCache], ...] = ()  # (spelling + sep, real root, team)
        self._spellings: dict[str, str] = {}  # path as the framework spells it -> real root

    def __getitem__(self, key: str) -> TeamCache:
        return self._data[key]

    def __setitem__(self, key: str, value: TeamCache) -> None:
        self._data[key] = value
        self._rebuild()

    def __delitem__(self, key: str) -> None:
        del self._data[key]
        self._rebuild()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def spell(self, spelling: str, real: str) -> None:
        self._spellings[spelling] = real
        self._rebuild()

    def _rebuild(self) -> None:
        spellings = {real: real for real in self._data}
        spellings.update({s: r for s, r in self._spellings.items() if r in self._data})
        self.prefixes = tuple(sorted(((s.rstrip(os.sep) + os.sep, r, self._data[r]) for s, r in spellings.items()),
                                     key=lambda item: -len(item[0])))

    def root_of(self, path: str) -> tuple[str, TeamCache] | None:
        """The real root and team of the watched root ``path`` lies in (or is), if any."""
        probe = path + os.sep
        for prefix, real, team in self.prefixes:
            if probe.startswith(prefix):
                return real, team
        return None


WATCHED = _Roots()
#: The watched roots (real paths) that hold code others import (module caches) -> the packages made in them.
CODE_ROOTS: dict[str, tuple[str, ...]] = {}
_answers: dict[str, bool] = {}  # absolute root -> whether it is a team cache (asked once per process)
_watch_lock = threading.Lock()


def team_of(directory: str, policy: Policy) -> TeamCache | None:
    """The plugins' ``sharedfs_team_cache`` answer for ``directory`` (or its nearest existing ancestor)."""
    from sharedfs.machinery import choices
    return choices.team_cache(os.path.abspath(directory), policy)


#: Real paths of roots refused because of a planted symlink: a framework that resolved the symlink itself
#: (datasets names its lock files by the real path) must not find them the team's under another spelling.
_refused: set[str] = set()


def refused(resolved: trustedpath.Resolved) -> bool:
    """Whether a directory (resolved) is reached through a planted symlink, or lies where a refused root led."""
    if resolved.planted is not None:
        return True
    probe = resolved.real.rstrip(os.sep) + os.sep
    return any(probe.startswith(real.rstrip(os.sep) + os.sep) for real in tuple(_refused))


def refuse(spelled: str, resolved: trustedpath.Resolved, policy: Policy | None = None) -> None:
    """Say once, as a warning, that ``spelled`` gets no team treatment because of the planted symlink on its way.

    The framework then works there exactly as it does without sharedfs (it follows the
    symlink and writes with the user's umask); sharedfs widens nothing and creates nothing
    beside where it points.
    """
    planted = resolved.planted
    assert planted is not None
    with _watch_lock:
        _refused.add(resolved.real)
    group = ""
    if policy is not None and policy.shared_group:
        group = f" (SHAREDFS_SHARED_GROUP={policy.shared_group})"
    from sharedfs.machinery.log import decision

    decision(f"{spelled} is not treated as a team cache{group}: it is reached through the symlink {planted.link} "
             f"-> {planted.target}, made by {planted.who()}, and {planted.why()}; sharedfs changes no permissions "
             f"and creates nothing where it points ({resolved.real}). If that is the place you mean, give its "
             f"real path instead; otherwise ask {planted.who()} or an administrator to remove the symlink",
             level=logging.WARNING)


def is_code_root(real_root: str) -> bool:
    """Whether the watched root ``real_root`` (a real path) holds code: see docs/frameworks/transformers.md."""
    return real_root in CODE_ROOTS


def watch(root: str | os.PathLike[str], policy: Policy, patcher: Any = None, *,
          code: tuple[str, ...] = ()) -> TeamCache | None:
    """Give the group what this process creates under ``root`` (a framework's cache), if it is a team cache.

    Asks the plugins once per root; a team cache's root is given to the group at once (if
    this user made it) and watched from now on.  ``patcher`` (a shim's) makes ``unpatch``
    stop watching it.  ``code``: the root is a module cache, whose files the group may read,
    never write, and these are the packages kept in it (docs/frameworks/transformers.md).  Returns the team,
    or ``None`` for a private cache.
    """
    absolute = os.path.abspath(os.fspath(root))
    if _answers.get(absolute) is False:
        return None
    resolved = trustedpath.resolve(absolute)
    real = resolved.real
    team = WATCHED.get(real) if resolved.planted is None else None
    if team is None:
        if resolved.planted is not None:
            # What would be widened is wherever the symlink points, chosen by whoever made it.
            _answers[absolute] = False
            refuse(absolute, resolved, policy)
            return None
        team = team_of(absolute, policy)
        with _watch_lock:
            _answers[absolute] = team is not None
            if team is None:
                return None
            if patcher is not None:
                patcher.setitem(WATCHED, real, team)
            else:
                WATCHED[real] = team
            if absolute != real:
                WATCHED.spell(absolute, real)
        _install()
        from sharedfs.machinery.log import decision

        decision(f"team cache {absolute}: what this process creates there becomes group "
                 f"{group_name(team.gid)}'s ({team.reason})")
    elif absolute != real and absolute not in WATCHED._spellings:
        WATCHED.spell(absolute, real)
    if code and not set(code) <= set(CODE_ROOTS.get(real, ())):
        packages = tuple(sorted({*CODE_ROOTS.get(real, ()), *code}))
        if patcher is not None:
            patcher.setitem(CODE_ROOTS, real, packages)
        else:
            CODE_ROOTS[real] = packages
    give(absolute)
    return team


# -- the recorder ------------------------------------------------------------------------------------

#: A recorded entry is the group's at most this long after it was made, lock or no lock.
DRAIN_DELAY = 1.0
#: The hook records a creation just before it happens: an entry not there yet is looked for again
#: for this long (the open or mkdir is still running, or failed).
MISSING_FOR = 5.0

#: ("new", path, when) or ("rename", src, dst, when), in the order they happened; appended by the audit hook.
_pending: list[tuple[Any, ...]] = []
_drain = threading.Lock()
_installed = False
_quiet = threading.local()  # set while this module itself works: its own opens are not recorded
_wake = threading.Event()
_drainer: threading.Thread | None = None  # this process's; a forked child starts its own


def _install() -> None:
    global _installed
    with _watch_lock:
        if _installed:
            return
        _installed = True
    sys.addaudithook(_hook)
    atexit.register(settle_pending)
    os.register_at_fork(after_in_child=_forked)


def _forked() -> None:
    """In a forked child: the parent gives its own records; locks another thread held at fork are free again."""
    global _drain, _watch_lock, _wake, _drainer
    _pending.clear()
    _drain, _watch_lock, _wake, _drainer = threading.Lock(), threading.Lock(), threading.Event(), None


def _start_drainer() -> None:
    global _drainer
    with _watch_lock:
        if _drainer is not None:
            return
        _drainer = threading.Thread(target=_drain_loop, name="sharedfs-teamfiles", daemon=True)
    _drainer.start()


def _drain_loop() -> None:
    """Give what was recorded, a moment after it was: one pass per DRAIN_DELAY while records come in."""
    while True:
        _wake.wait()
        time.sleep(DRAIN_DELAY)  # a burst of creations is given in one pass
        _wake.clear()
        try:
            settle_pending()
        except Exception:  # noqa: BLE001 - a background pass must never end the thread; the next one retries
            pass


def _spelled(path: Any) -> str | None:
    if isinstance(path, int):
        return None  # a descriptor: nothing to record
    try:
        return os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return None


def _hook(event: str, args: tuple[Any, ...]) -> None:
    """Record what this process creates under a watched root.  Never raises, never acts."""
    if event == "open":
        try:
            path, mode, flags = args
        except ValueError:
            return
        if not (flags & _WRITES or (isinstance(mode, str) and any(c in mode for c in "wax+"))):
            return
        kind = "new"
    elif event == "os.mkdir":
        path, kind = args[0], "new"
        if len(args) > 2 and args[2] not in (-1, None):
            return  # relative to a directory descriptor: the caller (sharedfs.shardcache) gives it
    elif event == "os.rename":
        path, kind = args[1], "rename"
        if len(args) > 3 and (args[2] not in (-1, None) or args[3] not in (-1, None)):
            return
    elif event == "os.chmod":
        path, kind = args[0], "new"
        if len(args) > 2 and args[2] not in (-1, None):
            return
    else:
        return
    if not WATCHED.prefixes or getattr(_quiet, "on", False):
        return
    try:
        spelled = _spelled(path)
        if spelled is None:
            return
        if kind == "rename":
            source = _spelled(args[0])
            if source is None or not (WATCHED.root_of(source) or WATCHED.root_of(spelled)):
                return
            _pending.append(("rename", source, spelled, time.monotonic()))
        elif WATCHED.root_of(spelled):
            _pending.append(("new", spelled, time.monotonic()))
        else:
            return
        if _drainer is None:
            _start_drainer()
        _wake.set()
    except Exception:  # noqa: BLE001 - an audit hook that raises fails the audited call
        return


def settle_pending() -> int:
    """Give the group everything recorded so far; returns how many entries changed."""
    if not _pending:
        return 0
    with _drain:
        records = _pending[:]
        del _pending[: len(records)]  # the hook may append meanwhile: keep what came after
        paths: dict[str, float] = {}  # path -> when it was recorded, in order
        for record in records:
            if record[0] == "new":
                paths[record[1]] = record[2]
                continue
            _, source, target, when = record
            moved = {}
            for path, seen in paths.items():
                if path == source or path.startswith(source + os.sep):
                    moved[path] = (target + path[len(source):], seen)
            for old, (new, seen) in moved.items():
                del paths[old]
                paths[new] = seen
            paths[target] = when
        changed, again, now = 0, [], time.monotonic()
        for path in sorted(paths, key=lambda p: p.count(os.sep)):
            if os.path.lexists(path):
                changed += give(path)
            elif now - paths[path] < MISSING_FOR:
                again.append(("new", path, paths[path]))  # recorded just before it was made: look again
        if again:
            _pending[:0] = again  # before anything recorded meanwhile (a later rename must still move them)
            _wake.set()
        return changed


# -- giving entries to the group -----------------------------------------------------------------------


def give(path: str | os.PathLike[str]) -> bool:
    """Give the entry ``path`` to its team cache's group, if it is this user's and lies in a watched root.

    By descriptor: never a symlink, never a file with other links, never anything whose real
    path left the root.  True when something changed.
    """
    spelled = os.path.abspath(os.fspath(path))
    found = WATCHED.root_of(spelled)
    if found is None:
        return False
    real_root, team = found
    _quiet.on = True
    try:
        try:
            fd = os.open(spelled, os.O_RDONLY | NOFOLLOW)
        except OSError:
            return False  # gone, a symlink, or not readable by its owner
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                return False
            if not stat.S_ISDIR(st.st_mode) and not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1):
                return False
            packages = CODE_ROOTS.get(real_root)
            code = packages is not None
            top = code and stat.S_ISDIR(st.st_mode) and real_root in (spelled, WATCHED._spellings.get(spelled))
            if want_unchanged(st, team, code, top) and not top:
                return False
            try:
                real = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                return False  # cannot prove where it is: leave it
            if real != real_root and not real.startswith(real_root + os.sep):
                return False
            top = code and stat.S_ISDIR(st.st_mode) and real == real_root
            if top and packages:
                _make_packages(fd, spelled, packages)  # each time: another framework's process may come first
            return give_fd(fd, team, st, code, top)
        finally:
            os.close(fd)
    finally:
        _quiet.on = False


def want_unchanged(st: os.stat_result, team: TeamCache, code: bool = False, top: bool = False) -> bool:
    """Whether the entry ``st`` already has the team's group and bits."""
    mode = stat.S_IMODE(st.st_mode)
    return st.st_gid == team.gid and group_mode(mode, stat.S_ISDIR(st.st_mode), code, top) == mode


def _make_packages(fd: int, spelled: str, packages: tuple[str, ...]) -> None:
    """Make the frameworks' package directories in a code root (open as ``fd``) before the group loses
    write access to it: a member whose framework comes second then adds to hers (diffusers#1517)."""
    for name in packages:
        try:
            os.mkdir(name, 0o777, dir_fd=fd)
        except FileExistsError:
            pass
        except OSError:
            continue
        give(os.path.join(spelled, name))


def give_tree(top: str | os.PathLike[str], limit: int = 100_000) -> int:
    """Give the group every entry of this user under ``top`` (``top`` included); never follows symlinks.

    For what the recorder cannot see (files forked workers wrote).  Returns how many changed.
    """
    top = os.path.abspath(os.fspath(top))
    if WATCHED.root_of(top) is None:
        return 0
    changed = int(give(top))
    seen = 0
    for dirpath, dirnames, filenames in os.walk(top):
        for name in (*dirnames, *filenames):
            seen += 1
            if seen > limit:
                return changed
            changed += give(os.path.join(dirpath, name))
    return changed


# -- framework locks ----------------------------------------------------------------------------------


class SettlingLockMixin:
    """Put in front of a framework's (sharedfs drop-in) lock class: the group gets what was made around it.

    Before a lock is tried, the directories the framework just made for it are the group's
    (members can then create their own lock files and entries there); before it is
    released, whatever the holder made under it is.
    """

    #: Finds the team cache a lock file belongs to (the hub: the parent of ``.locks``), or None.
    _sharedfs_team_root: Callable[[str], str | None] | None = None
    #: Set when sharedfs started watching at the framework's first lock (a stand-in): the directories
    #: the framework made for that lock before then, given to the group once (see :func:`settling`).
    _sharedfs_catch_up: Callable[[str], Iterable[str]] | None = None

    def _acquire(self) -> None:
        cls = type(self)
        finder = cls._sharedfs_team_root
        if finder is not None and not self.__dict__.get("_sharedfs_watched"):
            self.__dict__["_sharedfs_watched"] = True
            root = finder(os.path.abspath(self.lock_file))  # type: ignore[attr-defined]
            policy = getattr(self, "_sharedfs_policy", None)
            if root is not None and policy is not None:
                watch(root, policy)
        if cls.__dict__.get("_sharedfs_catch_up") is not None:
            catch_up = cls._sharedfs_catch_up  # the function (a staticmethod in the class)
            cls._sharedfs_catch_up = None  # once per class: later creations are recorded as they happen
            for top in catch_up(os.path.abspath(self.lock_file)):  # type: ignore[attr-defined,misc]
                give_tree(top)  # only inside a watched team cache; nothing elsewhere
        settle_pending()
        super()._acquire()  # type: ignore[misc]

    def _release(self) -> None:
        settle_pending()
        super()._release()  # type: ignore[misc]


def settling(cls: type, team_root: Callable[[str], str | None] | None = None,
             catch_up: Callable[[str], Iterable[str]] | None = None) -> type:
    """``cls`` (a lock class) with :class:`SettlingLockMixin` in front; same name, module and documentation.

    ``catch_up`` (for a shim applied late, at the framework's first lock) names, from that
    first lock file, the directories the framework made for it while sharedfs was not yet
    watching; what this user made there is given to the group once, before the lock is tried.
    """
    namespace: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                 "__doc__": cls.__doc__}
    if team_root is not None:
        namespace["_sharedfs_team_root"] = staticmethod(team_root)
    if catch_up is not None:
        namespace["_sharedfs_catch_up"] = staticmethod(catch_up)
    return type(cls.__name__, (SettlingLockMixin, cls), namespace)
