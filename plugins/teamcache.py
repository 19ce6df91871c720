"""Team caches: a directory a group of users shares, so what sharedfs creates there must be the group's too.

A lab puts one ``HF_HOME`` on Lustre for everyone, as a setgid, group-writable
directory.  With the default umask 022 the first user's lock file is 0644 and the
next user cannot take it (datasets#7900, datasets#6589, datasets#2065;
huggingface_hub fixed its own lock files in huggingface_hub#2580).  A directory
is a team cache when the ``shared_group`` setting names its group, or when it is
setgid and group-writable, or when its default ACL grants a group write access
(``setfacl -d -m g:<group>:rwX``); sharedfs then creates its lock files and
markers there with group read/write and that group, whatever the creator's umask.
Nothing outside such a directory is widened.
"""

from __future__ import annotations

import grp
import os
import stat
import struct

from sharedfs._policy import Policy, TeamCache
from sharedfs.errors import ConfigError
from sharedfs.hookspecs import hookimpl

#: ``system.posix_acl_default``: a 4-byte version header, then (tag u16, perm u16, id u32) entries.
_ACL_VERSION = 2
_ACL_GROUP = 0x08  # a named group entry
_ACL_WRITE = 0x02


@hookimpl(trylast=True)  # the built-in rule: a site plugin's plain @hookimpl answers first
def sharedfs_team_cache(directory: str, policy: Policy) -> TeamCache | None:
    try:
        st = os.stat(directory)
    except OSError:
        return None
    others = stat.S_IROTH if st.st_mode & stat.S_IROTH else 0
    if policy.shared_group:
        gid = _gid(policy.shared_group, policy.source("shared_group"))
        return TeamCache(gid, 0o660 | others, f"{policy.source('shared_group')}={policy.shared_group}")
    if st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IWGRP:
        mode = stat.S_IMODE(st.st_mode)
        return TeamCache(st.st_gid, 0o660 | others,
                         f"{directory} is setgid and writable by group {_name(st.st_gid)} (mode {mode:o})")
    gid = _acl_group(directory)
    if gid is not None:
        return TeamCache(gid, 0o660 | others, f"the default ACL of {directory} lets group {_name(gid)} write")
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


def _name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _acl_group(directory: str) -> int | None:
    """The first group a default ACL on ``directory`` grants write access, if any."""
    try:
        raw = os.getxattr(directory, "system.posix_acl_default")
    except (OSError, AttributeError):  # no ACL, a filesystem without them, or no xattr support
        return None
    if len(raw) < 4 or struct.unpack_from("<I", raw)[0] != _ACL_VERSION:
        return None
    for offset in range(4, len(raw) - 7, 8):
        tag, perm, ident = struct.unpack_from("<HHI", raw, offset)
        if tag == _ACL_GROUP and perm & _ACL_WRITE:
            return ident
    return None
