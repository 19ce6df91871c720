"""The names sharedfs gives lock files of its own that a framework's lock file stands beside.

Written by the shim that takes them (``shims/torch.py``) and read back by ``sharedfs locks``
(``sharedfs/commands/lockfiles.py``), which must tell them from any other file: one definition
for both.
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
