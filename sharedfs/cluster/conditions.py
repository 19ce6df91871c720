"""A framework's own "wait until this condition holds", given :func:`sharedfs.cluster.dirs.wait_for`'s semantics.

A condition that is a path's own check is waited for as that path (OLMo#829); anything else as a predicate.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from sharedfs.cluster import dirs

__all__ = ["path_of", "wait"]

#: The ``pathlib.Path`` checks whose path a wait can stand in for, each with what it still asks of the
#: entry once the path is visible (``exists`` follows a symlink, ``is_dir`` wants a directory, ...).
PATH_CHECKS = ("exists", "is_dir", "is_file")


def path_of(condition: Callable[[], bool]) -> Path | None:
    """The path ``condition`` looks at, when that is certain; else ``None`` (a plain predicate).

    Certain means: a bound ``Path.exists`` / ``is_dir`` / ``is_file`` of a :class:`pathlib.Path`
    (not of a subclass overriding it), or a lambda whose only free variable holds a ``Path``
    and whose only operation is one of those methods on it (``lambda: checkpoint_dir.exists()``).
    """
    owner, func = getattr(condition, "__self__", None), getattr(condition, "__func__", None)
    if isinstance(owner, Path) and func is not None:
        if any(func is getattr(Path, name) and getattr(type(owner), name) is func for name in PATH_CHECKS):
            return owner
        return None
    code = getattr(condition, "__code__", None)
    cells = getattr(condition, "__closure__", None)
    if code is None or cells is None or len(cells) != 1 or code.co_argcount or code.co_kwonlyargcount:
        return None
    try:
        held = cells[0].cell_contents
    except ValueError:  # an empty cell: the variable was never assigned
        return None
    if not isinstance(held, Path) or len(code.co_names) != 1 or code.co_names[0] not in PATH_CHECKS:
        return None
    if any(const is not None for const in code.co_consts) or code.co_varnames:
        return None  # it computes something besides the one check: not certain
    name = code.co_names[0]
    return held if getattr(type(held), name) is getattr(Path, name) else None


def wait(condition: Callable[[], bool], timeout: float, *, what: str) -> None:
    """Wait up to ``timeout`` seconds for ``condition()``; :class:`sharedfs.WaitTimeout` when it never holds.

    With a recovered path, first until the path is visible (node gate, parent re-listing), then
    until the condition itself holds (a dangling symlink, a file where a directory is wanted) for
    what is left of ``timeout``.
    """
    deadline = time.monotonic() + timeout
    path = path_of(condition)
    if path is not None:
        dirs.wait_for(path, timeout, what=what)
        if condition():
            return
    dirs.wait_for(condition, max(0.0, deadline - time.monotonic()), what=what)
