"""``sharedfs doctor``'s team-cache check: who shares a path, and which entries keep a member out."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import Any

from sharedfs.fs.directory import Changed, Directory, identity
from sharedfs.model.records import group_name, user_name

#: At most this many entries are looked at (a hub cache can hold millions); the report says when it stopped.
#: Together with the depth limit (``sharedfs locks``'s :data:`~sharedfs.commands.lockfiles.MAX_DEPTH`, 128
#: levels: no framework's cache nests deeper) this bounds the scan, whatever tree a member builds there.
TEAM_SCAN_LIMIT = 20_000
#: Examples shown per kind of problem.
TEAM_EXAMPLES = 3


def team_check(path: str, policy: Any, limit: int = TEAM_SCAN_LIMIT) -> dict[str, Any]:
    """Whether ``path`` is a cache a group of users shares, and which entries keep members out.

    A team cache (``sharedfs_team_cache``: setgid and group-writable, a default ACL for a
    group, or ``SHAREDFS_SHARED_GROUP``) needs every entry in the team's group, directories
    the group may enter and add to (and setgid, so new entries stay the group's), files the
    group may read, and lock files the group may open for writing (stock filelock and POSIX
    locks need that; sharedfs waits on a flock read-only).  A directory that is no team cache
    but holds entries of several users, or is group-writable, is one that people share
    without saying so.
    """
    import pwd
    import stat as st_

    from sharedfs.cluster import teamfiles
    from sharedfs.machinery import choices
    top = os.stat(path)
    error: str | None = None
    try:
        team = choices.team_cache(path, policy)
    except Exception as exc:  # noqa: BLE001 - e.g. SHAREDFS_SHARED_GROUP names a group this user is not in
        team, error = None, str(exc)
    gid = team.gid if team is not None else top.st_gid
    group = group_name(gid)
    acl = teamfiles.default_acl_group(path)
    setgid_mode = team is not None and bool(top.st_mode & st_.S_ISGID)
    owners: dict[int, int] = {}
    problems: dict[str, list[tuple[str, int, int]]] = {
        "wrong_group": [], "closed_dirs": [], "no_setgid": [], "unreadable": [], "unlockable": []}

    def look(entry_path: str, entry: os.stat_result) -> None:
        owners[entry.st_uid] = owners.get(entry.st_uid, 0) + 1
        if st_.S_ISLNK(entry.st_mode):
            return  # a link's own mode and group mean nothing
        mode, seen = st_.S_IMODE(entry.st_mode), (entry_path, entry.st_uid, st_.S_IMODE(entry.st_mode))
        if entry.st_gid != gid:
            problems["wrong_group"].append(seen)
        if st_.S_ISDIR(entry.st_mode):
            if mode & 0o070 != 0o070:
                problems["closed_dirs"].append(seen)
            if setgid_mode and not mode & st_.S_ISGID:
                problems["no_setgid"].append(seen)
        elif st_.S_ISREG(entry.st_mode):
            if not mode & st_.S_IRGRP:
                problems["unreadable"].append(seen)
            elif entry_path.endswith(".lock") and not mode & st_.S_IWGRP:
                problems["unlockable"].append(seen)

    look(path, os.lstat(path))
    scan = _Scan(limit)
    for entry_path, entry in scan.entries(path):
        look(entry_path, entry)
    scanned, truncated = scan.scanned, scan.truncated
    users = {user_name(uid): count for uid, count in sorted(owners.items(), key=lambda item: -item[1])}
    shared = team is not None or len(owners) > 1 or bool(top.st_mode & st_.S_IWGRP)
    not_candidate = None
    if shared:
        candidate_gid, not_candidate = _team_candidate(top, owners, gid, team is not None, pwd)
        group = group_name(candidate_gid) if candidate_gid is not None else "<your-team-group>"
    counts = {name: len(found) for name, found in problems.items()}
    if team is None:
        # Nothing is the group's by rule here: the problems only count once people share the directory.
        counts = dict.fromkeys(counts, 0) if not shared else counts
    return {
        "team": team is not None,
        "reason": team.reason if team is not None else error,
        "group": group,
        "gid": gid,
        "setgid": bool(top.st_mode & st_.S_ISGID),
        "default_acl_group": group_name(acl) if acl is not None else None,
        "shared": shared,
        "scanned": scanned + 1,
        "truncated": truncated,
        "too_deep": scan.deep[0] if scan.deep else None,
        "too_deep_more": max(0, len(scan.deep) - 1),
        "owners": users,
        "problems": counts,
        "examples": {name: [{"path": p, "owner": user_name(uid), "mode": f"{mode:o}"}
                            for p, uid, mode in found[:TEAM_EXAMPLES]]
                     for name, found in problems.items() if found and counts[name]},
        "candidate": not_candidate is None,
        "not_candidate": not_candidate,
        "fix": [] if not_candidate else _team_fix(path, group, counts, bool(top.st_mode & st_.S_ISGID), acl is not None,
                                                  team is not None, shared),
    }


class _Scan:
    """The entries below a path, walked by descriptor within bounds: no tree a member builds stalls or crashes it.

    Each directory is opened once, from its parent's descriptor (``O_NOFOLLOW``, still the directory its parent's
    listing showed: :class:`~sharedfs.commands.lockfiles.Descent`, as ``sharedfs locks`` walks), every entry is
    looked at with ``fstatat`` relative to it, and no symlink is followed.  An explicit stack, never recursion: a
    chain of thousands of directories made ``os.walk`` raise RecursionError.  At most ``limit`` entries
    (``truncated``), and no directory more than :data:`~sharedfs.commands.lockfiles.MAX_DEPTH` levels down is
    entered (``deep``: the ones met there).  What cannot be opened or listed is skipped, as ``os.walk`` did.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.scanned = 0
        self.truncated = False
        self.deep: list[str] = []

    def entries(self, path: str) -> Iterator[tuple[str, os.stat_result]]:
        """(path, lstat) of every entry below ``path``, in ``os.walk``'s top-down order, until a bound is met."""
        # On use: importing sharedfs locks' module (and the lock machinery) costs doctor --cross-node 0.1 s for nothing.
        from sharedfs.commands.lockfiles import MAX_DEPTH, Descent, Place

        try:
            top = Directory.open(path)  # the path as the user gave it; below it, nothing through a symlink
        except OSError:
            return
        stack = [Place(top)]
        with top, Descent() as descent:
            while stack:
                place = stack.pop()
                try:
                    entries = descent.enter(place).listing()
                except (Changed, OSError):  # swapped since its parent was listed, gone, or closed to us
                    continue
                below = []
                # Subdirectories first, then the rest, as os.walk's (dirnames, filenames) were looked at.
                for entry in sorted(entries, key=lambda entry: not _is_dir(entry)):
                    if self.scanned >= self.limit:
                        self.truncated = True
                        return
                    try:
                        st = entry.stat(follow_symlinks=False)  # fstatat relative to the open directory
                    except OSError:
                        continue
                    self.scanned += 1
                    entry_path = os.path.join(place.path, entry.name)
                    yield entry_path, st
                    if stat.S_ISDIR(st.st_mode):
                        if place.depth >= MAX_DEPTH:
                            self.deep.append(entry_path)
                        else:
                            below.append(place.child(entry.name, identity(st)))
                stack.extend(reversed(below))  # the first subdirectory is walked next


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _team_candidate(top: os.stat_result, owners: dict[int, int], gid: int, team: bool,
                    pwd: Any) -> tuple[int | None, str | None]:
    """The group a shared tree could become a team cache of, or why it is not a candidate at all.

    A recursive chgrp/chmod is advice only for a tree whose entries already belong to members of
    one group: on ``/tmp`` (sticky, world-writable, every user's files) it would make every
    user's files writable by one group.  root's entries do not count (the administrator's).
    """
    import stat as st_

    if top.st_mode & st_.S_ISVTX or top.st_mode & st_.S_IWOTH:
        what = " and ".join(word for word, bit in (("sticky", st_.S_ISVTX), ("world-writable", st_.S_IWOTH))
                            if top.st_mode & bit)
        return None, (f"it is {what}: a directory every user of this machine writes into (like /tmp), not one "
                      "group's")
    people = [uid for uid in owners if uid != 0]
    common: set[int] | None = None
    for uid in people:
        try:
            entry = pwd.getpwuid(uid)
            groups = set(os.getgrouplist(entry.pw_name, entry.pw_gid))
        except (KeyError, OSError):
            groups = set()
        common = groups if common is None else common & groups
    if common is None:  # only root's entries
        return (None if gid == 0 else gid), None
    if team and gid not in common:
        outside = [user_name(uid) for uid in people if not _member(uid, gid, pwd)]
        return None, f"entries of users outside group {group_name(gid)} ({', '.join(outside)})"
    if gid in common and gid != _private_gid(top.st_uid, pwd):
        return gid, None
    private = {_private_gid(uid, pwd) for uid in people}
    shared_groups = sorted(common - private)
    if len(people) == 1:
        return (shared_groups[0] if len(shared_groups) == 1 else None), None  # one owner: name her team's group
    if not shared_groups:
        names = ", ".join(user_name(uid) for uid in people)
        return None, f"entries of users who share no group ({names})"
    return shared_groups[0] if len(shared_groups) == 1 else None, None


def _member(uid: int, gid: int, pwd: Any) -> bool:
    try:
        entry = pwd.getpwuid(uid)
        return gid in os.getgrouplist(entry.pw_name, entry.pw_gid)
    except (KeyError, OSError):
        return False


def _private_gid(uid: int, pwd: Any) -> int | None:
    try:
        return int(pwd.getpwuid(uid).pw_gid)
    except KeyError:
        return None


def _team_fix(path: str, group: str, counts: dict[str, int], setgid: bool, acl: bool, team: bool,
              shared: bool) -> list[str]:
    """The one-time commands (for root, or each owner on her own entries) that make ``path`` a sound team cache."""
    if not shared:
        return []
    import shlex

    quoted = shlex.quote(path)
    fix = []
    if counts["wrong_group"] or not team:
        fix.append(f"chgrp -R {group} {quoted}")
    if counts["closed_dirs"] or counts["unreadable"] or counts["unlockable"] or not team:
        fix.append(f"chmod -R g+rwX {quoted}")
    if counts["no_setgid"] or not setgid:
        fix.append(f"find {quoted} -type d -exec chmod g+s {{}} +")
    if not acl:
        # New entries then get group rw whatever each user's umask, in programs without sharedfs too.
        fix.append(f"setfacl -R -d -m g:{group}:rwX {quoted}")
    modules = os.path.join(path, "modules")
    if os.path.isdir(modules) and not os.path.islink(modules):
        # HF_HOME's module cache holds code: the group reads it, never writes a file there, and its
        # directories are sticky (docs/security.md, "Code in a team's module cache").
        code = shlex.quote(modules)
        if not acl:
            fix.append(f"setfacl -R -k {code}")
        fix += [f"find {code} -type f -exec chmod go-w {{}} +",
                f"find {code} -mindepth 1 -type d -exec chmod +t {{}} +", f"chmod g-w {code}"]
    return fix


_TEAM_WORDS = {
    "wrong_group": "not in group {group} (members may have no access at all)",
    "closed_dirs": "directories the group cannot enter or add to (no g+rwx): a member's new dataset, blob or "
                   "shard fails with PermissionError there",
    "no_setgid": "directories without setgid: what is made in them gets the creator's group, not {group}",
    "unreadable": "files the group cannot read",
    "unlockable": "lock files the group cannot open for writing: stock filelock (datasets, the hub without "
                  "sharedfs) fails with PermissionError on them; sharedfs waits on them read-only",
}


def team_lines(team: dict[str, Any], path: str) -> list[str]:
    """``sharedfs doctor``'s lines about who shares ``path`` and whether every member can use it."""
    lines = _sharing_lines(team, path)
    if team.get("too_deep"):
        from sharedfs.commands.lockfiles import MAX_DEPTH

        more = team.get("too_deep_more") or 0
        lines.append(f"  team note  : not fully scanned: deeper than {MAX_DEPTH} levels at {team['too_deep']}"
                     + (f" (and {more} more directories as deep)" if more else "")
                     + "; no framework's cache nests so deep, so nothing below was looked at")
    return lines


def _sharing_lines(team: dict[str, Any], path: str) -> list[str]:
    owners = ", ".join(f"{name} ({count})" for name, count in team["owners"].items())
    checked = f"{team['scanned']}{'+ (stopped there)' if team['truncated'] else ''} entries of {owners}"
    bad = sum(team["problems"].values())
    if team["team"]:
        head = f"a team cache of group {team['group']} ({team['reason']})"
        lines = [f"  team       : {head}; {checked}: " + (
            "every member can read, lock and add to them" if not bad else f"{bad} keep other members out")]
    elif team["shared"] and team.get("not_candidate"):
        return [f"  team       : NOT a team cache, and not a candidate for one: {team['not_candidate']}; {checked}. "
                "No permission change is suggested (a recursive chgrp/chmod here would open other users' files to "
                "one group). For a team cache, make a directory of its own: mkdir DIR; chgrp <your-team-group> DIR; "
                "chmod 2770 DIR"]
    elif team["shared"]:
        lines = [f"  team       : NOT a team cache (neither setgid and group-writable, nor a default ACL for a "
                 f"group, nor SHAREDFS_SHARED_GROUP), yet shared: {checked}"
                 + (f"; {team['reason']}" if team["reason"] else "")
                 + ". What one user's umask makes here keeps the others out; make it a team cache once:"]
    else:
        return [f"  team       : private to {owners.split(' (')[0] or 'its owner'} (no group shares it)"]
    for name, count in team["problems"].items():
        if count:
            examples = "; ".join(f"{e['path']} ({e['owner']}, {e['mode']})" for e in team["examples"].get(name, []))
            lines.append(f"  team issue : {count} {_TEAM_WORDS[name].format(group=team['group'])}, e.g. {examples}")
    if team["fix"]:
        who = "as root, or each owner on her own entries" if len(team["owners"]) > 1 else "once"
        lines.append(f"  team fix   : run {who}:")
        lines.extend(f"               {command}" for command in team["fix"])
    return lines

