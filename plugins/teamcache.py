"""Team caches: a directory a group of users shares, so what is created there must be the group's too.

A lab puts one ``HF_HOME`` on Lustre for everyone, as a setgid, group-writable
directory.  With the default umask 022 the first user's lock file is 0644 and the
next user cannot take it (datasets#7900, datasets#6589, datasets#2065;
huggingface_hub fixed its own lock files in huggingface_hub#2580), and every
directory the first user's framework made is 2755, so the next user cannot add
a dataset, a blob or a shard to it.

A directory is a team cache when

* the ``shared_group`` setting (``SHAREDFS_SHARED_GROUP``) names a group: every
  directory is then the group's (the user said so);
* it is setgid and group-writable: the way a site sets up a project directory
  (``chmod 2775``); its group is the team;
* its default ACL grants a named group write access (``setfacl -d -m g:<group>:rwX``);
* it is a setgid directory *inside* such a directory, with the same group, that
  the group may still enter and read: a directory a framework made there under a
  restrictive umask (2755 under 022).  The walk climbs only while the setgid bit
  and the group are inherited unchanged, and stops at a directory the group may
  not read (2700: private on purpose), so a user's private directory inside a
  project directory never becomes the team's.

sharedfs then creates its lock files and markers there with group read/write and
that group, whatever the creator's umask (``sharedfs.locks``), and gives the group
what the frameworks create in their caches there (``sharedfs.cluster.teamfiles``).
Nothing outside such a directory is widened.

A directory reached through a symlink that someone other than the user (or root) may
have made or replaced -- one in a group-writable directory, whoever owns it -- is never
a team cache, whatever the rules above say about where it points
(:mod:`sharedfs.fs.trustedpath`): a member who makes the cache root a symlink to one
of your own directories (``ln -s ~alice/proj /team/hf/datasets``) must not get it
widened for the group, nor, once such a root was refused, the place it led to under its
real path (datasets names its lock files by it).  The framework then works there as it
does without sharedfs.
"""

from __future__ import annotations

import grp
import os
import stat

from sharedfs.cluster.teamfiles import default_acl_group, refused
from sharedfs.errors import ConfigError
from sharedfs.fs import trustedpath
from sharedfs.model.records import group_name
from sharedfs.types import Policy, TeamCache, hookimpl

#: The group may enter and list a directory: it is not private on purpose.
_GROUP_RX = stat.S_IRGRP | stat.S_IXGRP


@hookimpl(trylast=True)  # the built-in rule: a site plugin's plain @hookimpl answers first
def sharedfs_team_cache(directory: str, policy: Policy) -> TeamCache | None:
    resolved = trustedpath.resolve(directory)
    if refused(resolved):
        return None  # wherever it points was chosen by whoever made the symlink (module docstring)
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
