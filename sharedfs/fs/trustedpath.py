"""Resolving a path the user gave without trusting a symlink that someone else could have planted.

sharedfs widens what is under a team cache's root, so a member's ``ln -s ~alice/proj`` must not redirect it.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Planted", "Resolved", "resolve"]

#: Symlinks followed at most while resolving, as the kernel's own limit (ELOOP).
MAX_LINKS = 40


@dataclass(frozen=True)
class Planted:
    """A symlink on the way to a path that someone other than this user and root may have made or replaced."""

    link: str  # where the symlink is (its directory resolved)
    target: str  # what it points to
    owner: int  # uid of the symlink
    directory_owner: int  # uid of the directory it is in
    directory_mode: int  # and that directory's mode
    names: int = 1  # the symlink's hard links (st_nlink)

    def who(self) -> str:
        return _user(self.owner)

    def why(self) -> str:
        """Why it is not trusted, in words."""
        mode = self.directory_mode
        if self.owner not in (0, os.geteuid()):
            return f"it belongs to {self.who()}"
        if self.directory_owner not in (0, os.geteuid()):
            return f"its directory belongs to {_user(self.directory_owner)}"
        writers = "every user" if mode & stat.S_IWOTH else "its group"
        if mode & stat.S_ISVTX:
            return (f"it has {self.names} names and its directory is writable by {writers} (mode {mode:o}): "
                    "this one may be a hard link any of them made of it")
        return f"its directory is writable by {writers} (mode {mode:o}), so any of them may replace it"


@dataclass(frozen=True)
class Resolved:
    real: str  # the path with every symlink resolved, as os.path.realpath gives it
    planted: Planted | None  # the first symlink on the way that is not the user's own choice


def resolve(path: str | os.PathLike[str]) -> Resolved:
    """``path`` resolved like ``os.path.realpath``, and the first untrusted symlink on the way (or ``None``).

    A part that does not exist (yet) is kept as spelled, as ``realpath`` keeps it.  More than
    :data:`MAX_LINKS` symlinks (a loop) counts as planted: nothing can be proven about it.
    """
    spelled = os.fspath(path)
    # Not os.path.abspath: it would fold "link/.." away before the link is looked at.
    pending = os.path.join(os.getcwd(), spelled).split(os.sep)[1:]
    pending.reverse()  # a stack: the next component is last
    real, planted, links = os.sep, None, 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":  # the parent of what was reached, every symlink before it expanded, as the kernel does
            real = os.path.dirname(real)
            continue
        candidate = os.path.join(real, name)
        try:
            st = os.lstat(candidate)
        except OSError:  # missing (made later), or not searchable: kept as spelled, as realpath keeps it
            real = candidate
            continue
        if not stat.S_ISLNK(st.st_mode):
            real = candidate
            continue
        links += 1
        try:
            target = os.readlink(candidate)
        except OSError:
            target = "?"
        if planted is None:
            planted = _untrusted(real, candidate, target, st)
        if links > MAX_LINKS or target == "?":
            return Resolved(os.path.realpath(spelled), planted or Planted(candidate, target, st.st_uid, -1, 0))
        if os.path.isabs(target):
            real = os.sep
        pending.extend(reversed(target.split(os.sep)))
    return Resolved(os.path.normpath(real), planted)


def _untrusted(directory: str, link: str, target: str, link_st: os.stat_result) -> Planted | None:
    me = os.geteuid()
    try:
        dir_st = os.stat(directory)
    except OSError:
        return Planted(link, target, link_st.st_uid, -1, 0)
    mode = stat.S_IMODE(dir_st.st_mode)
    found = Planted(link, target, link_st.st_uid, dir_st.st_uid, mode, link_st.st_nlink)
    if link_st.st_uid not in (0, me) or dir_st.st_uid not in (0, me):
        return found
    if not (mode & stat.S_IWOTH or (mode & stat.S_IWGRP and not _private_group(dir_st.st_gid))):
        return None  # nobody but us and root may add or replace an entry here
    if mode & stat.S_ISVTX and link_st.st_nlink == 1:
        # Sticky: only the link's owner (us or root) or the directory's may remove or rename it.  With a
        # single name it was made here by its owner; a second name may be a hard link that another writer of
        # this directory made of it (possible where fs.protected_hardlinks=0): then it is that writer's choice.
        return None
    return found


@lru_cache(maxsize=64)
def _private_group(gid: int) -> bool:
    """Whether ``gid`` is this user's own group and nobody else's (the user-private-group convention)."""
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return group.gr_name == me and set(group.gr_mem) <= {me} and gid == pwd.getpwuid(os.geteuid()).pw_gid


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
