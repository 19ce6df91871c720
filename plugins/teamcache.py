"""Team caches: a directory a group of users shares, so what is created there must be the group's too.

The rules, and why a root reached through another member's symlink never counts: docs/security.md, Team caches.
"""

from __future__ import annotations

import grp
import os
import stat

from sharedfs.errors import ConfigError
from sharedfs.types import Policy, TeamCache, default_acl_group, group_name, hookimpl, refused, trustedpath

#: The group may enter and list a directory: it is not private on purpose.
_GROUP_RX = stat.S_IRGRP | stat.S_IXGRP


@hookimpl(trylast=True)  # the built-in rule: a site plugin's plain @hookimpl answers first
def sharedfs_team_cache(directory: str, policy: Policy) -> TeamCache | None:
    resolved = trustedpath.resolve(directory)
    if refused(resolved):
        return None  # wherever it points was chosen by whoever made the symlink (docs/security.md, Team caches)
    # Climb from where the user's own symlinks lead (~/.cache/huggingface -> /scratch/lab/hf), not from
    # the spelling: the parent of the link's own directory says nothing about the directory it names.
    directory = resolved.real
    try:
        st = os.stat(directory)
    except OSError:
        return None
    others = stat.S_IROTH if st.st_mode & stat.S_IROTH else 0
    if policy.shared_group:
        gid = _gid(policy.shared_group, policy.source("shared_group"))
        return TeamCache(gid, 0o660 | others, f"{policy.source('shared_group')}={policy.shared_group}")
    current, current_st = directory, st
    for _ in range(64):  # a setgid chain deeper than this is not a cache layout
        found = _team_here(current, current_st, others)
        if found is not None:
            if current != directory:
                found = TeamCache(found.gid, found.file_mode, f"{found.reason}; {directory} is inside it")
            return found
        if not current_st.st_mode & stat.S_ISGID or current_st.st_mode & _GROUP_RX != _GROUP_RX:
            return None  # not inherited from a team directory, or private on purpose
        parent = os.path.dirname(current)
        if parent == current:
            return None
        try:
            parent_st = os.stat(parent)
        except OSError:
            return None
        if not parent_st.st_mode & stat.S_ISGID or parent_st.st_gid != current_st.st_gid:
            return None  # the setgid chain (and with it the group) was not inherited from there
        current, current_st = parent, parent_st
    return None


def _team_here(directory: str, st: os.stat_result, others: int) -> TeamCache | None:
    """The team this directory itself declares: setgid and group-writable, or a default ACL for a group."""
    if st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IWGRP:
        mode = stat.S_IMODE(st.st_mode)
        return TeamCache(st.st_gid, 0o660 | others,
                         f"{directory} is setgid and writable by group {group_name(st.st_gid)} (mode {mode:o})")
    gid = default_acl_group(directory)
    if gid is not None:
        return TeamCache(gid, 0o660 | others, f"the default ACL of {directory} lets group {group_name(gid)} write")
    return None


def _gid(group: str, origin: str) -> int:
    try:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(origin, group, "a group that exists on this node (getent group)") from None
    if gid not in os.getgroups() and gid != os.getegid():
        raise ConfigError(origin, group, "a group you are a member of (id -Gn)",
                          "sharedfs cannot give files to a group you are not in")
    return gid
