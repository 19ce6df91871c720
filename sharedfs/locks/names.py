"""The names sharedfs gives its own lock files beside a framework's lock file (torch's build directory).

Written and read back by :mod:`sharedfs.locks.torchbaton`; ``sharedfs locks`` tells them from any other file by them.
"""

from __future__ import annotations

__all__ = ["TORCH_BATON_KIND", "TORCH_BATON_NAME", "TORCH_GUARD_SUFFIX"]

#: torch's extension build lock: ``<build_dir>/lock`` (torch < 2.14's ``FileBaton``, torch >= 2.14's ``FileLock``).
TORCH_BATON_NAME = "lock"
#: The sharedfs lock beside torch's baton: ``<build_dir>/lock`` + this.  Not the baton's own name: a
#: native lock file stays on disk after release, and torch without sharedfs would wait for it forever.
TORCH_GUARD_SUFFIX = ".sharedfs"
#: What sharedfs writes into the batons it creates (``HolderRecord.kind``): torch's own are empty.
TORCH_BATON_KIND = "torch-baton"
