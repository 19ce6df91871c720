"""Pending guards: ``os.makedirs`` / ``Path.mkdir`` guarded from ``import torch.distributed`` on, sharedfs loaded later.

``import torch`` imports ``torch.distributed``, the ``makedirs`` shim's target.  Loading sharedfs
there (pluggy, the plugins, the policy: about 20 ms, 1.5 % of the import) for a guard that acts
only on an error path would charge every torch program, so the bootstrap puts these in place
instead, built from the standard library alone (the stand-ins of :mod:`sharedfs.machinery.standin`
do the same for lock classes).  Each calls the original, unchanged; only when the original raises
an error the guard could be for -- ``FileExistsError`` with ``exist_ok=True``, or
``FileNotFoundError`` right after an ancestor answered EEXIST in this thread -- it activates the
shim (version gate, policy, ``SHAREDFS_DISABLE``) and hands it that error.  The shim's guard then
stands in their place (it wraps the originals: :func:`unwrap`); if the shim stays off they give
way to the originals and the error is raised as it was.  A refused activation (a malformed
setting) raises out of the call, as it would have out of ``import torch``.

This module also holds the thread's guard state (:data:`recent`), which the pending guards and
the shim's share: an ancestor's EEXIST seen before the shim was loaded still counts.
"""

from __future__ import annotations

import os
import pathlib
import threading
from typing import Any, Callable

#: The attribute of a pending guard naming the function it stands in for.
ORIGINAL = "_sharedfs_pending_for"
#: The attribute of the shim's guard: ``recover(exc, exist_ok, args)``, what to raise (None: recovered).
RECOVER = "_sharedfs_recover"


class Recent(threading.local):
    #: The last FileExistsError a guard of this thread let through: (path, the note saying sharedfs
    #: waited it out, or None).  os.makedirs swallows a parent's FileExistsError and then fails on
    #: the child with FileNotFoundError: the child's guard looks here to know the parent answered EEXIST.
    eexist: tuple[str, str | None] | None = None
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


def remember(exc: OSError, note: str | None = None) -> None:
    """Note a FileExistsError a guard lets through (see :attr:`Recent.eexist`)."""
    if isinstance(exc, FileExistsError) and exc.filename is not None:
        recent.eexist = (absolute(exc.filename), note)


def _could_be_lag(exc: OSError, exist_ok: bool) -> bool:
    """Whether the guard might be for ``exc``: the shim decides (filesystem, visibility); this only spares it."""
    if isinstance(exc, FileExistsError):
        if exist_ok:
            return True
        remember(exc)
        return False
    last = recent.eexist
    return (last is not None and exc.filename is not None
            and absolute(exc.filename).startswith(last[0].rstrip(os.sep) + os.sep))


def _hand_over(exc: OSError, exist_ok: bool, owner: Any, attr: str, args: tuple[Any, ...]) -> OSError | None:
    """Activate the shim and let its guard recover ``exc``: what to raise (None: recovered)."""
    if not _could_be_lag(exc, exist_ok):
        return exc
    activate = _activate
    if activate is not None:
        activate()  # the shim's guard takes this one's place, or the shim stays off
    recover = getattr(getattr(owner, attr), RECOVER, None)
    if recover is None:
        withdraw()
        return exc
    return recover(exc, exist_ok, args)  # type: ignore[no-any-return]


def _pending(original: Callable[..., Any], owner: Any, attr: str) -> Callable[..., Any]:
    # One function per place, with the original's signature and positional calls: a wrapper taking
    # *args/**kwargs, or a closure over the arguments, would cost every call (the success path too).
    wrapper: Callable[..., Any]
    if attr == "makedirs":
        def makedirs(name: Any, mode: int = 0o777, exist_ok: bool = False) -> None:
            try:
                return original(name, mode, exist_ok)  # type: ignore[no-any-return]
            except (FileExistsError, FileNotFoundError) as exc:
                raised = _hand_over(exc, exist_ok, owner, attr, (name, mode, exist_ok))
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
                raised = _hand_over(exc, exist_ok, owner, attr, (self, mode, parents, exist_ok))
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
