"""Where framework caches live under the ``cache`` setting.

``shared`` keeps each framework's own cache directory: sharedfs's locks make a
shared cache correct.  ``node-local`` moves caches to a job-scoped, per-user,
mode-0700 directory on node-local storage (:func:`sharedfs.node_local_dir`).
``auto`` keeps a framework's default unless that default is a fixed name in a
world-writable temp directory, which another user can create first and fill
with planted content (failures.md section 5): wids' ``/tmp/_wids_cache``.
"""

from __future__ import annotations

from sharedfs._policy import Policy
from sharedfs.hookspecs import hookimpl

#: Frameworks whose default cache is a predictable path shared by every user of the node.
SHARED_TMP_DEFAULTS = {"wids": "/tmp/_wids_cache"}


@hookimpl
def sharedfs_cache_placement(framework: str, policy: Policy) -> str | None:
    if policy.cache == "shared":
        return None
    if policy.cache == "auto" and framework not in SHARED_TMP_DEFAULTS:
        return None
    from sharedfs.dirs import node_local_dir

    return str(node_local_dir(framework, policy=policy))
