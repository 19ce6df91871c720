"""Triton: a kernel cache that many ranks on many nodes can fill and read at once.

Entries are hard-linked into place and never replaced under a reader (the failures: docs/frameworks/triton.md).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from types import ModuleType
from typing import Any, Optional

from sharedfs.types import Policy, Shim, ShimContext, decision, hookimpl, read_untrusted

#: Why ``os.link`` may be refused by a filesystem without hard links; the put then renames under the lock.
NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS})
#: Triton's group files are small JSON documents (a path per file of a kernel: a few KiB); a larger one is
#: not Triton's and is a miss.  Below malloc's mmap threshold: the read buffer costs no system call.
GROUP_LIMIT = 64 * 1024


class TritonShim(Shim):
    name = "triton"
    distribution = "triton"
    # FileCacheManager(key, override=False, dump=False) with cache_dir/lock_path, put/get_file/get_group/put_group
    # since 3.0; the manager class from knobs.cache.manager_class since 3.4, a module global before.
    # Read: 3.0.0, 3.3.1, 3.4.0, 3.9.0; tested with 3.9.0 (tests/integration/test_triton.py).
    supported = ">=3.0,<4"

    def apply(self, module: ModuleType, policy: Policy, context: ShimContext) -> None:
        own = _users_manager(module)
        if own is not None:
            decision(f"triton cache manager left as the user set it ({own}); sharedfs would have installed "
                     "SharedFSFileCacheManager (no key-directory removal, no replaced entries, stale reads "
                     "as misses)")
            return
        knob = vars(type(module.knobs.cache)).get("manager_class") if _has_knobs(module) else None
        manager = make_cache_manager(module.FileCacheManager, policy, knob)
        if _has_knobs(module):
            # knobs.cache.manager_class = cls keeps the class in the knob's own dict: no environment
            # change, and deleting it (unpatch) gives Triton's TRITON_CACHE_MANAGER lookup back.
            self.patcher.setattr(module.knobs.cache, "manager_class", manager)
        else:  # triton 3.0-3.3: get_cache_manager() uses this global while TRITON_CACHE_MANAGER is unset
            self.patcher.setattr(module, "__cache_cls", manager)


def _has_knobs(module: ModuleType) -> bool:
    """True for triton >= 3.4, where ``knobs.cache.manager_class`` (a descriptor on the class) is the setting."""
    knobs = getattr(module, "knobs", None)
    cache = getattr(knobs, "cache", None)
    return cache is not None and any("manager_class" in vars(cls) for cls in type(cache).__mro__)


def _users_manager(module: ModuleType) -> str | None:
    """The cache manager the user chose (variable or knob), or ``None`` when Triton would use its own."""
    chosen = os.environ.get("TRITON_CACHE_MANAGER")
    if chosen:
        return f"TRITON_CACHE_MANAGER={chosen}"
    if _has_knobs(module):
        set_in_code = module.knobs.cache.__dict__.get("manager_class")
        if set_in_code is not None:
            return f"triton.knobs.cache.manager_class = {set_in_code.__module__}.{set_in_code.__qualname__}"
        return None
    current = module.__dict__.get("__cache_cls")
    if current is not None and current is not module.FileCacheManager:
        return f"triton.runtime.cache.__cache_cls = {current.__module__}.{current.__qualname__}"
    return None


def make_cache_manager(original: type, policy: Policy, knob: Any = None) -> type:
    """Triton's ``FileCacheManager`` (``original``) publishing and reading as docs/frameworks/triton.md says.

    ``knob`` is Triton's ``TRITON_CACHE_MANAGER`` descriptor (triton >= 3.4), whose ``get()`` reads the variable.
    """

    class SharedFSFileCacheManager(original):  # type: ignore[misc, valid-type]
        """sharedfs: Triton's ``FileCacheManager`` for a cache shared by many processes and nodes.

        ``put`` hard-links a private, fsynced temp file into place and keeps an entry that is already
        there (never replaces what a reader found, never removes a directory; an empty entry is
        replaced under ``sharedfs.lock(lock_path)``); reads treat missing, stale, empty or
        unparsable entries as misses.
        """

        def __new__(cls, key: str, override: bool = False, dump: bool = False) -> Any:
            # TRITON_CACHE_MANAGER set after the import (the knob holding this class would hide it):
            # the user's manager, as Triton would have built it.
            if os.environ.get("TRITON_CACHE_MANAGER") and knob is not None:
                chosen = knob.get()
                if chosen is not None and not issubclass(chosen, cls):
                    return chosen(key, override=override, dump=dump)
            return super().__new__(cls)

        def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
            try:
                super().__init__(key, override=override, dump=dump)
            except (FileExistsError, FileNotFoundError):
                # Another node made <cache>/<key> and this one cannot see it yet (NFS attribute and
                # negative-lookup caches): wait until it is visible instead of failing the compile.
                if not getattr(self, "cache_dir", None):
                    raise
                from sharedfs.types import makedirs

                makedirs(self.cache_dir)

        def has_file(self, filename: str) -> bool:
            if not self.cache_dir:
                raise RuntimeError("Could not create or locate cache dir")
            return _whole(self._make_path(filename))

        def get_file(self, filename: str) -> Optional[str]:
            return self._make_path(filename) if self.has_file(filename) else None

        def get_group(self, filename: str) -> Optional[dict[str, str]]:
            if not self.cache_dir:
                raise RuntimeError("Could not create or locate cache dir")
            try:
                # No symlink followed, no blocking open (a FIFO planted in a shared cache), a size cap.
                read = read_untrusted(self._make_path(f"__grp__{filename}"), GROUP_LIMIT)
                grp_data = json.loads(read[0]) if read is not None and read[0] else None
            except (OSError, ValueError):
                return None  # missing, vanished, stale or half-written: a miss, Triton compiles again
            child_paths = grp_data.get("child_paths") if isinstance(grp_data, dict) else None
            if not isinstance(child_paths, dict):
                return None
            for path in child_paths.values():
                if not isinstance(path, str) or not _whole(path):
                    return None  # a partial group is a miss (as in triton 3.9; 3.4 returned the rest)
            return dict(child_paths)

        def put(self, data: Any, filename: str, binary: bool = True) -> str:
            if not self.cache_dir:
                raise RuntimeError("Could not create or locate cache dir")
            if self.lock_path is None:  # an override directory: Triton only reads those
                return str(super().put(data, filename, binary=binary))
            payload = data if isinstance(data, bytes) else str(data).encode("utf-8")
            return _publish(self.cache_dir, self._make_path(filename), payload, self.lock_path, policy)

    SharedFSFileCacheManager.__module__ = __name__
    SharedFSFileCacheManager.__qualname__ = "SharedFSFileCacheManager"
    return SharedFSFileCacheManager


def _whole(path: str) -> bool:
    """True when ``path`` is a non-empty regular file this node can see (errors, ESTALE included, are a miss)."""
    return _state(path) == "whole"


def _state(path: str) -> str:
    """``whole``, ``bad`` (empty, or not a regular file) or ``unseen`` (missing or unreadable from here)."""
    try:
        st = os.stat(path)
    except OSError:
        return "unseen"
    return "whole" if st.st_size > 0 and stat.S_ISREG(st.st_mode) else "bad"


def _publish(directory: str, path: str, payload: bytes, lock_path: str, policy: Policy) -> str:
    """Make ``path`` hold ``payload`` unless a whole entry is there already; return ``path``."""
    from sharedfs.types import create_record, discard_if_same, fsync_dir, identity, stale

    base = os.path.basename(path)
    temp = os.path.join(directory, f".{base}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    try:
        fd = stale.retry(lambda: create_record(temp, payload, 0o666))
    except OSError as exc:
        if not stale.gone(exc):
            raise
        # The key directory is not visible here (yet): made by another node a moment ago, or replaced by one
        # (ESTALE through every retry: this node's handle of it names the directory that went).
        from sharedfs.types import makedirs

        makedirs(directory)
        fd = stale.retry(lambda: create_record(temp, payload, 0o666))
    held = identity(fd)
    try:
        os.fsync(fd)
        _into_place(temp, path, lock_path, policy)
        fsync_dir(directory)
    finally:
        discard_if_same(temp, held)  # only our own temp file, and only while the name still is it
        stale.close(fd)  # ESTALE: another node replaced the entry we published; the descriptor is freed
    return path


def _into_place(temp: str, path: str, lock_path: str, policy: Policy) -> None:
    """Put ``temp`` at ``path`` unless an entry is there: a hard link, which answers EEXIST for an entry another
    node published even while this node cannot see it yet, so no reader's file is ever replaced."""
    try:
        os.link(temp, path)
        return
    except FileExistsError:
        state = _state(path)
        if state == "unseen":  # published by another node a moment ago: wait until it shows here
            from sharedfs.types import wait_for

            wait_for(path, what=f"Triton cache entry {path}")
            return
        if state == "whole":
            return  # the same kernel, compiled by another process: readers may have it open
    except OSError as exc:
        if exc.errno not in NO_LINKS:
            raise
    # An empty entry or something else in the way (a writer outside sharedfs died mid-way), or a filesystem
    # without hard links: replacing must exclude the other writers of this entry, through the lock Triton names.
    from sharedfs.types import lock

    with lock(lock_path, policy=policy):
        if _state(path) != "whole":
            os.replace(temp, path)


@hookimpl
def sharedfs_register_shims() -> list[Shim]:
    return [TritonShim()]
