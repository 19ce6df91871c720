"""Publishing a file: it appears complete, or not at all (a private temp file beside it, fsync, rename)."""

from __future__ import annotations

import os
import secrets
from typing import IO, Any

from sharedfs.fs.recordfile import discard_if_same, identity, same_file
from sharedfs.fs.safefile import create_exclusive

__all__ = ["Publication", "Replaced", "fsync_dir", "publish"]


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


class Replaced(PermissionError):
    """The temp name no longer names the file written for the publication: someone who may write
    the directory swapped it, so nothing was published."""


class Publication:
    """A file being written for ``path``: ``write`` to it, then :meth:`commit` (or leave a ``with`` block).

    :meth:`close` commits, so code that writes a file with ``open``/``write``/``close``
    publishes it by the same calls.  An exception inside a ``with`` block, or :meth:`abort`,
    removes the temp file and leaves ``path`` as it was.  The temp name starts with a dot,
    so framework globs (``iter_*.pth``, ``*.tar``) never see it; ``suffix`` ends it.
    Whoever writes the temp file by name instead of through :attr:`file` (a downloader
    given a path) must be done before :meth:`commit`.
    """

    def __init__(self, path: str | os.PathLike[str], mode: str = "wb", encoding: str | None = None, *,
                 perm: int | None = None, durable: bool = True, suffix: str = ".tmp") -> None:
        self.path = os.path.abspath(os.fspath(path))
        self._perm = perm
        self._durable = durable
        directory, base = os.path.split(self.path)
        self.temp = os.path.join(directory, f".{base}.{os.getpid()}.{secrets.token_hex(6)}{suffix}")
        # 0o666 is what a plain open() asks for; an exact perm is set at commit, private until then.
        fd = create_exclusive(self.temp, 0o666 if perm is None else 0o600)
        self._held = identity(fd)
        try:
            self.file: IO[Any] = os.fdopen(fd, mode, encoding=None if "b" in mode else encoding)
        except BaseException:
            discard_if_same(self.temp, self._held)
            os.close(fd)
            raise

    def write(self, data: Any) -> int:
        return self.file.write(data)

    def commit(self) -> None:
        if self.file.closed:
            return
        try:
            self.file.flush()
            fd = self.file.fileno()
            if self._durable:
                os.fsync(fd)
            if self._perm is not None:
                os.fchmod(fd, self._perm)
            # Checked with the file still open, so its inode number cannot have been reused meanwhile.
            if not same_file(self.temp, fd):
                raise Replaced(f"{self.temp} was replaced while it was written; someone with write access to "
                               f"{os.path.dirname(self.path)} is interfering")
            os.replace(self.temp, self.path)
            self.file.close()
        except BaseException:
            self.abort()
            raise
        if self._durable:
            fsync_dir(os.path.dirname(self.path))

    close = commit

    def abort(self) -> None:
        if not self.file.closed:  # closed: committed, or aborted already
            discard_if_same(self.temp, self._held)
        self.file.close()

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
