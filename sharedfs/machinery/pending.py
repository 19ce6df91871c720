"""Pending guards: ``os.makedirs`` / ``Path.mkdir`` guarded from ``import torch.distributed`` on, sharedfs loaded later.

Standard library only: loading sharedfs in ``import torch`` for an error-path guard would cost every torch program.
"""

from __future__ import annotations

import os
import pathlib
import sys
import threading
from types import FrameType
from typing import Any, Callable

#: The attribute of a pending guard naming the function it stands in for.
ORIGINAL = "_sharedfs_pending_for"
#: The attribute of the shim's guard: ``recover(exc, exist_ok, args, caller)``, what to raise (None: recovered).
RECOVER = "_sharedfs_recover"


class Recent(threading.local):
    #: An ancestor's EEXIST that a guard waited the whole timeout for and let through into the
    #: ``os.makedirs`` call that swallows it (that call then fails on the child with FileNotFoundError,
    #: whose guard adds the same note instead of waiting again): (that call's frame, the ancestor, the
    #: note).  It lives for that one call: only an error raised inside that very frame matches it, and
    #: the next error any guard of this thread sees clears it.
    eexist: tuple[FrameType, str, str] | None = None
    #: While a guard recovers, when its wait ends: the guards of the levels it retries share it.
    deadline: float | None = None


#: This thread's guard state.
recent = Recent()

_lock = threading.Lock()
#: Applies the shim (set while the pending guards wait for their first error).
_activate: Callable[[], object] | None = None


def _places() -> tuple[tuple[Any, str], ...]:
    return ((os, "makedirs"), (pathlib.Path, "mkdir"))


def install(activate: Callable[[], object]) -> None:
    """Put the pending guards in place (once); ``activate`` applies the ``makedirs`` shim."""
    global _activate
    with _lock:
        if _activate is not None:
            return
        _activate = activate
        for owner, attr in _places():
            original = getattr(owner, attr)
            if ORIGINAL not in getattr(original, "__dict__", {}):
                setattr(owner, attr, _pending(original, owner, attr))


def unwrap(func: Any) -> Any:
    """The function a pending guard stands in for; anything else unchanged."""
    return getattr(func, "__dict__", {}).get(ORIGINAL, func)


def settled() -> None:
    """The shim is applied (its guard replaced the pending ones): nothing waits any more."""
    global _activate
    with _lock:
        _activate = None


def withdraw() -> None:
    """Put the originals back wherever a pending guard still stands (the shim stayed off; ``sharedfs.disable()``)."""
    global _activate
    with _lock:
        _activate = None
        for owner, attr in _places():
            current = owner.__dict__.get(attr)
            if current is not None and ORIGINAL in getattr(current, "__dict__", {}):
                setattr(owner, attr, current.__dict__[ORIGINAL])


def waiting() -> bool:
    """Whether the pending guards wait for their first error (``sharedfs status``)."""
    return _activate is not None


def absolute(name: Any) -> str:
    return os.path.abspath(os.fsdecode(os.fspath(name)))


def swallows(caller: FrameType | None) -> bool:
    """Whether ``caller`` is ``os.makedirs`` making a missing parent: it ignores the parent's FileExistsError
    and goes on to make the child, which needs the parent to be visible, whatever ``exist_ok`` says."""
    return caller is not None and caller.f_code.co_name == "makedirs" and caller.f_globals is vars(os)


def remember(caller: FrameType | None, exc: OSError, note: str) -> None:
    """Note that ``exc`` (a FileExistsError) was waited out, for the os.makedirs call that swallows it (see
    :attr:`Recent.eexist`); anywhere else, or for an exception without a path, nothing is kept."""
    if caller is not None and swallows(caller) and exc.filename is not None:
        recent.eexist = (caller, absolute(exc.filename), note)
    else:
        recent.eexist = None


def recall(exc: OSError, forget: bool = True) -> str | None:
    """The note of an ancestor waited out in the os.makedirs call that raised ``exc`` (FileNotFoundError for
    a path below it), or None; ``forget``: clear the memory (it matches one call, once)."""
    last = recent.eexist
    if forget:
        recent.eexist = None
    if last is None or exc.filename is None:
        return None
    frame, ancestor, note = last
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame is not frame:
        tb = tb.tb_next
    if tb is None or not absolute(exc.filename).startswith(ancestor.rstrip(os.sep) + os.sep):
        return None
    return note


def _could_be_lag(exc: OSError, exist_ok: bool, caller: FrameType | None) -> bool:
    """Whether the guard might be for ``exc``: the shim decides (filesystem, visibility); this only spares it."""
    if isinstance(exc, FileExistsError):
        recent.eexist = None
        return exist_ok or swallows(caller)
    found = recall(exc, forget=False) is not None  # the shim's guard adds the note and forgets
    if not found:
        recent.eexist = None
    return found


def _hand_over(exc: OSError, exist_ok: bool, owner: Any, attr: str, args: tuple[Any, ...],
               caller: FrameType | None) -> OSError | None:
    """Activate the shim and let its guard recover ``exc``: what to raise (None: recovered)."""
    if not _could_be_lag(exc, exist_ok, caller):
        return exc
    activate = _activate
    if activate is not None:
        activate()  # the shim's guard takes this one's place, or the shim stays off
    recover = getattr(getattr(owner, attr), RECOVER, None)
    if recover is None:
        withdraw()
        return exc
    return recover(exc, exist_ok, args, caller)  # type: ignore[no-any-return]


def _pending(original: Callable[..., Any], owner: Any, attr: str) -> Callable[..., Any]:
    # One function per place, with the original's signature and positional calls: a wrapper taking
    # *args/**kwargs, or a closure over the arguments, would cost every call (the success path too).
    wrapper: Callable[..., Any]
    if attr == "makedirs":
        def makedirs(name: Any, mode: int = 0o777, exist_ok: bool = False) -> None:
            try:
                return original(name, mode, exist_ok)  # type: ignore[no-any-return]
            except (FileExistsError, FileNotFoundError) as exc:
                raised = _hand_over(exc, exist_ok, owner, attr, (name, mode, exist_ok), sys._getframe(1))
                if raised is exc:
                    raise
                if raised is not None:
                    raise raised from None
                return None
        wrapper = makedirs
    else:
        def mkdir(self: Any, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
            try:
                return original(self, mode, parents, exist_ok)  # type: ignore[no-any-return]
            except (FileExistsError, FileNotFoundError) as exc:
                raised = _hand_over(exc, exist_ok, owner, attr, (self, mode, parents, exist_ok),
                                    sys._getframe(1))
                if raised is exc:
                    raise
                if raised is not None:
                    raise raised from None
                return None
        wrapper = mkdir
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(wrapper, name, getattr(original, name))
    wrapper.__dict__.update({"__wrapped__": original, ORIGINAL: original})
    return wrapper
