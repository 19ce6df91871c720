"""makedirs: ``os.makedirs`` and ``Path.mkdir`` that a shared filesystem's lagging metadata cannot break.

Only the EEXIST-yet-invisible error path waits (cpython#142916; the design: docs/api.md, the makedirs guard).
"""

from __future__ import annotations

import functools
import logging
import os
import pathlib
import stat
import sys
import time
from types import FrameType, ModuleType
from typing import Any, Callable

from sharedfs.errors import WaitTimeout
from sharedfs.types import Policy, Shim, ShimContext, choices, decision, hookimpl, pending, wait_for

log = logging.getLogger("sharedfs")

#: Retries after the awaited path became visible back off from FIRST_PAUSE, doubling up to MAX_PAUSE.
FIRST_PAUSE = 0.01
MAX_PAUSE = 1.0


_recent = pending.recent  # this thread's guard state, shared with the pending guards
_absolute = pending.absolute


def _awaited(exc: OSError, exist_ok: bool, caller: FrameType | None) -> str | None:
    """The path whose lagging visibility could explain ``exc``, on a shared filesystem; None: not the guard's.

    Only EEXIST can be the lag: mkdir found the path, this node's lookup did not.  With ``exist_ok``
    (the standard library then asked ``isdir``), or where ``os.makedirs`` swallows the error and goes on
    to make a child, which needs the parent visible here.  A FileNotFoundError never waits: the parent a
    child's mkdir missed is the one a guard of this very call waited for already, or none was.
    """
    if not isinstance(exc, FileExistsError) or exc.filename is None:
        return None
    if not exist_ok and not pending.swallows(caller):
        return None
    path = _absolute(exc.filename)
    try:
        shared = choices.filesystem(path).shared
    except (OSError, LookupError):
        return None  # cannot tell: the standard library's answer stands
    return path if shared else None


def _recover(exc: OSError, exist_ok: bool, original: Callable[..., Any], args: tuple[Any, ...],
             timeout: float, caller: FrameType | None) -> OSError | None:
    """Wait and retry where ``exc`` is a shared filesystem's lag; None once a retry succeeded, else what to raise.

    ``caller``: the frame that called the guard (``os.makedirs`` one level up swallows a parent's EEXIST).
    """
    if isinstance(exc, FileNotFoundError):
        note = pending.recall(exc)  # the parent this very call swallowed an EEXIST for was waited out: say so
        if note is not None:
            _annotate(exc, note)
        return exc
    _recent.eexist = None  # the memory is for the FileNotFoundError the call that made it raises next, only
    if _waited_out(exc):  # a parent's guard waited the whole timeout for it (Path.mkdir lets it through)
        return exc
    current = exc
    awaited = _awaited(current, exist_ok, caller)
    if awaited is None:
        return current
    outermost = _recent.deadline is None
    if outermost:
        _recent.deadline = time.monotonic() + timeout
    deadline: float = _recent.deadline  # type: ignore[assignment]
    pause = FIRST_PAUSE
    try:
        while True:
            try:
                wait_for(awaited, max(0.0, deadline - time.monotonic()), what=f"directory {awaited}")
            except WaitTimeout as gave_up:
                note = (f"{NOTE}mkdir of {awaited} answered EEXIST but the directory stayed invisible on "
                        f"this node (a shared filesystem's metadata lagging behind the node that made it): {gave_up}")
                _annotate(current, note)
                pending.remember(caller, current, note)
                return current
            if not exist_ok:
                return current  # visible now: os.makedirs, which swallows this, can make the child
            seen = _seen_as(awaited)
            if seen == "other":
                return current  # visible and not a directory (a file, a dangling link): as the stdlib said
            if seen == "dir":
                try:
                    original(*args)
                except FileNotFoundError as again:
                    return _recover(again, exist_ok, original, args, timeout, caller)  # only a note, never a wait
                except FileExistsError as again:
                    current = again
                else:
                    decision("makedirs: a directory another node created was not visible here yet; sharedfs "
                             "waited for it instead of raising (SHAREDFS_WAIT_TIMEOUT bounds the wait)")
                    return None
                if _waited_out(current):  # a level below waited the whole timeout already
                    return current
                awaited = _awaited(current, exist_ok, caller)
                if awaited is None:
                    return current
            # Listed, yet a lookup still says "no such directory": the lag still.  MooseFS's client answers
            # lookups from a negative cache that re-listing the parent does not clear.  Back off, look again.
            if time.monotonic() >= deadline:  # never loop on
                note = (f"{NOTE}{awaited} showed in its parent's listing on this node, but lookups of it kept "
                        f"failing until SHAREDFS_WAIT_TIMEOUT ({timeout:g} s) passed")
                _annotate(current, note)
                return current
            time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(pause * 2, MAX_PAUSE)
    finally:
        if outermost:
            _recent.deadline = None


def _seen_as(path: str) -> str:
    """``"dir"``, ``"other"`` (a file, a dangling link: the stdlib's answer stands) or ``"missing"`` (lagging)."""
    try:
        return "dir" if stat.S_ISDIR(os.stat(path).st_mode) else "other"
    except FileNotFoundError:
        try:
            return "other" if stat.S_ISLNK(os.lstat(path).st_mode) else "missing"
        except FileNotFoundError:
            return "missing"
        except OSError:
            return "other"
    except OSError:
        return "other"


#: How every note the guard adds begins: an exception carrying one was waited for already.
NOTE = "sharedfs: "


def _annotate(exc: BaseException, note: str) -> None:
    """Add ``note`` (PEP 678); before Python 3.11, which shows no notes, also log it."""
    notes = getattr(exc, "__notes__", None)
    if notes is not None and note in notes:
        return
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        exc.__notes__ = [*(notes or ()), note]  # type: ignore[attr-defined]
        log.warning("%s", note)


def _waited_out(exc: BaseException) -> bool:
    return any(str(note).startswith(NOTE) for note in getattr(exc, "__notes__", ()))


def guard_makedirs(original: Callable[..., None], timeout: float) -> Callable[..., None]:
    """``os.makedirs`` with the guard on its error path; ``original`` runs first, as it is."""

    @functools.wraps(original)
    def makedirs(name: Any, mode: int = 0o777, exist_ok: bool = False) -> None:
        try:
            return original(name, mode, exist_ok)
        except (FileExistsError, FileNotFoundError) as exc:
            # The arguments are passed on, never captured by a closure: a closure over them would make
            # them cells, which every call (the success path too) would pay for.
            raised = _recover(exc, exist_ok, original, (name, mode, exist_ok), timeout, sys._getframe(1))
            if raised is exc:
                raise
            if raised is not None:
                raise raised from None
            return None

    makedirs.__dict__[pending.RECOVER] = lambda exc, exist_ok, args, caller: _recover(exc, exist_ok, original, args,
                                                                                     timeout, caller)
    return makedirs


def guard_mkdir(original: Callable[..., None], timeout: float) -> Callable[..., None]:
    """``Path.mkdir`` with the guard on its error path; ``original`` runs first, as it is."""

    @functools.wraps(original)
    def mkdir(self: pathlib.Path, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
        try:
            return original(self, mode, parents, exist_ok)
        except (FileExistsError, FileNotFoundError) as exc:
            raised = _recover(exc, exist_ok, original, (self, mode, parents, exist_ok), timeout, sys._getframe(1))
            if raised is exc:
                raise
            if raised is not None:
                raise raised from None
            return None

    mkdir.__dict__[pending.RECOVER] = lambda exc, exist_ok, args, caller: _recover(exc, exist_ok, original, args,
                                                                                  timeout, caller)
    return mkdir


class MakedirsShim(Shim):
    name = "makedirs"
    distribution = None  # the standard library: gated on the interpreter's version
    supported = ">=3.9,<3.14"  # the CPython versions whose os.makedirs and Path.mkdir this was tested against

    def module(self) -> ModuleType:
        return os  # what it patches, imported or not its target

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        # The pending guards `import torch.distributed` put in place (sharedfs.machinery.pending) are
        # replaced, never wrapped: the guards wrap the standard library's functions, and unpatch restores them.
        makedirs, mkdir = pending.unwrap(os.makedirs), pending.unwrap(pathlib.Path.mkdir)
        self.patcher.setattr(os, "makedirs", guard_makedirs(makedirs, policy.wait_timeout))
        self.patcher.setattr(pathlib.Path, "mkdir", guard_mkdir(mkdir, policy.wait_timeout))
        pending.settled()


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [MakedirsShim()]
