"""ESTALE is a normal answer: the file another client removed or replaced, seen through a handle this one kept.

It says the file is gone, nothing about the name, so a reader asks again through the name (:func:`retry`).
"""

from __future__ import annotations

import errno
import os
from typing import Callable, TypeVar

__all__ = ["RETRIES", "close", "gone", "is_stale", "retry", "vanished"]

T = TypeVar("T")

#: How often an operation by name is asked again after ESTALE: each retry is a fresh lookup, which
#: finds the successor's file or nothing; a name stale this many times running is "cannot tell".
RETRIES = 3


def is_stale(exc: BaseException) -> bool:
    """Whether ``exc`` is ESTALE: the file a handle referred to was removed or replaced by another client."""
    return isinstance(exc, OSError) and exc.errno == errno.ESTALE


def gone(exc: BaseException) -> bool:
    """Whether ``exc`` says the file is gone: ENOENT, or ESTALE (:func:`is_stale`)."""
    return isinstance(exc, FileNotFoundError) or is_stale(exc)


def vanished(exc: OSError, path: object = None) -> OSError:
    """``exc`` as the vanished file it is: ESTALE becomes :class:`FileNotFoundError`, anything else stays."""
    if not is_stale(exc):
        return exc
    return FileNotFoundError(errno.ENOENT, "Stale file handle (another client removed or replaced it)",
                             exc.filename if path is None else path)


def retry(call: Callable[[], T], tries: int = RETRIES) -> T:
    """``call()``, asked again through the name while it answers ESTALE; the last ESTALE is raised."""
    for _ in range(tries - 1):
        try:
            return call()
        except OSError as exc:
            if exc.errno != errno.ESTALE:
                raise
    return call()


def close(fd: int) -> None:
    """``os.close(fd)``, where ESTALE means only that the file is gone now.

    Linux frees the descriptor whatever close(2) answers, so there is nothing to retry; an error
    other than ESTALE (EIO: written data may be lost) is raised.
    """
    try:
        os.close(fd)
    except OSError as exc:
        if exc.errno != errno.ESTALE:
            raise
