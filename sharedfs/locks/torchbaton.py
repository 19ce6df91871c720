"""torch's build baton (torch < 2.14) and build lock (>= 2.14) under a sharedfs lock, and their files read back.

The torch shim only wires these into ``torch.utils.cpp_extension``: docs/architecture.md, "The torch shims".
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from sharedfs.fs.directory import Directory
from sharedfs.fs.polledfile import create_whole, read_with_identity, record_beside, replace_foreign, unlink_quietly
from sharedfs.fs.recordfile import identity as _identity
from sharedfs.fs.recordfile import unlink_if_same
from sharedfs.locks import _marker
from sharedfs.locks.names import TORCH_BATON_KIND, TORCH_BATON_NAME, TORCH_GUARD_SUFFIX
from sharedfs.locks.nativeprobe import native_row
from sharedfs.locks.reporting import REPORT_AFTER, REPORT_EVERY
from sharedfs.locks.rows import DEAD, FREE, TORCH_BATON, UNKNOWN, Looker, Row, judge, read
from sharedfs.locks.stock import EXISTENCE, FLOCK, StockLockFile, stock_mechanism
from sharedfs.machinery.log import decision
from sharedfs.model.records import HolderRecord

if TYPE_CHECKING:
    from sharedfs.model.policy import Policy

__all__ = ["SharedFSBaton", "SharedFSBuildLock", "baton_class", "build_lock_class", "torch_baton_row", "torch_guard",
           "torch_lock_class"]

log = logging.getLogger("sharedfs")


class SharedFSBaton:
    """``FileBaton`` for ``cpp_extension._jit_compile``, whose protocol is kept: ``try_acquire`` ->
    build under the baton -> ``release``; else ``wait`` -> load.

    ``try_acquire`` waits for the sharedfs lock ``<build_dir>/lock.sharedfs`` (forever, as
    torch waits; its holder record lets sharedfs break it when the holder is dead, and a
    long wait names the holder) and then always answers True: every process runs torch's
    build step under the lock before it loads.  That step is ninja, which rebuilds exactly
    what a killed build left unfinished (an output without a ``.ninja_log`` entry) and is a
    no-op once the extension is built, so no process ever loads a half-built module.

    Inside the lock the process also holds torch's own baton ``<build_dir>/lock``, with its
    holder record in it, so torch without sharedfs (another environment, or
    ``SHAREDFS_DISABLE``) sharing the directory waits for sharedfs builders and is waited for:

    * a baton holding a sharedfs record while this process holds the lock was left by a
      sharedfs builder that died (a live one would still hold the lock): it is replaced by this
      process's in one rename (:func:`replace_foreign`), never removed first;
    * an empty baton is torch's own, from a builder without sharedfs that nobody can
      vouch for: it is waited out as torch does, saying after 30 s which file to remove.
    """

    #: The policy this class applies (set on the per-policy subclass :func:`baton_class` makes).
    policy: Policy

    def __init__(self, lock_file_path: str, wait_seconds: float = 0.1, warn_after_seconds: float | None = None) -> None:
        self.lock_file_path = lock_file_path
        self.wait_seconds = wait_seconds
        self.warn_after_seconds = warn_after_seconds
        self.fd = None  # torch's attribute; the baton holds no descriptor here
        self._held: tuple[int, int] | None = None  # (st_dev, st_ino) of the baton this process created
        from sharedfs.locks._api import lock  # filelock loads at the first build, not at torch's import

        self._guard = lock(lock_file_path + TORCH_GUARD_SUFFIX, timeout=-1, policy=self.policy)

    def try_acquire(self) -> bool:
        self._guard.acquire()
        try:
            self._take_baton()
        except BaseException:
            self._guard.release()
            raise
        return True

    def wait(self) -> None:
        """Unused (:meth:`try_acquire` always builds); kept for callers of torch's interface: wait until free."""
        with self._guard:
            self._wait_for_foreign_baton()

    def release(self) -> None:
        try:
            if self._held is not None:
                unlink_if_same(self.lock_file_path, self._held)
                self._held = None
        finally:
            self._guard.release()

    # -- torch's baton, taken while the sharedfs lock is held -----------------------------------------

    def _take_baton(self) -> None:
        record = HolderRecord.mine(self.policy.node_id, TORCH_BATON_KIND).to_bytes()
        while True:
            held = create_whole(self.lock_file_path, record)
            if held is None:
                held = self._take_over_from_dead_sharedfs_builder(record)
            if held is not None:
                self._held = held
                return
            self._wait_for_foreign_baton()

    def _take_over_from_dead_sharedfs_builder(self, record: bytes) -> tuple[int, int] | None:
        """This process's baton in place of one a dead sharedfs builder left (identity), else ``None``.

        Replaced in one rename (:func:`replace_foreign`), never removed and created again: torch
        without sharedfs waiting in ``FileBaton.wait()`` would see it gone in between and load the
        extension the dead builder left half-built.
        """
        seen = read_with_identity(self.lock_file_path)
        if seen is None:
            return None  # released meanwhile: the next attempt creates it
        data, identity = seen
        left = HolderRecord.parse(data) if data else None
        if left is None or left.kind != TORCH_BATON_KIND:
            return None
        # This process holds the lock every sharedfs builder holds while its baton exists: that builder is gone.
        ours = record_beside(self.lock_file_path, record)
        try:
            mine = _identity(os.lstat(ours))
            if not replace_foreign(self.lock_file_path, identity, ours):
                return None
        finally:
            unlink_quietly(ours)
        decision(f"torch extension build in {os.path.dirname(self.lock_file_path)} was left unfinished by "
                 f"{left.describe()}, which is gone; building it again", level=logging.WARNING, every_rank=True)
        return mine

    def _wait_for_foreign_baton(self) -> None:
        """Wait, as torch does, while a baton of torch without sharedfs exists; say what it is after a while."""
        started = time.monotonic()
        report_at = started + REPORT_AFTER
        while True:
            seen = read_with_identity(self.lock_file_path)
            if seen is None:
                return
            data = seen[0]
            record = HolderRecord.parse(data) if data else None
            if record is not None and record.kind == TORCH_BATON_KIND:
                return  # a sharedfs baton: the caller decides about it under the lock
            now = time.monotonic()
            if now >= report_at:
                report_at = now + REPORT_EVERY
                log.warning("still waiting after %.0f s for %s, the build lock of a torch process without sharedfs "
                            "(another environment, or SHAREDFS_DISABLE): it holds no record, so nobody can tell "
                            "whether its builder still runs, and torch waits for it forever. If no build of this "
                            "extension runs on any node, remove it: rm -f %s",
                            now - started, self.lock_file_path, self.lock_file_path)
            time.sleep(self.wait_seconds)


_baton_classes: dict[tuple[type, Policy], type] = {}
_baton_lock = threading.Lock()


def baton_class(original: type, policy: Policy, module: str = __name__) -> type:
    """``SharedFSBaton`` under ``policy``, a subclass of torch's ``FileBaton`` (``isinstance`` keeps working)."""
    with _baton_lock:
        made = _baton_classes.get((original, policy))
        if made is None:
            made = type(original.__name__, (SharedFSBaton, original), {
                "__module__": module, "__qualname__": original.__qualname__, "policy": policy,
                "__doc__": f"sharedfs drop-in for {original.__module__}.{original.__qualname__}: " +
                           (SharedFSBaton.__doc__ or ""),
            })
            _baton_classes[(original, policy)] = made
        return made


# -- torch >= 2.14: torch.utils._filelock.FileLock(<build_dir>/lock) ------------------------------------


class SharedFSBuildLock:
    """In front of a drop-in of ``torch.utils._filelock.FileLock``: cpp_extension's build lock (torch >= 2.14).

    ``acquire`` takes the sharedfs lock on ``<build_dir>/lock`` (its kind chosen for the
    filesystem, with a holder record: a dead builder is recognised on any node), then --
    unless that already is a flock of the file itself -- torch's own ``<build_dir>/lock`` the
    way torch without sharedfs holds it there (:class:`~sharedfs.locks.stock.StockLockFile`), waiting for it as
    torch waits.  So a builder of another environment (or ``SHAREDFS_DISABLE``) sharing the
    directory waits for sharedfs's builders and is waited for.  The last release lets go of
    torch's file first.
    """

    lock_file: str
    kind: str
    timeout: float
    _context: Any
    _sharedfs_policy: Policy | None

    def acquire(self, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        if not self.__dict__.get("_sharedfs_fitted"):
            self._fit_kind_to_stock_lock()
        proxy = super().acquire(*args, **kwargs)  # type: ignore[misc]
        fd = self._context.lock_file_fd
        holds: dict[int, StockLockFile | None] = self.__dict__.setdefault("_sharedfs_stock", {})
        if fd is None or fd in holds:
            return proxy  # re-entered: this hold already has torch's file
        try:
            holds[fd] = self._hold_stock_file(started, args, kwargs)
        except BaseException:
            self.release()  # type: ignore[attr-defined]
            raise
        return proxy

    def _fit_kind_to_stock_lock(self) -> None:
        """Where torch's own lock is the file's existence (flock answers ENOSYS), sharedfs's lock on that file is an
        existence lock (its marker) too: a native kind would open the file to lock it, create it, and leave it
        behind, which torch without sharedfs takes for a lock held forever (a record-less marker)."""
        try:
            mechanism = stock_mechanism(os.path.dirname(os.path.abspath(self.lock_file)))
        except FileNotFoundError:
            return  # the build directory is not there yet: decided at the next acquire
        self.__dict__["_sharedfs_fitted"] = True
        policy = self._sharedfs_policy
        if mechanism == EXISTENCE and policy is not None and policy.lock not in ("soft", "lease"):
            self._sharedfs_policy = dataclasses.replace(policy, lock="soft", sources={
                **policy.sources, "lock": "torch's build lock (torch's own lock file is its existence here)"})

    def _release(self) -> None:
        held = self.__dict__.get("_sharedfs_stock", {}).pop(self._context.lock_file_fd, None)
        try:
            if held is not None:
                held.release()
        finally:
            super()._release()  # type: ignore[misc]

    def _hold_stock_file(self, started: float, args: tuple[Any, ...], kwargs: dict[str, Any]) -> StockLockFile | None:
        if self.kind == FLOCK:
            return None  # the sharedfs lock is a flock of this very file: torch's own way already
        path = os.path.abspath(self.lock_file)
        mechanism = stock_mechanism(os.path.dirname(path))
        if mechanism is None:
            return None  # torch without sharedfs cannot lock here at all
        how = "flock" if mechanism == FLOCK else "its existence"
        decision(f"torch extension builds in {os.path.dirname(os.path.dirname(path))} also hold each build's "
                 f"lock file as torch without sharedfs does there ({how}): builders in an environment without "
                 "sharedfs wait for them and are waited for")
        held = StockLockFile(path, mechanism)
        timeout = kwargs.get("timeout", args[0] if args else None)
        if timeout is None:
            timeout = getattr(self, "timeout", -1)
        blocking = kwargs.get("blocking", getattr(self, "blocking", True))
        report_at = time.monotonic() + REPORT_AFTER
        while not held.try_acquire():
            now = time.monotonic()
            if blocking is False or (timeout is not None and 0 <= timeout <= now - started):
                from sharedfs.errors import LockTimeout  # built on first use: it loads filelock

                raise LockTimeout(path, f"The file lock '{path}' could not be acquired: sharedfs holds its own lock "
                                        f"on it, and torch's own lock file is held by {held.holder()}, a torch "
                                        "process without sharedfs (another environment, or SHAREDFS_DISABLE).")
            if now >= report_at:
                report_at = now + REPORT_EVERY
                hint = ("" if mechanism == FLOCK else
                        f" If no build of this extension runs on any node, remove it: rm -f {path}")
                log.warning("still waiting after %.0f s for %s, the build lock of a torch process without sharedfs "
                            "(another environment, or SHAREDFS_DISABLE), held by %s; torch waits for it as long.%s",
                            now - started, path, held.holder(), hint)
            time.sleep(0.1)
        if held.took_over:
            decision(f"{path} was left by a sharedfs builder that is gone (its second name {held.took_over}); "
                     "taken over in one rename, building again", level=logging.WARNING, every_rank=True)
        return held


_build_lock_classes: dict[tuple[type, Policy], type] = {}


def build_lock_class(own: type, policy: Policy, module: str = __name__) -> type:
    """cpp_extension's ``FileLock`` under ``policy``: :class:`SharedFSBuildLock` on a drop-in of torch's ``own``."""
    from sharedfs.locks._api import drop_in  # torch imported filelock for its own lock module already

    with _baton_lock:
        made = _build_lock_classes.get((own, policy))
        if made is None:
            made = type(own.__name__, (SharedFSBuildLock, drop_in(own, policy, module)), {
                "__module__": module, "__qualname__": own.__qualname__,
                "__doc__": f"sharedfs drop-in for {own.__module__}.{own.__qualname__} in torch.utils.cpp_extension: " +
                           (SharedFSBuildLock.__doc__ or ""),
            })
            _build_lock_classes[(own, policy)] = made
        return made


def torch_lock_class(current: type) -> type:
    """torch's own class behind ``current`` (which may be a sharedfs drop-in bound at cpp_extension's import)."""
    from sharedfs.locks._api import SharedFSLockMixin

    for cls in current.__mro__:
        if not issubclass(cls, (SharedFSLockMixin, SharedFSBuildLock)):
            return cls
    return current  # pragma: no cover - a drop-in always derives from the framework's class


# -- read back by `sharedfs locks` ---------------------------------------------------------------------


def torch_guard(names: set[str]) -> bool:
    """Whether a directory listing holds sharedfs's lock beside torch's baton (so ``lock`` there is torch's)."""
    guard = TORCH_BATON_NAME + TORCH_GUARD_SUFFIX
    return guard in names or guard + _marker.SUFFIX in names


def torch_baton_row(where: Directory, name: str, names: set[str], walk: Looker,
                    entry: os.DirEntry[str]) -> Row | None:
    """torch's ``<build_dir>/lock``: torch < 2.14's baton (held while it exists) or torch >= 2.14's flock file."""
    path = where.join(name)
    seen = read(where, name, walk)
    if seen is None:
        return None
    if seen.record is not None and seen.record.kind == TORCH_BATON_KIND:
        state, evidence = judge(seen.record)
        if state == DEAD:
            evidence += ("; the next sharedfs build of this extension replaces it in one rename under the build "
                         "lock (torch without sharedfs may be polling it: it is never removed here)")
        return Row(path, TORCH_BATON, state, f"torch's extension build baton of a sharedfs builder: {evidence}",
                   path, record=seen.record, owner=seen.owner)
    row = native_row(where, name, walk, entry)
    if row is None or row.state != FREE or not torch_guard(names):
        return row
    row.kind, row.state = TORCH_BATON, UNKNOWN
    row.evidence = ("torch's extension build lock with no record: torch >= 2.14's flock file (then free: nobody "
                    "holds flock on it) or torch < 2.14's baton of a builder without sharedfs (held while it "
                    "exists; it waits forever for a killed one). Remove it only if no build of this extension "
                    "runs on any node")
    return row
