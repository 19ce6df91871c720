"""Making a coordination tree: sibling or inside, built atomically, with the cache's group and mode."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from typing import TYPE_CHECKING

from sharedfs.cluster import teamfiles
from sharedfs.errors import UnsafeDirectoryError, WaitTimeout
from sharedfs.fs import stale
from sharedfs.fs.directory import Directory, identity
from sharedfs.model.records import user_name
from sharedfs.shardcache.treenames import LAG_BOUND, SUBDIRS

if TYPE_CHECKING:  # pragma: no cover
    from sharedfs.model.policy import TeamCache


def what_is(path: str) -> str:
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return f"a symlink to {os.readlink(path)} (made by {user_name(st.st_uid)})"
    except OSError:
        pass
    return "not a directory"


def is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def sibling_usable(sibling: str, real: str, cache_st: os.stat_result) -> bool:
    try:
        st = stale.retry(lambda: os.lstat(sibling))
    except OSError as exc:
        if stale.gone(exc):
            return False
        raise
    if not stat.S_ISDIR(st.st_mode):
        return False  # a symlink or a file: never followed; _sibling_refused says why
    return not world_writable(os.path.dirname(real)) or st.st_uid == cache_st.st_uid


def world_writable(directory: str) -> bool:
    try:
        return bool(os.stat(directory).st_mode & stat.S_IWOTH)
    except OSError:
        return False


def sibling_refused(real: str, sibling: str, cache_st: os.stat_result) -> str | None:
    """Why the sibling cannot be (created and) used, or ``None`` when this process may create it."""
    parent = os.path.dirname(real)
    if parent == real:
        return "the cache is the root directory"
    if is_mount_point(real):
        return (f"{real} is a mount point, so its parent {parent} is another filesystem, which other nodes "
                "may not share")
    try:
        st = stale.retry(lambda: os.lstat(sibling))
    except OSError as exc:
        if not stale.gone(exc):
            raise
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        return f"{sibling} exists and is not a directory (a symlink is never followed); remove it"
    if world_writable(parent):
        # The cache owner's sibling, missing a moment ago here (another node's shows late): use it, not the fallback.
        if st is not None and st.st_uid != cache_st.st_uid:
            return (f"{sibling} in {parent}, which every user may write, is owned by uid {st.st_uid}, "
                    f"not by the cache's owner (uid {cache_st.st_uid}); remove it if nobody should have made it")
        if st is None and os.geteuid() != cache_st.st_uid:
            return (f"{parent} is writable by every user and this process does not own {real}, so a "
                    "coordination directory it created there could not be told from a planted one")
    return None


def is_mount_point(real: str) -> bool:
    if os.path.ismount(real):  # another device, or the same inode as the parent
        return True
    from sharedfs.model.mounts import mount_for

    try:
        return mount_for(real).mount_point == real
    except OSError:
        return False


def create_tree(target: str, cache_st: os.stat_result, team: TeamCache | None = None) -> bool:
    """Create the coordination tree ``target`` atomically, with the cache's group and mode (a team's: the group's).

    True when it exists (made here or by someone else, and visible); False when someone else
    made it and it is not visible here yet (the caller looks again).  Built in a staging
    directory and renamed into place, so nobody ever sees it half-made or with the wrong mode.
    The staging directory is made, filled and removed through descriptors: a member who renames
    it away and puts a directory of ours at its name gets nothing made in, or removed from, that.
    """
    parent, base = os.path.split(target)
    with Directory.open(parent) as up:
        name = f"{base}.new-{secrets.token_hex(4)}"
        os.mkdir(name, 0o700, dir_fd=up.fd)
        staging = up.subdirectory(name)  # never through a symlink swapped in since
        try:
            made = identity(staging.fd)
            try:
                if staging.stat().st_uid != os.geteuid() or staging.listing():
                    raise UnsafeDirectoryError(f"{staging.path} was replaced right after this process created it; "
                                               "someone with write access to the cache is interfering")
                for sub in SUBDIRS:
                    os.mkdir(sub, 0o700, dir_fd=staging.fd)
                    with staging.subdirectory(sub) as part:
                        mirror_fd(part, cache_st, team)
                mirror_fd(staging, cache_st, team)
                if not up.names(name, made):
                    raise UnsafeDirectoryError(f"{staging.path} was renamed away while this process built it; "
                                               "someone with write access to the cache is interfering")
                os.rename(name, base, src_dir_fd=up.fd, dst_dir_fd=up.fd)
            except OSError as exc:
                remove_staging(up, name, staging, made)
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or isinstance(exc, UnsafeDirectoryError):
                    raise
                return visible_within(target, LAG_BOUND)
        finally:
            staging.close()
        try:
            os.fsync(up.fd)
        except OSError:
            pass  # some network filesystems refuse fsync on directories; the rename is still atomic
    return True


def remove_staging(up: Directory, name: str, staging: Directory, made: tuple[int, int]) -> None:
    """Remove the empty parts made in ``staging``, then ``staging`` itself only while ``name`` still is it."""
    for sub in SUBDIRS:
        try:
            os.rmdir(sub, dir_fd=staging.fd)  # only an empty directory goes: nothing else was made there
        except OSError:
            pass
    if up.names(name, made):
        try:
            os.rmdir(name, dir_fd=up.fd)
        except OSError:
            pass


def mirror_fd(made: Directory, cache_st: os.stat_result, team: TeamCache | None = None) -> None:
    """Give the directory open as ``made`` (just made by us) the cache's group and permissions.

    Whoever may fill the cache may coordinate.  In a team cache that is the whole group,
    whatever mode the cache directory got from its creator's umask: the team's group,
    g+rwx and setgid.  Through a descriptor, never by name: in a group-writable tree a
    member could swap the new directory for a symlink to one of ours between our mkdir
    and a chmod, which would then open up our own directory.
    """
    try:
        owner = made.stat().st_uid
    except OSError as exc:
        raise stale.vanished(exc, made.path) from None  # removed by another client since: made again by the caller
    if owner != os.geteuid():
        raise UnsafeDirectoryError(f"{made.path} was replaced right after this process created it; "
                                   "someone with write access to the cache is interfering")
    try:
        os.fchown(made.fd, -1, team.gid if team is not None else cache_st.st_gid)
    except OSError:
        pass  # not a member of that group: the directory keeps ours
    # Never the sticky bit: evictors remove other users' stale markers and claims.
    mode = (stat.S_IMODE(cache_st.st_mode) & 0o2777) | 0o700
    try:
        os.fchmod(made.fd, teamfiles.group_mode(mode, True) if team is not None else mode)
    except OSError as exc:
        raise stale.vanished(exc, made.path) from None


def opened_at(fd: int, path: str) -> bool:
    """Whether the directory open as ``fd`` is really at ``path`` (a real path): nothing on the way was swapped.

    ``O_NOFOLLOW`` guards only the last component; this checks all of them, after the open,
    on the descriptor that is then used.  Without ``/proc`` it cannot be proven: no.
    """
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == path
    except OSError:
        return False


def visible_within(path: str, timeout: float) -> bool:
    from sharedfs.cluster.dirs import wait_for

    try:
        wait_for(path, timeout=timeout, what=f"coordination directory {path}")
    except WaitTimeout:
        return False
    return True
