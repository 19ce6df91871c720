"""Publishing a file: it appears complete, or not at all.

Readers on other nodes (a resumed job, another rank, another user) may open a
file the moment its name exists.  Writing it in place lets them read half of it;
a temp name of ``.temp{pid}`` collides across nodes whose processes share a pid
(webdataset's ``download``).  Every file sharedfs publishes is written to a unique
temp file beside its final name (``mkstemp``: ``O_EXCL|O_NOFOLLOW``, never a
planted name), flushed and fsynced, given the permissions a plain ``open`` would
have given it (the umask's), and renamed over the final name; the directory is
fsynced so the rename survives a crash.
"""

from __future__ import annotations

import os
import tempfile
from typing import IO, Any

__all__ = ["Publication", "fsync_dir", "publish"]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_dir(directory: str) -> None:
    """Make a rename in ``directory`` survive a crash; never follows a symlink planted in its place."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some network filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


class Publication:
    """A file being written for ``path``: ``write`` to it, then :meth:`commit` (or leave a ``with`` block).

    :meth:`close` commits, so code that writes a file with ``open``/``write``/``close``
    publishes it by the same calls.  An exception inside a ``with`` block, or :meth:`abort`,
    removes the temp file and leaves ``path`` as it was.  The temp name starts with a dot,
    so framework globs (``iter_*.pth``, ``*.tar``) never see it.
    """

    def __init__(self, path: str | os.PathLike[str], mode: str = "wb", encoding: str | None = None, *,
                 perm: int | None = None, durable: bool = True) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self._perm = (0o666 & ~_umask()) if perm is None else perm
        self._durable = durable
        directory, base = os.path.split(self.path)
        fd, self.temp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
        self.file: IO[Any] = os.fdopen(fd, mode, encoding=None if "b" in mode else encoding)

    def write(self, data: Any) -> int:
        return self.file.write(data)

    def commit(self) -> None:
        if self.file.closed:
            return
        try:
            self.file.flush()
            if self._durable:
                os.fsync(self.file.fileno())
            self.file.close()
            os.chmod(self.temp, self._perm)
            os.replace(self.temp, self.path)
        except BaseException:
            self.abort()
            raise
        if self._durable:
            fsync_dir(os.path.dirname(self.path))

    close = commit

    def abort(self) -> None:
        self.file.close()
        try:
            os.unlink(self.temp)
        except FileNotFoundError:
            pass

    def __enter__(self) -> Publication:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def publish(path: str | os.PathLike[str], data: bytes | str, encoding: str | None = None, *,
            perm: int | None = None, durable: bool = True) -> None:
    """Publish ``data`` as ``path`` (text when ``data`` is a str)."""
    mode = "w" if isinstance(data, str) else "wb"
    with Publication(path, mode, encoding if mode == "w" else None, perm=perm, durable=durable) as out:
        out.write(data)
