"""Real, throwaway Unix users in a throwaway group, for the demo and the tests whose subject is permissions.

:func:`group_of_users` makes a group and users in it (``groupadd``/``useradd``), lets the group
run this interpreter and import this sharedfs (an ACL ``g:<group>:x`` on the directories on the
way that others may not traverse, e.g. pyenv under root's 0700 home), and removes all of it
afterwards.  Every account and ACL edit goes through :func:`admin`, under one machine-wide lock.
Root only; standard library only (the demo imports it without pytest).
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ACCOUNTS_LOCK", "Member", "UsersUnavailable", "accounts_lock", "admin", "end_processes_of",
           "group_of_users", "processes_of", "users_unavailable"]

#: One lock for every edit of this machine's accounts and of shared directories' ACLs: useradd,
#: groupadd, userdel and groupdel give up ("cannot lock /etc/passwd; try again later") while another
#: holds the account files, and setfacl rewrites a directory's whole ACL (read, change, write), so two
#: runs at once (pytest-xdist workers, a demo beside the tests) could fail or lose each other's entry.
ACCOUNTS_LOCK = "/tmp/.sharedfs-tests-accounts.lock"


class UsersUnavailable(Exception):
    """This machine cannot make throwaway users (not root, or a tool missing); the message says what to do."""


@dataclass(frozen=True)
class Member:
    """One throwaway user: its own group ``gid`` and the shared ``group`` every member is in."""

    name: str
    uid: int
    gid: int
    group: int
    home: Path


@contextmanager
def accounts_lock() -> Iterator[None]:
    """Hold the machine-wide :data:`ACCOUNTS_LOCK` (a flock; O_NOFOLLOW: /tmp is everyone's)."""
    fd = os.open(ACCOUNTS_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def admin(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run an account or ACL command (useradd, userdel, groupadd, groupdel, setfacl) under :func:`accounts_lock`."""
    with accounts_lock():
        return subprocess.run(list(argv), check=check, capture_output=True, text=True)


def users_unavailable() -> str | None:
    """Why :func:`group_of_users` cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to create throwaway users (useradd)"
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "setfacl"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install passwd acl)"
    return None


def _untraversable(paths: Sequence[str]) -> list[str]:
    """Directories above ``paths`` that others may not traverse (o-x), outermost first."""
    found: list[str] = []
    for path in paths:
        head = os.path.dirname(os.path.realpath(path))
        chain = []
        while head not in ("/", ""):
            chain.append(head)
            head = os.path.dirname(head)
        for directory in reversed(chain):
            if not os.stat(directory).st_mode & 0o001 and directory not in found:
                found.append(directory)
    return found


@contextmanager
def group_of_users(count: int, home_root: Path, *, prefix: str = "sf") -> Iterator[list[Member]]:
    """A new group and ``count`` new users in it (homes under ``home_root``, mode 0700); removed afterwards.

    Names are ``<prefix>g<hex>`` (the group) and ``<prefix>u<hex>`` (the users).  Whatever happens in
    between: the users' processes are killed by process group, then the ACLs, the users and the
    group are removed, and what could not be removed is raised (``RuntimeError``), never left quietly.
    Raises :class:`UsersUnavailable` before changing anything when the machine cannot do this.
    """
    reason = users_unavailable()
    if reason:
        raise UsersUnavailable(reason)
    import sharedfs

    group = f"{prefix}g{uuid.uuid4().hex[:9]}"
    admin(["groupadd", group])
    users: list[Member] = []
    granted: list[str] = []
    try:
        gid = grp.getgrnam(group).gr_gid
        for _ in range(count):
            name = f"{prefix}u{uuid.uuid4().hex[:9]}"
            admin(["useradd", "--no-create-home", "--user-group", "--groups", group, "--shell", "/usr/sbin/nologin",
                   name])
            entry = pwd.getpwnam(name)
            home = home_root / f"home-{name}"
            home.mkdir(mode=0o700)
            os.chown(home, entry.pw_uid, entry.pw_gid)
            users.append(Member(name, entry.pw_uid, entry.pw_gid, gid, home))
        # The interpreter may live under root's private home (pyenv): let the group traverse, nothing more.
        for directory in _untraversable([sys.executable, os.path.realpath(sys.executable), sharedfs.__file__]):
            admin(["setfacl", "-m", f"g:{group}:x", directory])
            granted.append(directory)
        yield users
    finally:
        leftovers = []
        for directory in granted:
            admin(["setfacl", "-x", f"g:{group}", directory], check=False)
        for user in users:
            end_processes_of(user.uid)  # userdel refuses a user who still runs something
            done = admin(["userdel", user.name], check=False)
            if done.returncode != 0:
                leftovers.append(f"user {user.name}: {done.stderr.strip()}")
            admin(["groupdel", user.name], check=False)  # if userdel left it
        done = admin(["groupdel", group], check=False)
        if done.returncode != 0:
            leftovers.append(f"group {group}: {done.stderr.strip()}")
        if leftovers:
            raise RuntimeError(f"throwaway users or groups could not be removed: {leftovers}")


def end_processes_of(uid: int, wait: float = 5.0) -> list[int]:
    """SIGKILL every process of ``uid``, by process group (what it started goes too); the pids found.

    A process in this process's own process group is killed alone: its group is ours.
    """
    found = processes_of(uid)
    own = os.getpgrp()
    for pid in found:
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            continue
        with suppress(ProcessLookupError, PermissionError):
            if group != own and group > 1:
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait
    while processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def processes_of(uid: int) -> list[int]:
    """Pids of the processes whose real uid is ``uid`` (from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as fh:
                    uids = next(line for line in fh if line.startswith("Uid:")).split()[1:]
            except (OSError, StopIteration):
                continue
            if int(uids[0]) == uid or int(uids[1]) == uid:
                pids.append(int(entry))
    return pids
