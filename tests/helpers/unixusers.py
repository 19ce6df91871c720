"""Real, throwaway Unix users for tests whose subject is permissions (created with useradd, removed after)."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from sharedfs.testing.pytest_plugin import skip_or_fail

#: One lock for every test's edits of this machine's accounts and of shared directories' ACLs: useradd,
#: groupadd, userdel and groupdel give up ("cannot lock /etc/passwd; try again later") while another
#: holds the account files, and setfacl rewrites a directory's whole ACL (read, change, write), so two
#: tests running at once (pytest-xdist workers) could fail or lose each other's entry.
ACCOUNTS_LOCK = "/tmp/.sharedfs-tests-accounts.lock"


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


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
        """A real process of this user: its uid, its own group, no supplementary groups.

        In a process group of its own (a new session), so that cleanup can end it and everything
        it started without ever signalling the test runner's own group.
        """
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(list(argv), user=self.uid, group=self.gid, extra_groups=[], text=True,
                                **kwargs)  # type: ignore[call-overload]

    def run(self, argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        kwargs.setdefault("start_new_session", True)
        return subprocess.run(list(argv), check=False, user=self.uid, group=self.gid, extra_groups=[], text=True,
                              capture_output=True, **kwargs)  # type: ignore[call-overload]

    def python(self, code: str, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run ``code`` as this user in an isolated interpreter (-I -S: no site, no autoload, stdlib only)."""
        return self.run([user_python(), "-I", "-S", "-c", code, *args], **kwargs)


def _world_executable(path: str) -> bool:
    """Whether any user may run ``path``: the file and every directory above it are executable by others."""
    real = os.path.realpath(path)
    if not os.stat(real).st_mode & 0o001:
        return False
    head = os.path.dirname(real)
    while head != "/":
        if not os.stat(head).st_mode & 0o001:
            return False
        head = os.path.dirname(head)
    return True


def user_python() -> str:
    """An interpreter other users can execute (this one may live under root's 0700 home, e.g. pyenv)."""
    for candidate in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or ""):
        if candidate and _world_executable(candidate):
            return candidate
    skip_or_fail("no Python interpreter that other users may execute (apt-get install python3)")


def _require_root() -> None:
    if os.geteuid() != 0:
        skip_or_fail("creating throwaway users needs root (CI runs as root)", module_level=False)
    if not shutil.which("useradd") or not shutil.which("userdel"):
        skip_or_fail("useradd/userdel not found (apt-get install passwd)", module_level=False)


@contextmanager
def throwaway_users(count: int) -> Iterator[list[User]]:
    """``count`` new users, each with a group of its own and no home; deleted (with their groups) afterwards."""
    _require_root()
    made: list[User] = []
    try:
        for _ in range(count):
            name = f"sfs{uuid.uuid4().hex[:10]}"
            admin(["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name])
            import pwd

            entry = pwd.getpwnam(name)
            made.append(User(name, entry.pw_uid, entry.pw_gid))
        yield made
    finally:
        leftovers = []
        for user in made:
            # userdel refuses a user who still runs something (a test's stray child): end those first.
            end_processes_of(user.uid)
            deadline = time.monotonic() + 5
            while True:
                done = admin(["userdel", user.name], check=False)
                if done.returncode == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            admin(["groupdel", user.name], check=False)  # if userdel left it
            if done.returncode != 0:
                leftovers.append(f"{user.name}: {done.stderr.strip()}")
        assert not leftovers, f"throwaway users could not be removed: {leftovers}"


def end_processes_of(uid: int, wait: float = 5.0) -> list[int]:
    """SIGKILL every process of ``uid``, by process group (what it started goes too); the pids found.

    A process in the test runner's own process group is killed alone: its group is ours.
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


@contextmanager
def may_run_this_python(user: User, *paths: str) -> Iterator[None]:
    """Let ``user`` execute this interpreter and read ``paths``: an ACL ``u:<user>:x`` on each directory on the
    way that others may not traverse (pyenv under root's 0700 home), removed afterwards."""
    if not shutil.which("setfacl"):
        skip_or_fail("setfacl not found (apt-get install acl)")
    granted: list[str] = []
    try:
        for target in (sys.executable, *paths):
            head = os.path.dirname(os.path.realpath(target)) if os.path.isfile(target) else os.path.realpath(target)
            while head != "/":
                if not os.stat(head).st_mode & 0o001 and head not in granted:
                    admin(["setfacl", "-m", f"u:{user.name}:x", head])
                    granted.append(head)
                head = os.path.dirname(head)
        yield
    finally:
        for head in granted:
            admin(["setfacl", "-x", f"u:{user.name}", head], check=False)


def owned_by(uid: int, top: str) -> list[str]:
    """Every entry under ``top`` (``top`` included) owned by ``uid``; symlinks are listed, never followed."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            if os.lstat(path).st_uid == uid:
                found.append(path)
    if os.path.lexists(top) and os.lstat(top).st_uid == uid:
        found.append(top)
    return sorted(found)
