"""A framework's own "wait until this condition holds", given :func:`sharedfs.cluster.dirs.wait_for`'s semantics.

OLMo and OLMo-core wait for a directory another rank made with
``wait_for(condition, description, timeout=10.0)``: a zero-argument callable
polled every 0.5 s for a fixed 10 s.  On NFS and Lustre, attribute and
negative-lookup caches hide a new directory from other nodes for longer, and
the ranks die with ``TimeoutError`` (OLMo#829, OLMo#894).  The condition is
almost always a path's own check -- ``Path(dir).exists`` (a bound method, in
OLMo-core) or ``lambda: checkpoint_dir.exists()`` (OLMo) -- so the path can be
recovered, and then the wait gets what :func:`~sharedfs.cluster.dirs.wait_for`
gives a path: one waiter per node looks, the parent is re-listed before each
look (which defeats a cached "does not exist"), and the timeout message names
the path, the node, the filesystem and the setting.  Any other condition is
waited for as a predicate.
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
