"""Where framework caches live under the ``cache`` setting.

``shared`` and ``auto`` keep each framework's own cache directory: sharedfs's
locks make a shared cache correct, and moving data silently would surprise
users.  ``node-local`` moves caches to a job-scoped, per-user directory on
node-local storage (:func:`sharedfs.node_local_dir`).
"""

from __future__ import annotations

from sharedfs.hookspecs import hookimpl
from sharedfs._policy import Policy


@hookimpl
def sharedfs_cache_placement(framework: str, policy: Policy) -> str | None:
    if policy.cache != "node-local":
        return None
    from sharedfs.dirs import node_local_dir

    return str(node_local_dir(framework, policy=policy))
