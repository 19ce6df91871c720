"""Real, throwaway Unix users for tests whose subject is permissions (created with useradd, removed after).

The account edits themselves (:func:`admin` under the machine-wide lock, :func:`end_processes_of`) are
:mod:`sharedfs.demo.accounts`', shared with the demo; this module adds what tests need around them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from harness.skips import skip_or_fail

from sharedfs.demo.accounts import admin, end_processes_of

__all__ = ["User", "admin", "end_processes_of", "may_run_this_python", "owned_by", "throwaway_users", "user_python"]


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
