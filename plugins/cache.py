"""Where framework caches live under the ``cache`` setting; a directory the user chose always wins."""

from __future__ import annotations

import os
import stat

from sharedfs.types import CachePlacement, CacheRequest, Policy, hookimpl, node_local_dir


@hookimpl(trylast=True)  # the built-in rule: a site plugin's plain @hookimpl answers first
def sharedfs_cache_placement(request: CacheRequest, policy: Policy) -> CachePlacement | None:
    if request.per_node:
        return _table_row(request, policy)
    if request.user_value:
        over = " over SHAREDFS_CACHE=node-local" if policy.cache == "node-local" else ""
        return CachePlacement(None, f"{request.variable}={request.user_value} is set (an explicit user setting "
                                    f"wins{over})")
    if policy.cache == "shared":
        return CachePlacement(None, f"{request.framework}'s own default kept ({policy.source('cache')}: shared)")
    if policy.cache == "auto":
        writable_by_all = _writable_by_everyone(request.default)
        if writable_by_all is None:
            return CachePlacement(None, f"{request.framework}'s own default kept (cache=auto)")
        where = str(node_local_dir(request.framework, policy=policy, create=request.create))
        return CachePlacement(where, f"the default {request.default} is in {writable_by_all}, which every user of "
                                     "this node can write (another user could create it first); using a private "
                                     "node-local directory (cache=auto)")
    where = str(node_local_dir(request.framework, policy=policy, create=request.create))
    return CachePlacement(where, f"node-local ({policy.source('cache')})")


def _table_row(request: CacheRequest, policy: Policy) -> CachePlacement:
    """A row of the placed-cache table: its default per node when that default is on a shared filesystem."""
    if request.user_value:
        return CachePlacement(None, f"{request.variable}={request.user_value} is set (an explicit user setting wins)")
    if policy.cache == "shared":
        return CachePlacement(None, f"{request.framework}'s own default kept ({policy.source('cache')}: shared)")
    if policy.cache == "node-local":
        where = str(node_local_dir(request.framework, policy=policy, create=request.create))
        return CachePlacement(where, f"node-local ({policy.source('cache')})")
    if not request.default or not request.default_shared:
        return CachePlacement(None, f"{request.framework}'s own default kept: {request.default} is on a node-local "
                                    "filesystem (cache=auto)")
    # The library creates its directory itself; one directory per node keeps the cache warm across
    # jobs while the processes sharing it are one node's (a node's own locks and caches are coherent).
    # It is inside the library's own default: whoever could make it first can already write the default
    # stock uses, so no check here adds safety (a node-local one, in /tmp, is made or checked above).
    where = os.path.join(request.default, policy.node_id)
    return CachePlacement(where, f"{request.default} is on a shared filesystem: one directory per node "
                                 f"(cache=auto)")


def _writable_by_everyone(default: str | None) -> str | None:
    """The nearest existing ancestor of ``default`` if every user may create entries in it."""
    if not default:
        return None
    path = os.path.abspath(os.path.expanduser(default))
    while True:
        parent = os.path.dirname(path)
        try:
            st = os.stat(parent)
        except OSError:
            if parent == path:
                return None
            path = parent
            continue
        return parent if st.st_mode & stat.S_IWOTH else None
